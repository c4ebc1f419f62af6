"""A device is named by its interface and the inode of its network namespace (issue 18 §2):
however the namespace is reached, the same device; the run-directory files carry the inode."""

import os

import pytest

from metaroce.errors import MetaroceError
from metaroce.nic.devid import DeviceId, devices_in_run_dir, own_netns_inode


def test_the_callers_namespace_by_any_name_is_one_device():
    a = DeviceId("eth0")
    b = DeviceId("eth0", "/proc/self/ns/net")
    c = DeviceId("eth0", f"/proc/{os.getpid()}/ns/net")
    assert a == b == c and hash(a) == hash(b)
    assert a.inode == own_netns_inode() == os.stat("/proc/self/ns/net").st_ino
    assert a.is_callers and a.where() == "eth0" and a.args() == "--dev eth0"
    assert DeviceId("eth1") != a


def test_files_are_named_by_the_inode():
    a = DeviceId("eth0")
    assert os.path.basename(a.sock_path) == f"net{a.inode}--eth0.sock"
    assert os.path.basename(a.pid_path) == f"net{a.inode}--eth0.pid"
    assert DeviceId.from_tag(a.tag) == a


@pytest.mark.parametrize("netns", ["no-such-namespace-xyz", "", "/nonexistent/ns/net"])
def test_a_missing_namespace_is_a_clear_error(netns):
    with pytest.raises(MetaroceError, match="no network namespace"):
        DeviceId("eth0", netns)


@pytest.mark.parametrize("dev", ["", "a/b", "x" * 16])
def test_a_bad_interface_name_is_a_clear_error(dev):
    with pytest.raises(MetaroceError, match="not an interface name"):
        DeviceId(dev)


@pytest.mark.parametrize("tag", ["host--eth0", "mr-t-h1--eth0", "net--eth0", "net12-eth0"])
def test_only_inode_tags_name_devices(tag):
    with pytest.raises(ValueError):
        DeviceId.from_tag(tag)


def test_run_dir_listing(tmp_path):
    me = own_netns_inode()
    for name in (f"net{me}--eth0.sock", f"net{me}--eth0.pid", f"net{me}--eth0.log",
                 "host--eth0.sock", f"net{me}--{'y' * 20}.sock"):
        (tmp_path / name).write_text("")
    assert devices_in_run_dir(str(tmp_path)) == [DeviceId("eth0")]

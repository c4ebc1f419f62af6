"""The exporter as Prometheus sees it: a prometheus_client collector that any CollectorRegistry
can take, served over HTTP on loopback (/metrics, an index at /, 404 elsewhere). No daemon runs
here: a device whose daemon does not answer is exported as down (the integration test in
tests/integration/test_deploy.py scrapes a running one)."""

import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metaroce.deploy import exporter as ex
from metaroce.errors import MetaroceError
from metaroce.nic import devid


@pytest.fixture
def empty_run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(devid, "RUN_DIR", str(tmp_path))
    return tmp_path


def up(text: str) -> dict:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {(s.labels["dev"], s.labels["netns"]): s.value for s in fams["metaroce_device_up"].samples}


def test_a_collector_any_registry_can_take(empty_run_dir):
    reg = CollectorRegistry()
    reg.register(ex.Collector([("eth7", None), ("eth8", None)], timeout=0.5))
    text = generate_latest(reg).decode()
    assert up(text) == {("eth7", ""): 0, ("eth8", ""): 0}


def test_every_running_daemon_means_none_when_none_runs(empty_run_dir):
    assert ex.Collector().render() == ""
    me = devid.own_netns_inode()
    (empty_run_dir / f"net{me}--eth3.sock").write_text("")  # a socket file nobody serves
    assert up(ex.Collector(timeout=0.5).render()) == {("eth3", ""): 0}


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:0"])
def test_served_over_http(empty_run_dir, listen):
    srv = ex.make_server(listen, ex.Collector([("eth7", None)], timeout=0.5))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        host, port = srv.server_address[:2]
        base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert up(r.read().decode()) == {("eth7", ""): 0}
        with urllib.request.urlopen(base + "/", timeout=5) as r:
            assert b'href="/metrics"' in r.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/nope", timeout=5)
        assert e.value.code == 404
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_a_port_in_use_is_one_clear_error(empty_run_dir):
    srv = ex.make_server("127.0.0.1:0", ex.Collector())
    try:
        port = srv.server_address[1]
        with pytest.raises(MetaroceError, match=f"cannot listen on 127.0.0.1:{port}"):
            ex.make_server(f"127.0.0.1:{port}", ex.Collector())
    finally:
        srv.server_close()

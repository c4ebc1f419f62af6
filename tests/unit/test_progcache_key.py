"""The BPF build cache's key and map-reference patching (metaroce/kern/progcache.py): no root,
no BPF."""

import struct

import pytest

from metaroce.errors import MetaroceError
from metaroce.kern import progcache as pc


def insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


@pytest.fixture
def src(tmp_path):
    (tmp_path / "nic").mkdir()
    (tmp_path / "nic" / "a.bpf.c").write_text("int x;\n")
    (tmp_path / "nic" / "a.h").write_text("#define Y 1\n")
    return tmp_path


def key(src, flags=("-DMAX_QPS=64",), bcc="0.26.0", kernel="6.1.0"):
    return pc.cache_key(src, "nic/a.bpf.c", list(flags), bcc, kernel)


def test_key_is_stable(src):
    assert key(src) == key(src) and len(key(src)) == 64


def test_key_changes_with_a_source_byte(src):
    k = key(src)
    (src / "nic" / "a.h").write_text("#define Y 2\n")
    assert key(src) != k


def test_key_changes_with_a_new_file(src):
    k = key(src)
    (src / "nic" / "b.h").write_text("")
    assert key(src) != k


def test_key_changes_with_a_define_bcc_or_kernel(src):
    k = key(src)
    assert key(src, flags=("-DMAX_QPS=64", "-DMUTANT_X=1")) != k
    assert key(src, flags=("-DMAX_QPS=65",)) != k
    assert key(src, bcc="0.27.0") != k
    assert key(src, kernel="6.1.1") != k


def test_cache_root_env(monkeypatch):
    monkeypatch.setenv("METAROCE_BPF_CACHE", "off")
    assert pc.cache_root() is None
    monkeypatch.setenv("METAROCE_BPF_CACHE", "/tmp/somewhere")
    assert str(pc.cache_root()) == "/tmp/somewhere"
    monkeypatch.delenv("METAROCE_BPF_CACHE")
    assert str(pc.cache_root()) == pc.DEFAULT_ROOT


# a synthetic program: r1 = map(fd 7); r2 = 1; r1 = map value(fd 9) + 16; call; exit
PROG = (insn(0x18, 1, 1, imm=7) + insn(0) + insn(0xB7, 2, imm=1) +
        insn(0x18, 1, 2, imm=9) + insn(0, imm=16) + insn(0x85, imm=1) + insn(0x95))


def test_find_relocs_names_each_map_reference():
    assert pc.find_relocs(PROG, {7: "qps", 9: "crc_tab"}) == [[0, "qps", 1], [3, "crc_tab", 2]]


def test_find_relocs_skips_the_second_half_and_plain_ld_imm64():
    prog = insn(0x18, 1, 0, imm=7) + insn(0, imm=7) + insn(0x95)     # a 64-bit constant 7
    assert pc.find_relocs(prog, {7: "qps"}) == []


def test_find_relocs_rejects_an_unknown_fd():
    with pytest.raises(MetaroceError):
        pc.find_relocs(PROG, {7: "qps"})


def test_patch_relocs_sets_new_fds_only_there():
    relocs = pc.find_relocs(PROG, {7: "qps", 9: "crc_tab"})
    out = pc.patch_relocs(PROG, relocs, {"qps": 41, "crc_tab": 42})
    assert len(out) == len(PROG)
    assert struct.unpack_from("<i", out, 4)[0] == 41
    assert struct.unpack_from("<i", out, 3 * 8 + 4)[0] == 42
    assert struct.unpack_from("<i", out, 4 * 8 + 4)[0] == 16            # the value offset stays
    assert out[8:3 * 8] == PROG[8:3 * 8] and out[5 * 8:] == PROG[5 * 8:]
    assert out[:4] == PROG[:4]                                          # code and registers


def test_patch_relocs_refuses_a_reference_that_is_not_there():
    with pytest.raises(MetaroceError):
        pc.patch_relocs(PROG, [[2, "qps", 1]], {"qps": 3})


def test_inner_templates_from_declarations(tmp_path):
    (tmp_path / "m.h").write_text('BPF_HASH_OF_MAPS(mrs, u32, "mr_tmpl", 64);\n'
                                  'BPF_ARRAY_OF_MAPS(arr, "tmpl2", 8);\n')
    assert pc.inner_templates(tmp_path) == {"mrs": "mr_tmpl", "arr": "tmpl2"}


def test_an_untrusted_root_is_not_used(tmp_path, monkeypatch):
    d = tmp_path / "c"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    monkeypatch.setattr(pc.os, "geteuid", lambda: 0)
    assert not pc._usable_root(d)


def test_key_changes_with_how_a_function_loads(src):
    """A program loaded frags-aware (BPF_F_XDP_HAS_FRAGS) is another build than the same
    instructions loaded plain: an entry recorded one way must not be loaded the other."""
    def k(kind):
        return pc.cache_key(src, "nic/a.bpf.c", ["-DMAX_QPS=64"], "0.26.0", "6.1.0", {"f": kind})
    assert k("xdp") != k("xdp.frags") and k("xdp") == k("xdp")
    assert pc.LOAD_OPTS["xdp.frags"] == (1 << 5, 37)

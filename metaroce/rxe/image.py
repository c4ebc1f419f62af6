"""The rxe guest's image: Debian's kernel and a minimal Debian userland with rdma-core, built once
from the distribution's packages and cached outside the repository, keyed by package versions.

- kernel: the package ``linux-image-amd64`` depends on, fetched with ``apt-get download`` and
  unpacked with ``dpkg -x`` (nothing is installed on the host);
- userland: ``debootstrap --variant=minbase`` of the host's Debian suite from the host's own apt
  mirror, with rdma-core's tools, perftest and pyverbs (``PACKAGES``), plus the kernel modules
  the guest needs (virtio, rdma_rxe and their dependencies), packed as a gzip cpio initramfs.

The guest's own scripts (``metaroce/rxe/guestfs``) are not part of the cached image: they go
into a small uncompressed cpio archive put in front of it at start (Linux unpacks concatenated
archives), so changing them never rebuilds the image.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import MetaroceError

CACHE_DIR = Path(os.environ.get("METAROCE_RXE_CACHE", "/var/cache/metaroce/rxe-guest"))
PACKAGES = ("ibverbs-utils", "ibverbs-providers", "perftest", "rdmacm-utils", "python3-pyverbs",
            "iproute2", "kmod")
# the guest's modules; their dependencies are added from the kernel's own modules.dep
# (rdma_rxe asks the crypto API for "crc32" when a device is added: no module dependency names it)
MODULES = ("virtio_pci", "virtio_net", "virtio_console", "rdma_rxe", "ib_uverbs", "ib_umad",
           "rdma_ucm", "crc32_generic", "crc32_pclmul")
IMAGE_FORMAT = 2            # bump when the build below changes what an image holds
# what the guest never needs: dropped before packing (saves a third of the archive)
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
         "usr/share/i18n", "usr/share/zoneinfo", "var/cache/apt", "var/lib/apt/lists",
         "usr/share/common-licenses", "usr/lib/x86_64-linux-gnu/gconv")
GUESTFS = Path(__file__).resolve().parent / "guestfs"


class ImageError(MetaroceError):
    """The guest image cannot be built (a missing tool, package or mirror)."""


def _log(msg: str) -> None:
    from ..cli.output import log  # noqa: PLC0415
    log(msg)


def _run(argv, **kw) -> str:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout
    except FileNotFoundError:
        raise ImageError(f"{argv[0]} not found (make rxe-setup installs it)") from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-5:]
        raise ImageError(f"{' '.join(map(str, argv[:3]))} failed: {' | '.join(tail)}") from None


def host_suite() -> str:
    """The Debian suite the host runs (bookworm, ...): the guest's userland is the same."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        text = ""
    m = re.search(r"^VERSION_CODENAME=(\S+)", text, re.M)
    return os.environ.get("METAROCE_RXE_SUITE") or (m.group(1) if m else "bookworm")


def host_mirror(suite: str, src: Path = Path("/etc/apt")) -> str:
    """The host's apt mirror that serves the suite's main component (deb822 or one-line
    sources under ``src``)."""
    if os.environ.get("METAROCE_RXE_MIRROR"):
        return os.environ["METAROCE_RXE_MIRROR"]
    files = sorted((src / "sources.list.d").glob("*.sources")) + \
        sorted((src / "sources.list.d").glob("*.list")) + [src / "sources.list"]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and suite in suites.group(1).split() and \
                    re.search(r"^Components:.*\bmain\b", stanza, re.M):
                return uris.group(1)
        for line in text.splitlines():
            m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+.*\bmain\b", line)
            if m and m.group(2) == suite:
                return m.group(1)
    raise ImageError(f"no apt source for Debian {suite} main on this host "
                     f"(set METAROCE_RXE_MIRROR)")


def candidate(pkg: str) -> str:
    out = _run(["apt-cache", "policy", pkg])
    m = re.search(r"Candidate:\s*(\S+)", out)
    if not m or m.group(1) == "(none)":
        raise ImageError(f"Debian package {pkg} has no candidate version (apt-get update?)")
    return m.group(1)


def kernel_package() -> str:
    out = _run(["apt-cache", "depends", "linux-image-amd64"])
    m = re.search(r"Depends:\s*(linux-image-\S+)", out)
    if not m:
        raise ImageError("cannot find the kernel package linux-image-amd64 depends on")
    return m.group(1)


def versions() -> dict:
    """What the image is made of: suite, mirror, the kernel package and every package's
    candidate version. Its hash is the cache key."""
    suite = host_suite()
    kpkg = kernel_package()
    pk = {p: candidate(p) for p in (kpkg, *PACKAGES)}
    return {"format": IMAGE_FORMAT, "suite": suite, "mirror": host_mirror(suite),
            "kernel_package": kpkg, "packages": pk}


def key_of(ver: dict) -> str:
    return hashlib.sha256(json.dumps(ver, sort_keys=True).encode()).hexdigest()[:16]


def image_dir(key: str) -> Path:
    return CACHE_DIR / key


def cached(ver: dict | None = None) -> Path | None:
    """The cached image for these versions, when it is complete."""
    d = image_dir(key_of(ver or versions()))
    return d if (d / "manifest.json").is_file() else None


def build(force: bool = False, keep: int = 2) -> dict:
    """Build the image unless the cache has it. Returns its manifest (with ``cached``)."""
    ver = versions()
    key = key_of(ver)
    d = image_dir(key)
    if not force and (d / "manifest.json").is_file():
        man = json.loads((d / "manifest.json").read_text())
        return {**man, "dir": str(d), "cached": True}
    for tool in ("debootstrap", "apt-get", "dpkg", "chroot"):
        if shutil.which(tool) is None:
            raise ImageError(f"{tool} not found (make rxe-setup installs what the guest needs)")
    t0 = time.monotonic()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"build-{key}-", dir=CACHE_DIR))
    try:
        _log(f"rxe guest: building image {key} (Debian {ver['suite']}, {ver['kernel_package']})")
        kver, vmlinuz = _kernel(work, ver["kernel_package"])
        root = work / "root"
        _log(f"rxe guest: debootstrap {ver['suite']} with {', '.join(PACKAGES)}")
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
              ver["suite"], str(root), ver["mirror"]])
        mods = _install_modules(work / "kernel", root, kver)
        installed = _installed(root)
        for p in PRUNE:
            shutil.rmtree(root / p, ignore_errors=True)
        out = work / "out"
        out.mkdir()
        shutil.copy2(vmlinuz, out / "vmlinuz")
        _log("rxe guest: packing the initramfs")
        size = _pack(root, out / "rootfs.cpio.gz")
        man = {"key": key, "versions": ver, "kernel_release": kver, "modules": mods,
               "installed": installed, "rootfs_bytes": size,
               "build_seconds": round(time.monotonic() - t0, 1),
               "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / "manifest.json").write_text(json.dumps(man, indent=1))
        if d.exists():
            shutil.rmtree(d)
        out.rename(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune_old(keep, key)
    _log(f"rxe guest: image {key} built in {man['build_seconds']} s ({size >> 20} MiB) in {d}")
    return {**man, "dir": str(d), "cached": False}


def _kernel(work: Path, pkg: str) -> tuple[str, Path]:
    dl = work / "deb"
    dl.mkdir()
    _log(f"rxe guest: apt-get download {pkg}")
    _run(["apt-get", "download", pkg], cwd=dl)
    deb = next(dl.glob("*.deb"))
    _run(["dpkg", "-x", str(deb), str(work / "kernel")])
    deb.unlink()
    mods = work / "kernel" / "lib" / "modules"
    kver = next(p.name for p in mods.iterdir())
    return kver, work / "kernel" / "boot" / f"vmlinuz-{kver}"


def _modinfo_depends(ko: Path) -> list[str]:
    data = ko.read_bytes()
    m = re.search(rb"(?:^|\0)depends=([^\0]*)\0", data)
    return [d for d in (m.group(1).decode().split(",") if m else []) if d]


def module_files(src: Path) -> dict[str, Path]:
    """A kernel's module files under lib/modules/<release>, by module name ('-' as '_')."""
    return {ko.name.split(".ko")[0].replace("-", "_"): ko for ko in src.rglob("*.ko*")}


def module_closure(by_name: dict[str, Path], wanted) -> list[str]:
    """The wanted modules and everything they depend on (each module's .modinfo "depends"),
    leaving out those the kernel has built in (no file)."""
    want, seen = list(wanted), []
    while want:
        name = want.pop().replace("-", "_")
        if name in seen:
            continue
        ko = by_name.get(name)
        if ko is None:
            continue                    # built into the kernel
        seen.append(name)
        want.extend(_modinfo_depends(ko))
    return seen


def _install_modules(kernel: Path, root: Path, kver: str) -> list[str]:
    """Copy MODULES and their dependencies (read from each module's .modinfo) into the rootfs
    and index them with the rootfs's own depmod."""
    src = kernel / "lib" / "modules" / kver
    by_name = module_files(src)
    seen = module_closure(by_name, MODULES)
    dst = root / "lib" / "modules" / kver
    for name in seen:
        ko = by_name[name]
        rel = ko.relative_to(src)
        (dst / rel.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy2(ko, dst / rel)
    for f in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (src / f).exists():
            shutil.copy2(src / f, dst / f)
    _run(["chroot", str(root), "depmod", "-a", kver])
    return sorted(seen)


def _installed(root: Path) -> dict:
    out = _run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package} ${Version}\\n"])
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def _pack(root: Path, dest: Path) -> int:
    """A newc cpio of the tree, gzip level 1 (the kernel unpacks it quickly)."""
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1,
                                                 mtime=0) as gz:
        w = CpioWriter(gz)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            if rel != ".":
                w.add_path(Path(dirpath), rel)
            for fn in sorted(filenames):
                w.add_path(Path(dirpath) / fn, os.path.normpath(os.path.join(rel, fn)))
            for dn in dirnames:                      # symlinks to directories are not walked
                p = Path(dirpath) / dn
                if p.is_symlink():
                    w.add_path(p, os.path.normpath(os.path.join(rel, dn)))
        w.close()
    return dest.stat().st_size


class CpioWriter:
    """The newc ("070701") cpio format the kernel's initramfs unpacker reads."""

    def __init__(self, f):
        self.f, self.ino = f, 1

    def _entry(self, name: str, mode: int, data: bytes = b"", nlink: int = 1,
               mtime: int = 0, rdev: tuple = (0, 0)) -> None:
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, nlink, mtime, len(data), 0, 0, rdev[0], rdev[1], len(nb), 0))
        self.ino += 1
        self.f.write(hdr.encode() + nb + b"\0" * (-(110 + len(nb)) % 4))
        self.f.write(data + b"\0" * (-len(data) % 4))

    def add_path(self, p: Path, name: str) -> None:
        st = os.lstat(p)
        import stat  # noqa: PLC0415
        if stat.S_ISLNK(st.st_mode):
            self._entry(name, st.st_mode, os.readlink(p).encode())
        elif stat.S_ISDIR(st.st_mode):
            self._entry(name, st.st_mode, nlink=2)
        elif stat.S_ISREG(st.st_mode):
            self._entry(name, st.st_mode, p.read_bytes())
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            self._entry(name, st.st_mode, rdev=(os.major(st.st_rdev), os.minor(st.st_rdev)))
        # sockets and fifos are not needed in the guest

    def add_file(self, name: str, data: bytes, mode: int = 0o100644) -> None:
        self._entry(name, mode, data)

    def add_dir(self, name: str, mode: int = 0o40755) -> None:
        self._entry(name, mode, nlink=2)

    def close(self) -> None:
        self._entry("TRAILER!!!", 0)


def overlay() -> bytes:
    """The guest's own files (init, the agent, the verbs helpers) as an uncompressed cpio,
    joined with the cached image at start."""
    buf = io.BytesIO()
    w = CpioWriter(buf)
    w.add_dir("opt")
    w.add_dir("opt/metaroce")
    for p in sorted(GUESTFS.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.suffix in (".py", ".sh", ""):
            w.add_file(f"opt/metaroce/{p.name}", p.read_bytes(), 0o100755)
    w.add_file("init", (GUESTFS / "init.sh").read_bytes(), 0o100755)
    w.close()
    return buf.getvalue()


def _prune_old(keep: int, current: str) -> None:
    """Keep the newest `keep` images (the current one always)."""
    if not CACHE_DIR.is_dir():
        return
    imgs = sorted((p for p in CACHE_DIR.iterdir() if (p / "manifest.json").is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for p in imgs[keep:]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)
    for p in CACHE_DIR.glob("build-*"):              # an interrupted build
        if time.time() - p.stat().st_mtime > 3600:
            shutil.rmtree(p, ignore_errors=True)

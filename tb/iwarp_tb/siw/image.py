"""Build the siw guest: a Debian kernel, an out-of-tree ``siw`` module and an initramfs.

Everything comes from Debian packages: the userland (busybox-static, rdma-core, perftest, ...) and
the kernel headers must be installed (``.ci/run`` does it as root); the kernel image and the kernel
source are fetched with ``apt-get download`` into ``build/siw/debs``. Debian builds its kernels
without ``CONFIG_RDMA_SIW``, so ``drivers/infiniband/sw/siw`` is taken from ``linux-source-6.1`` and
compiled against the installed headers. ``siw`` has no module parameters, so the variants are made
by editing the globals in ``siw_main.c`` (:data:`VARIANTS`).

Layout under ``build/siw``::

    debs/                        the two downloaded .deb files
    kernel/<version>/            the extracted linux-image (boot/ and lib/modules/), depmod'ed
    src/<version>/siw/           drivers/infiniband/sw/siw from linux-source
    base/                        rootfs/ (busybox, /init, modules, RDMA tools, libraries), base.cpio
    <variant>/                   src/ (patched), siw.ko, vmlinuz, initrd.img, manifest.json

``initrd.img`` is ``base.cpio`` followed by a small archive with the variant's ``siw.ko`` (the
kernel unpacks concatenated newc archives in turn). Each stage records a key of its inputs and is
redone only when the key changes. :func:`ensure` holds ``build/siw/build.lock`` (``flock``) for the
whole build, so concurrent pytest workers and command-line builds do not race.
"""

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from iwarp_tb.toolchain import BUILD

SIW_BUILD = BUILD / "siw"
HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "init.sh"

# The siw variants: exact lines of siw_main.c (Linux 6.1) and what each variant puts instead.
VARIANTS: dict[str, dict[str, str]] = {
    "stock": {},
    "crc": {"const bool mpa_crc_required;": "const bool mpa_crc_required = true;"},
    "rev1": {"u_char mpa_version = MPA_REVISION_2;": "u_char mpa_version = MPA_REVISION_1;"},
    "p2p": {"const bool peer_to_peer;": "const bool peer_to_peer = true;"},
}

# Loaded in this order (each after its dependencies, from modprobe --show-depends), then siw.
BASE_MODULES = ("virtio_pci", "virtio_net", "crc32c_generic", "ib_uverbs", "iw_cm", "rdma_cm",
                "rdma_ucm")

# Userland copied into the guest with every library ldd lists.
TOOLS = ("rping", "ucmatose", "ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat",
         "ibv_devinfo", "rdma")
# Packages whose versions go into the build key (the tools, their libraries, busybox).
USERLAND_PACKAGES = ("busybox-static", "rdma-core", "ibverbs-providers", "ibverbs-utils",
                     "rdmacm-utils", "perftest", "iproute2", "libibverbs1", "librdmacm1", "libc6",
                     "libgcc-s1")
# The packages .ci/run installs (kernel headers through the linux-headers-amd64 metapackage).
APT_PACKAGES = ("qemu-system-x86", "busybox-static", "cpio", "kmod", "xz-utils", "make", "gcc",
                "iproute2", "rdma-core", "ibverbs-utils", "ibverbs-providers", "rdmacm-utils",
                "perftest", "linux-headers-amd64")
HOST_COMMANDS = ("apt-get", "dpkg-deb", "dpkg-query", "tar", "xz", "cpio", "depmod", "modprobe",
                 "ldd", "make", "gcc") + TOOLS
BUSYBOX = Path("/bin/busybox")
SIW_PROVIDER_GLOB = "/usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav*.so"
SIW_DRIVER_FILE = Path("/etc/libibverbs.d/siw.driver")
LIBGCC = Path("/lib/x86_64-linux-gnu/libgcc_s.so.1")


class BuildError(RuntimeError):
    """The guest cannot be built; the message says what is missing or what failed."""


@dataclass(frozen=True)
class Kernel:
    abi: str  # e.g. 6.1.0-56-amd64 (the headers, image and module directory name)
    version: str  # Debian version of the headers, image and source packages, e.g. 6.1.192-2

    @property
    def headers(self) -> Path:
        return Path(f"/usr/src/linux-headers-{self.abi}")


@dataclass(frozen=True)
class Guest:
    """A built guest: what QEMU needs to boot it."""

    variant: str
    kernel: Path
    initrd: Path
    manifest: dict


def _run(cmd, **kw) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-30:])
        raise BuildError(f"command failed ({res.returncode}): {shown}\n{tail}")
    return res.stdout


def _pkg_versions(pkgs) -> dict[str, str | None]:
    """Installed versions (``None`` when not installed), from one dpkg-query call."""
    res = subprocess.run(["dpkg-query", "-W", "-f=${Package}|${db:Status-Abbrev}|${Version}\n",
                          *pkgs], capture_output=True, text=True)
    found = {}
    for line in res.stdout.splitlines():
        name, status, version = line.split("|", 2)
        if status.startswith("ii"):
            found[name.split(":")[0]] = version
    return {p: found.get(p) for p in pkgs}


def _pkg_version(pkg: str) -> str | None:
    return _pkg_versions([pkg])[pkg]


def missing() -> str | None:
    """``None`` when the guest is built or can be built here, else a one-line reason."""
    absent = [c for c in HOST_COMMANDS if shutil.which(c) is None]
    if not BUSYBOX.exists():
        absent.append(str(BUSYBOX))
    if not glob.glob(SIW_PROVIDER_GLOB):
        absent.append("libsiw provider")
    if absent:
        return f"not installed: {', '.join(absent)}"
    if not glob.glob("/usr/src/linux-headers-*-amd64/Makefile"):
        return "no kernel headers (apt-get install linux-headers-amd64)"
    return None


def find_kernel() -> Kernel:
    """The installed amd64 kernel headers: the ABI the module is built for and the version."""
    dep = ""
    if _pkg_version("linux-headers-amd64"):
        dep = _run(["dpkg-query", "-W", "-f=${Depends}", "linux-headers-amd64"])
    m = re.search(r"linux-headers-(\S+)-amd64", dep)
    if m:
        abis = [m.group(1)]
    else:
        abis = sorted((Path(p).name[len("linux-headers-"):-len("-amd64")]
                       for p in glob.glob("/usr/src/linux-headers-*-amd64")),
                      key=lambda a: [int(x) for x in re.findall(r"\d+", a)])
    for abi in reversed(abis):
        version = _pkg_version(f"linux-headers-{abi}-amd64")
        if version and Path(f"/usr/src/linux-headers-{abi}-amd64/Makefile").exists():
            return Kernel(f"{abi}-amd64", version)
    raise BuildError("no installed linux-headers-<abi>-amd64: apt-get install linux-headers-amd64")


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _stamp_ok(stamp: Path, key: str) -> bool:
    return stamp.exists() and stamp.read_text().strip() == key


def _download(pkg: str, version: str) -> Path:
    debs = SIW_BUILD / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = [p for p in debs.glob(f"{pkg}_*.deb")
             if p.name.split("_")[1].replace("%3a", ":") == version]
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        os.chmod(tmp, 0o755)
        try:
            _run(["apt-get", "download", "-q", f"{pkg}={version}"], cwd=tmp)
        except BuildError as e:
            raise BuildError(f"apt-get download {pkg}={version} failed (run apt-get update, or "
                             f"install the newest linux-headers-amd64): {e}") from None
        (deb,) = Path(tmp).glob("*.deb")
        return Path(shutil.move(str(deb), debs / deb.name))


def _kernel_tree(kernel: Kernel) -> Path:
    """The linux-image package unpacked (boot/, lib/modules/<abi>/) with depmod run."""
    root = SIW_BUILD / "kernel" / kernel.version
    stamp = root / ".stamp"
    key = _key("kernel", kernel.abi, kernel.version)
    if _stamp_ok(stamp, key):
        return root
    deb = _download(f"linux-image-{kernel.abi}", kernel.version)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    _run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -x -C '{root}' ./boot ./lib/modules",
         shell=True)
    _run(["depmod", "-b", str(root), kernel.abi])
    stamp.write_text(key)
    return root


def _siw_source(kernel: Kernel) -> Path:
    """drivers/infiniband/sw/siw from linux-source-<major.minor> of the same version."""
    root = SIW_BUILD / "src" / kernel.version
    stamp = root / ".stamp"
    key = _key("source", kernel.version)
    if _stamp_ok(stamp, key):
        return root / "siw"
    series = ".".join(kernel.version.split(".")[:2])
    deb = _download(f"linux-source-{series}", kernel.version)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    member = f"linux-source-{series}/drivers/infiniband/sw/siw"
    _run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -xO ./usr/src/linux-source-{series}.tar.xz"
         f" | tar -xJ -C '{root}' --strip-components=4 '{member}'", shell=True)
    if not (root / "siw" / "siw_main.c").exists():
        raise BuildError(f"{member}/siw_main.c not found in {deb.name}")
    stamp.write_text(key)
    return root / "siw"


def module_order(kernel: Kernel, tree: Path, siw_ko: Path) -> list[Path]:
    """Every module the guest loads, dependencies first, siw's own dependencies included."""
    names = list(BASE_MODULES)
    names += [d for d in _run(["modinfo", "-F", "depends", str(siw_ko)]).strip().split(",") if d]
    order: list[Path] = []
    for name in names:
        out = _run(["modprobe", "-d", str(tree), "-S", kernel.abi, "--show-depends", name])
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["insmod"] and Path(words[1]) not in order:
                order.append(Path(words[1]))
    return order


def _libraries(binaries) -> list[Path]:
    libs: list[Path] = []
    for binary in binaries:
        for line in _run(["ldd", str(binary)]).splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m and Path(m.group(1)) not in libs:
                libs.append(Path(m.group(1)))
    return libs


def _copy_into(root: Path, src: Path, dest: Path | None = None) -> None:
    target = root / (dest or src).relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src.resolve(), target)


def _cpio(root: Path, out: Path) -> None:
    _run(f"cd '{root}' && find . -mindepth 1 | LC_ALL=C sort"
         f" | cpio -o -H newc -R 0:0 --quiet > '{out}'", shell=True)


def _base(kernel: Kernel, tree: Path, siw_ko: Path) -> Path:
    """The shared part of the initramfs, as an uncompressed newc archive."""
    versions = _pkg_versions(USERLAND_PACKAGES)
    key = _key("base", kernel.abi, kernel.version, versions, INIT_SCRIPT.read_text(),
               Path(__file__).read_text())
    base = SIW_BUILD / "base"
    cpio = base / "base.cpio"
    if _stamp_ok(base / ".stamp", key) and cpio.exists():
        return cpio
    shutil.rmtree(base, ignore_errors=True)
    root = base / "rootfs"
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "etc",
              "lib/modules", "root", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    shutil.copy(INIT_SCRIPT, root / "init")
    (root / "init").chmod(0o755)
    order = module_order(kernel, tree, siw_ko)
    for ko in order:
        shutil.copy(ko, root / "lib/modules" / ko.name)
    (root / "lib/modules/order").write_text("".join(f"{ko.name}\n" for ko in order))
    binaries = [Path(shutil.which(t)).resolve() for t in TOOLS]
    for b in binaries:
        shutil.copy(b, root / "usr/bin" / b.name)
    providers = [Path(p) for p in glob.glob(SIW_PROVIDER_GLOB)]
    for p in providers + _libraries(binaries + providers) + [LIBGCC]:
        _copy_into(root, p)
    _copy_into(root, SIW_DRIVER_FILE)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    _cpio(root, cpio)
    (base / ".stamp").write_text(key)
    return cpio


def _compile(kernel: Kernel, src: Path, variant: str, out: Path) -> Path:
    build = out / "src"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(src, build)
    main = build / "siw_main.c"
    text = main.read_text()
    for old, new in VARIANTS[variant].items():
        if text.count(old) != 1:
            raise BuildError(f"variant {variant}: line {old!r} not found once in siw_main.c")
        text = text.replace(old, new)
    main.write_text(text)
    jobs = str(os.cpu_count() or 2)
    _run(["make", "-C", str(kernel.headers), f"M={build}", "CONFIG_RDMA_SIW=m", "-j", jobs,
          "modules"])
    ko = out / "siw.ko"
    shutil.copy(build / "siw.ko", ko)
    return ko


def _variant_key(kernel: Kernel, variant: str) -> str:
    versions = _pkg_versions(USERLAND_PACKAGES)
    return _key("variant", variant, VARIANTS[variant], kernel.abi, kernel.version, versions,
                INIT_SCRIPT.read_text(), Path(__file__).read_text())


def built(variant: str = "stock") -> Guest | None:
    """The guest for ``variant`` if it is built and up to date, else ``None``. No locking."""
    path = SIW_BUILD / variant / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        kernel = find_kernel()
    except (OSError, ValueError, BuildError):
        return None
    if manifest.get("key") != _variant_key(kernel, variant):
        return None
    guest = Guest(variant, Path(manifest["kernel"]), Path(manifest["initrd"]), manifest)
    return guest if guest.kernel.exists() and guest.initrd.exists() else None


def ensure(variant: str = "stock", *, log=None) -> Guest:
    """Build ``variant`` if needed (under the build lock) and return it."""
    if variant not in VARIANTS:
        raise BuildError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    guest = built(variant)
    if guest:
        return guest
    reason = missing()
    if reason:
        raise BuildError(reason)
    SIW_BUILD.mkdir(parents=True, exist_ok=True)
    with open(SIW_BUILD / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        guest = built(variant)  # another process may have built it meanwhile
        if guest:
            return guest
        return _build(variant, log or (lambda msg: None))


def _build(variant: str, log) -> Guest:
    t0 = time.monotonic()
    kernel = find_kernel()
    log(f"kernel {kernel.abi} version {kernel.version}")
    tree = _kernel_tree(kernel)
    log(f"kernel image ready ({time.monotonic() - t0:.1f} s)")
    src = _siw_source(kernel)
    log(f"siw source ready ({time.monotonic() - t0:.1f} s)")
    out = SIW_BUILD / variant
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    ko = _compile(kernel, src, variant, out)
    log(f"siw.ko ({variant}) compiled ({time.monotonic() - t0:.1f} s)")
    base = _base(kernel, tree, ko)
    log(f"base initramfs ready ({time.monotonic() - t0:.1f} s)")
    extra = out / "extra"
    shutil.rmtree(extra, ignore_errors=True)
    (extra / "lib/modules").mkdir(parents=True)
    (extra / "etc").mkdir()
    shutil.copy(ko, extra / "lib/modules/siw.ko")
    (extra / "etc/iwarp-variant").write_text(f"{variant}\n")
    _cpio(extra, out / "extra.cpio")
    initrd = out / "initrd.img"
    with open(initrd, "wb") as f:
        for part in (base, out / "extra.cpio"):
            f.write(part.read_bytes())
    vmlinuz = out / "vmlinuz"
    shutil.copy(tree / "boot" / f"vmlinuz-{kernel.abi}", vmlinuz)
    manifest = {
        "key": _variant_key(kernel, variant), "variant": variant, "abi": kernel.abi,
        "version": kernel.version, "patch": VARIANTS[variant], "kernel": str(vmlinuz),
        "initrd": str(initrd), "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"built {variant} in {manifest['seconds']} s: {initrd} ({initrd.stat().st_size >> 10} KiB)")
    return Guest(variant, vmlinuz, initrd, manifest)

"""Boot Linux ``siw`` in a QEMU guest (TCG) whose Ethernet is a TCP socket on 127.0.0.1.

Build (cached; see :mod:`iwarp_tb.siw.image`)::

    python -m iwarp_tb.siw.guest build [--variant stock|crc|rev1|all]

Run two guests back to back::

    with SiwGuest("stock", "iwarp.role=rping-server iwarp.count=5", netdev="listen",
                  port=port, ip="169.254.1.1/24") as server, \\
         SiwGuest("stock", "iwarp.role=rping-client iwarp.peer=169.254.1.1 iwarp.count=5",
                  netdev="connect", port=port, ip="169.254.1.2/24") as client:
        assert client.result().pings == 5

or ``run_pair(...)``. A guest with ``netdev="listen"`` may instead face a
:class:`~iwarp_tb.siw.netdev.SocketNetdev` (the model's raw-frame endpoint, the simulated NIC).
The guest's ``/init`` (``init.sh``) documents the ``iwarp.*`` command-line keys and the roles.
"""

import argparse
import asyncio
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from iwarp_model.transport.frames import QemuSocketNetdev
from iwarp_tb.siw import image

QEMU = "qemu-system-x86_64"
READY = "IWARP-READY"
RESULT = "IWARP-RESULT"


class GuestError(RuntimeError):
    """The guest did not get where it should; the message carries the serial log's tail."""


@dataclass
class GuestResult:
    """The guest's ``IWARP-RESULT`` line, parsed, with the tool's output and the whole log."""

    role: str
    rc: int
    fields: dict[str, str]
    output: str
    log: str = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def transcript(self) -> str:
        """The log from ``IWARP-READY`` on: earlier tries, the tool's output, the result line
        and, after a failure, the kernel's last messages (what a failed test should show)."""
        at = self.log.find(READY)
        return self.log[at if at >= 0 else 0:].replace("\r", "")

    @property
    def pings(self) -> int:
        """rping's ``ping data:`` lines (rping exits 0 even when it fails)."""
        return int(self.fields.get("pings", 0))

    @property
    def row(self) -> list[str]:
        """perftest's result row: bytes, iterations, then the tool's figures."""
        return [w for w in self.fields.get("row", "").split(",") if w]


def parse_result(log: str) -> GuestResult | None:
    """The last ``IWARP-RESULT`` of a serial log, or ``None`` when there is none yet."""
    lines = log.replace("\r", "").split("\n")
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        at = line.find(RESULT + " ")
        if at < 0 or i == len(lines) - 1:  # the last line may still be being written
            continue
        kv = dict(w.split("=", 1) for w in line[at + len(RESULT):].split() if "=" in w)
        out = []
        if "IWARP-OUTPUT-END" in lines[:i]:
            end = i - 1 - lines[:i][::-1].index("IWARP-OUTPUT-END")
            begin = max((j for j in range(end) if lines[j] == "IWARP-OUTPUT-BEGIN"), default=end)
            out = lines[begin + 1:end]
        return GuestResult(kv.pop("role", "?"), int(kv.pop("rc", "-1")), kv, "\n".join(out),
                           log)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (read from /proc, without connecting)."""
    want = f":{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[1].endswith(want) and cols[3] == "0A":
                    return True
    except OSError:
        return False
    return False


def mac_for(ip: str) -> str:
    """A locally administered MAC derived from an IPv4 address."""
    a, b, c, d = (int(x) for x in ip.split("/")[0].split("."))
    return f"52:54:{a:02x}:{b:02x}:{c:02x}:{d:02x}"


class SiwGuest:
    """One QEMU guest running ``siw``.

    ``role_cmdline`` is the ``iwarp.*`` part of the kernel command line (a string, or a dict of
    key to value, the ``iwarp.`` prefix optional); ``ip`` becomes ``iwarp.ip``. ``netdev`` says
    whether QEMU listens on or connects to 127.0.0.1:``port``. :meth:`start` builds the guest if
    needed and starts QEMU, :meth:`wait_ready` waits for ``IWARP-READY``, :meth:`result` for
    the ``IWARP-RESULT`` line and QEMU's exit.
    """

    def __init__(self, variant: str, role_cmdline, *, netdev: str = "listen", port: int,
                 mac: str | None = None, ip: str = "169.254.1.2/24",
                 workdir: Path | str | None = None, memory: int = 512, debug: bool = False):
        if netdev not in ("listen", "connect"):
            raise ValueError(f"netdev must be 'listen' or 'connect', not {netdev!r}")
        if isinstance(role_cmdline, dict):
            role_cmdline = " ".join(
                f"{k if k.startswith('iwarp.') else 'iwarp.' + k}={v}"
                for k, v in role_cmdline.items())
        self.variant = variant
        self.role_cmdline = role_cmdline
        self.netdev = netdev
        self.port = port
        self.ip = ip
        self.mac = mac or mac_for(ip)
        self.memory = memory
        self.debug = debug
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="guest-", dir=self._runs()))
        self.workdir.mkdir(parents=True, exist_ok=True)
        tag = f"{ip.split('/')[0]}-{port}"
        self.serial = self.workdir / f"serial-{tag}.log"
        self.stderr = self.workdir / f"qemu-{tag}.err"
        self.proc: subprocess.Popen | None = None
        self.started = self.ready_at = None

    @staticmethod
    def _runs() -> Path:
        runs = image.SIW_BUILD / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        return runs

    def command(self, built: image.Guest) -> list[str]:
        append = (f"console=ttyS0 panic=-1 loglevel={8 if self.debug else 4} "
                  f"iwarp.ip={self.ip} {self.role_cmdline}")
        if self.debug:
            append += " iwarp.debug=1"
        return [
            QEMU, "-nodefaults", "-no-user-config", "-machine", "pc",
            "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", str(self.memory),
            "-kernel", str(built.kernel), "-initrd", str(built.initrd), "-append", append,
            "-serial", f"file:{self.serial}", "-display", "none", "-no-reboot",
            "-netdev", f"socket,id=n0,{self.netdev}=127.0.0.1:{self.port}",
            "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}",
        ]

    def start(self, timeout: float = 10.0) -> "SiwGuest":
        """Start QEMU; with ``netdev="listen"`` return once its socket listens."""
        built = image.ensure(self.variant)
        self.serial.write_bytes(b"")
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(self.command(built), stdin=subprocess.DEVNULL,
                                         stdout=err, stderr=err, start_new_session=True)
        self.started = time.monotonic()
        if self.netdev == "listen":
            deadline = time.monotonic() + timeout
            while not _listening(self.port):
                self._check_alive("QEMU did not listen on its socket")
                if time.monotonic() > deadline:
                    raise GuestError(self._failure(f"no listener on 127.0.0.1:{self.port}"))
                time.sleep(0.02)
        return self

    def log(self) -> str:
        try:
            return self.serial.read_text(errors="replace")
        except OSError:
            return ""

    def _failure(self, what: str, lines: int = 40) -> str:
        tail = "\n".join(self.log().replace("\r", "").splitlines()[-lines:])
        err = self.stderr.read_text(errors="replace").strip() if self.stderr.exists() else ""
        return (f"siw guest {self.ip} ({self.role_cmdline}): {what}\n"
                f"--- serial log tail ({self.serial}) ---\n{tail}"
                + (f"\n--- qemu stderr ---\n{err}" if err else ""))

    def _check_alive(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None and not parse_result(self.log()):
            raise GuestError(self._failure(f"{what}: QEMU exited with {self.proc.returncode}"))

    def wait_ready(self, timeout: float = 120.0) -> str:
        """Wait for the ``IWARP-READY`` line; return it."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log().replace("\r", "").splitlines():
                if line.startswith(READY):
                    if self.ready_at is None:
                        self.ready_at = time.monotonic()
                    return line
            res = parse_result(self.log())
            if res is not None:
                raise GuestError(self._failure(f"finished before ready: rc={res.rc} {res.fields}"))
            self._check_alive("no IWARP-READY")
            if time.monotonic() > deadline:
                raise GuestError(self._failure(f"no {READY} within {timeout:.0f} s"))
            time.sleep(0.1)

    @property
    def boot_seconds(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.started

    def result(self, timeout: float = 180.0) -> GuestResult:
        """Wait for ``IWARP-RESULT`` (and QEMU's exit); return it parsed."""
        deadline = time.monotonic() + timeout
        while True:
            res = parse_result(self.log())
            if res is not None:
                try:
                    self.proc.wait(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    self.stop()
                return res
            self._check_alive(f"no {RESULT}")
            if time.monotonic() > deadline:
                raise GuestError(self._failure(f"no {RESULT} within {timeout:.0f} s"))
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill QEMU (if it still runs)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self, keep: bool = False) -> None:
        self.stop()
        if self._own_dir and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SiwGuest":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type, *exc):
        self.close(keep=exc_type is not None)


@contextmanager
def guest_slot():
    """Hold ``build/siw/run.lock`` while the block runs: one guest scenario at a time across
    pytest workers (TCG guests side by side on two cores slow each other into timeouts)."""
    image.SIW_BUILD.mkdir(parents=True, exist_ok=True)
    with open(image.SIW_BUILD / "run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


async def connect_netdev(port: int, timeout: float = 10.0):
    """A :class:`~iwarp_model.transport.frames.QemuSocketNetdev` connected to the guest's
    listening netdev at 127.0.0.1:``port``, retried until ``timeout`` seconds while QEMU comes
    up (QEMU takes this first connection as its peer)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await QemuSocketNetdev.connect(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def run_attached(variant: str, role: str, workdir: Path, main, *, timeout: float,
                 ip: str = "169.254.1.2/24"):
    """Boot ``variant`` (built first if need be) with ``role`` (its ``iwarp.*`` arguments) and a
    listening netdev, in ``workdir`` (emptied first), under :func:`guest_slot`; return
    ``asyncio.run(main(port, guest))``, which attaches a peer to 127.0.0.1:``port``, bounded by
    ``timeout`` seconds."""
    image.ensure(variant)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with guest_slot():
        port = free_port()
        with SiwGuest(variant, role, netdev="listen", port=port, ip=ip, workdir=workdir) as guest:
            return asyncio.run(asyncio.wait_for(main(port, guest), timeout))


def run_pair(server_role: str, client_role: str, *, variant: str = "stock",
             server_ip: str = "169.254.1.1/24", client_ip: str = "169.254.1.2/24",
             workdir: Path | str | None = None, timeout: float = 240.0
             ) -> tuple[GuestResult, GuestResult]:
    """Two guests back to back, booted together: the server listens on the socket netdev."""
    peer = server_ip.split("/")[0]
    port = free_port()
    server = SiwGuest(variant, server_role, netdev="listen", port=port, ip=server_ip,
                      workdir=workdir)
    client = SiwGuest(variant, f"{client_role} iwarp.peer={peer}", netdev="connect", port=port,
                      ip=client_ip, workdir=workdir)
    with server, client:
        deadline = time.monotonic() + timeout
        res_c = client.result(timeout=timeout)
        res_s = server.result(timeout=max(10.0, deadline - time.monotonic()))
    return res_s, res_c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iwarp_tb.siw.guest",
                                     description="Build or try the siw QEMU guest.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the guest into build/siw/<variant>/ (cached)")
    b.add_argument("--variant", default="stock", choices=[*image.VARIANTS, "all"])
    p = sub.add_parser("pair", help="run a server and a client guest back to back")
    p.add_argument("--variant", default="stock", choices=list(image.VARIANTS))
    p.add_argument("--tool", default="rping",
                   help="rping, ucmatose, ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat")
    p.add_argument("--count", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            for v in image.VARIANTS if args.variant == "all" else [args.variant]:
                t0 = time.monotonic()
                g = image.ensure(v, log=lambda msg: print(f"siw: {msg}", flush=True))
                print(f"{v}: {g.kernel} {g.initrd} ({time.monotonic() - t0:.1f} s)")
            return 0
        t0 = time.monotonic()
        common = f"iwarp.count={args.count}"
        res_s, res_c = run_pair(f"iwarp.role={args.tool}-server {common}",
                                f"iwarp.role={args.tool}-client {common}", variant=args.variant)
        for r in (res_s, res_c):
            print(r.output)
            print(f"{r.role}: rc={r.rc} {r.fields}")
        print(f"wall {time.monotonic() - t0:.1f} s")
        return 0 if res_s.ok and res_c.ok else 1
    except (image.BuildError, GuestError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

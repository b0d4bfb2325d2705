"""Elaborate -> ``build/verilog/<name>.v`` -> Verilator, under cocotb or the native beat player.

* :func:`write_verilog` generates a top-level module with AXI-named ports (:mod:`iwarp_nic.axis`).
* :func:`run_cocotb` builds it with cocotb's Verilator runner and runs a cocotb test module; the
  pytest test fails unless every cocotb test ran and passed.
* :class:`BeatPlayer` builds it with ``vplayer.cpp`` for bulk traffic and cycle-exact benchmarks:
  packets in as beats (:func:`iwarp_tb.beats.to_columns`), transfers out with their cycles.
* :func:`verilate` is the native build they share with :mod:`iwarp_tb.harness`.

Builds are cached per module under ``build/`` and rebuilt when the Verilog changes; a file lock
lets parallel pytest workers share them.
"""

import fcntl
import hashlib
import json
import os
import struct
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from amaranth.hdl import Fragment

from iwarp_nic.axis import axi_ports, convert

from . import toolchain
from .beats import Beat, to_columns

__all__ = ["write_verilog", "run_cocotb", "verilate", "BeatPlayer", "Output"]

VERILOG_DIR = toolchain.BUILD / "verilog"


def _hdl_digest() -> str:
    """A digest of every source file of the gateware package (and the Amaranth version)."""
    import amaranth

    import iwarp_nic

    h = hashlib.sha256(amaranth.__version__.encode())
    for path in sorted(Path(iwarp_nic.__file__).parent.rglob("*.py")):
        h.update(str(path.name).encode() + path.read_bytes())
    return h.hexdigest()


def write_verilog(name, component, out_dir=VERILOG_DIR, *, params=None) -> Path:
    """Write ``component`` as module ``name`` to ``out_dir/<name>.v`` (only if it changed).

    Converting a large design takes tens of seconds (Yosys runs as WebAssembly). With
    ``params`` (anything whose ``repr`` determines the component, given the gateware sources),
    the conversion is skipped when the file was made from the same sources and ``params``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.v"
    stamp = path.with_suffix(".v.key")
    key = None
    if params is not None:
        key = hashlib.sha256((_hdl_digest() + repr(params)).encode()).hexdigest()
        if path.exists() and stamp.exists() and stamp.read_text() == key:
            Fragment.get(component, None)   # elaborated (cheap) so nothing is left unused
            return path
    text = convert(component, name)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    if key is not None:
        stamp.write_text(key)
    elif stamp.exists():
        stamp.unlink()
    return path


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _digest(*paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()


def run_cocotb(name, component, test_module, *, test_dir, testcase=None, env=None,
               waves=False, build_args=(), params=None):
    """Build module ``name`` from ``component`` and run cocotb ``test_module`` against it.

    ``test_dir`` is the folder holding the test module. ``env`` passes parameters to the cocotb
    side (environment variables, e.g. the width). With ``waves`` a trace is written into the build
    folder (FST when the lz4 headers are installed, else VCD); its path is returned with the
    number of tests run. ``build_args`` go to Verilator; ``params`` to :func:`write_verilog`.
    """
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    toolchain.setup()
    source = write_verilog(name, component, params=params)
    fst = waves and toolchain.have_fst()
    build_dir = toolchain.BUILD / "cocotb" / (name + ("-waves" if waves else ""))
    runner = get_runner("verilator")
    with _locked(build_dir.with_suffix(".lock")):
        stamp = build_dir / ".source.sha256"
        public = _top_public(name, build_dir)
        digest = _digest(source, public)
        fresh = not (stamp.exists() and stamp.read_text() == digest)
        # cocotb's runner makes every signal of the design public (--public-flat-rw), which
        # doubles the C++ of a NicCore; the tests reach the top module's ports only.
        runner.build(sources=[public, source], hdl_toplevel=name, build_dir=build_dir,
                     always=fresh, waves=waves,
                     build_args=["--no-public-flat-rw", *build_args,
                                 *(["--trace-fst"] if fst else [])],
                     timescale=("1ns", "1ps"), log_file=build_dir / "build.log")
        stamp.write_text(digest)
    # The simulator runs in the build folder and imports the test module through PYTHONPATH,
    # which cocotb's runner takes from this process's sys.path.
    if str(test_dir) not in sys.path:
        sys.path.insert(0, str(test_dir))
    results = build_dir / f"results-{test_module}-{testcase or 'all'}-{os.getpid()}.xml"
    runner.test(test_module=test_module, hdl_toplevel=name, build_dir=build_dir,
                test_dir=build_dir, testcase=testcase,
                extra_env={k: str(v) for k, v in (env or {}).items()}, waves=waves,
                results_xml=str(results), log_file=build_dir / f"{test_module}.log")
    total, failed = get_results(results)
    assert total > 0, f"cocotb ran no test from {test_module} (see {build_dir})"
    assert failed == 0, f"{failed} of {total} cocotb tests failed (log in {build_dir})"
    trace = build_dir / ("dump.fst" if fst else "dump.vcd")
    return total, (trace if waves else None)


def _top_public(name, build_dir) -> Path:
    """A Verilator configuration file making the signals of module ``name`` (its ports, for
    cocotb's handles) public, and no others."""
    path = Path(build_dir) / "public.vlt"
    text = f'`verilator_config\npublic_flat_rw -module "{name}" -var "*"\n'
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def verilate(name, sources, build_dir, output, *, headers=(), cflags=(), ldflags=(),
             args=()) -> Path:
    """Build module ``name`` natively: ``sources`` (its Verilog and C++ files) into
    ``build_dir/output`` with ``verilator --cc --exe --build``: the per-cycle code at -O2,
    the code run once at -O0.

    ``headers`` are files the C++ sources include; ``cflags`` and ``ldflags`` go to the C++
    compiler and linker, ``args`` to Verilator. The build is skipped when the sources, headers
    and options are those of the last one; a file lock beside ``build_dir`` lets parallel
    processes share it. Returns the path of ``output``.
    """
    toolchain.setup()
    build_dir = Path(build_dir)
    binary = build_dir / output
    with _locked(build_dir.with_suffix(".lock")):
        stamp = build_dir / ".source.sha256"
        digest = _digest(*sources, *headers) + " ".join([*cflags, "|", *ldflags, "|", *args])
        if binary.exists() and stamp.exists() and stamp.read_text() == digest:
            return binary
        build_dir.mkdir(parents=True, exist_ok=True)
        # The code run every cycle at -O2 (the code run once: toolchain.setup's MAKEFLAGS).
        cmd = ["verilator", "--cc", "--exe", "--build", "-j", "2", "-O3",
               "--x-assign", "fast", "--x-initial", "fast", "-Wno-fatal", *args,
               "--top-module", name, "--Mdir", str(build_dir), "-o", output,
               "-MAKEFLAGS", "OPT_FAST=-O2 OPT_GLOBAL=-O2",
               "-CFLAGS", " ".join(cflags), *(["-LDFLAGS", " ".join(ldflags)]
                                              if ldflags else []),
               *map(str, sources)]
        log = build_dir / "build.log"
        with open(log, "w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"Verilator build of {name} failed: see {log}")
        stamp.write_text(digest)
    return binary


class Output(list):
    """The player's record of the output stream: a list of :class:`~iwarp_tb.beats.Beat` with
    ``cycles`` (the transfer cycle of each beat) and ``stats`` (the player's counters)."""

    def __init__(self, beats, cycles, stats):
        super().__init__(beats)
        self.cycles = cycles
        self.stats = stats


class BeatPlayer:
    """A module with one ``s_axis`` input and one ``m_axis`` output, compiled natively.

    ``play(packets, ...)`` plays them as beats with random idle cycles, holds ``m_axis_tready``
    high ``ready`` of the time, and returns the output transfers. Runs at millions of beats per
    second, for the long randomised checks and the benchmarks.
    """

    HARNESS = Path(__file__).with_name("vplayer.cpp")
    HEADERS = [Path(__file__).with_name("vports.h")]

    def __init__(self, name, component):
        ports = axi_ports(component)
        self.name = name
        self.in_bytes = len(ports["s_axis_tdata"][0]) // 8
        self.out_bytes = (len(ports["m_axis_tdata"][0]) + 7) // 8
        self._has = {p for p in ports}
        self.source = write_verilog(name, component)
        self.build_dir = toolchain.BUILD / "vplayer" / name
        self.binary = self.build_dir / "vplayer"

    def build(self):
        defines = [f"-DVTOP=V{self.name}", f"-DVTOP_H='\"V{self.name}.h\"'",
                   f"-DIN_BYTES={self.in_bytes}", f"-DOUT_BYTES={self.out_bytes}"]
        for side in ("s", "m"):
            for sig in ("tkeep", "tlast", "tuser"):
                if f"{side}_axis_{sig}" in self._has:
                    defines.append(f"-DHAS_{side.upper()}_{sig.upper()}")
        verilate(self.name, [self.source, self.HARNESS], self.build_dir, self.binary.name,
                 headers=self.HEADERS, cflags=defines)
        return self

    def play(self, packets, *, idle=0.0, ready=1.0, seed=0, drain=1000, tag="run") -> Output:
        """Play ``packets`` as beats into ``s_axis`` and return the ``m_axis`` transfers.

        Before each beat the input idles a cycle with probability ``idle`` (repeatedly); each
        cycle ``m_axis_tready`` is high with probability ``ready``. Raises AssertionError if the
        DUT hangs."""
        self.build()
        stim = self.build_dir / f"{tag}-{os.getpid()}.in"
        out = self.build_dir / f"{tag}-{os.getpid()}.out"
        columns = to_columns(packets, self.in_bytes)
        with open(stim, "wb") as f:
            f.write(struct.pack("<Q", columns.count))
            f.write(columns.data + columns.keep + columns.last + columns.err)
        done = subprocess.run([str(self.binary), str(stim), str(out), str(seed),
                               str(round(idle * 100)), str(round(ready * 100)), str(drain)],
                              capture_output=True, text=True)
        stim.unlink()
        if done.returncode:
            raise AssertionError(f"{self.name}: {done.stderr.strip() or done.returncode}")
        stats = json.loads(done.stdout)
        record = struct.Struct("<QBBQ")
        raw = out.read_bytes()
        out.unlink()
        size = record.size + self.out_bytes
        result, cycles = [], []
        for offset in range(0, len(raw), size):
            cycle, last, user, keep = record.unpack_from(raw, offset)
            data = int.from_bytes(raw[offset + record.size:offset + size], "little")
            result.append(Beat(data, keep, bool(last), bool(user)))
            cycles.append(cycle)
        return Output(result, cycles, stats)

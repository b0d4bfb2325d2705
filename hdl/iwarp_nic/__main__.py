"""``python -m iwarp_nic verilog --out DIR [-j JOBS] [NAME ...]``: top-level modules as Verilog.

``python -m iwarp_nic header [--out build/include/iwarp_nic.h]``: write the C header of the
NIC's registers, descriptors and commands (:mod:`iwarp_nic.host.nicmap`)."""

import argparse
import fnmatch
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .axis import convert
from .tops import outermost, tops


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m iwarp_nic")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("verilog", help="write build/verilog/<module>.v for each top")
    gen.add_argument("--out", type=Path, default=Path("build/verilog"))
    gen.add_argument("patterns", nargs="*", help="module name globs (default: all)")
    gen.add_argument("--outermost", action="store_true",
                     help="only the tops not part of another (what make lint checks)")
    gen.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                     help="modules converted at once (default: one per CPU)")
    sub.add_parser("list", help="list the top-level modules")
    header = sub.add_parser("header", help="write the C header of the registers and layouts")
    header.add_argument("--out", type=Path, default=Path("build/include/iwarp_nic.h"))
    header.add_argument("--conns", type=int, default=16)
    header.add_argument("--cqs", type=int, default=16)
    header.add_argument("--srqs", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "header":
        from .host.cheader import write_header
        from .host.nicmap import header_layouts, nic_map
        sizes = {"conns": args.conns, "cqs": args.cqs, "srqs": args.srqs}
        path = write_header(args.out, nic_map(**sizes),
                            header_layouts(**sizes, pd_bits=16, stag_entries=4096))
        print(f"wrote {path}")
        return 0

    available = tops()
    if args.command == "list":
        print("\n".join(available))
        return 0
    names = [n for n in (outermost() if args.outermost else available)
             if not args.patterns or any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    if not names:
        print(f"no module matches {args.patterns}; known: {', '.join(available)}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # The largest modules first, so that one of them is not left running alone at the end.
    names.sort(key=lambda n: ("nic_core" not in n, "node" not in n, "engine" not in n))
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for path in pool.map(_write, names, [args.out] * len(names)):
            print(f"wrote {path}", flush=True)
    return 0


def _write(name, out):
    """Convert the top ``name`` to ``out/<name>.v``; its path."""
    path = out / f"{name}.v"
    path.write_text(convert(tops()[name](), name))
    return path


if __name__ == "__main__":
    sys.exit(main())

"""``python -m iwarp_nic verilog --out DIR [NAME ...]``: write top-level modules as Verilog."""

import argparse
import fnmatch
import sys
from pathlib import Path

from .axis import convert
from .tops import tops


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m iwarp_nic")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("verilog", help="write build/verilog/<module>.v for each top")
    gen.add_argument("--out", type=Path, default=Path("build/verilog"))
    gen.add_argument("patterns", nargs="*", help="module name globs (default: all)")
    sub.add_parser("list", help="list the top-level modules")
    args = parser.parse_args(argv)

    available = tops()
    if args.command == "list":
        print("\n".join(available))
        return 0
    names = [n for n in available
             if not args.patterns or any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    if not names:
        print(f"no module matches {args.patterns}; known: {', '.join(available)}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = args.out / f"{name}.v"
        path.write_text(convert(available[name](), name))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

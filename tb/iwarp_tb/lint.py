"""``python -m iwarp_tb.lint DIR``: ``verilator --lint-only -Wall`` on every ``DIR/*.v``, one
module per CPU at a time.

The waivers, each with its reason, are in ``lint.vlt`` beside this file. Exits non-zero if any
module has a warning.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import toolchain

WAIVERS = Path(__file__).with_name("lint.vlt")


def lint(path: Path) -> str:
    """Lint one generated module; return Verilator's warnings ('' when clean)."""
    done = subprocess.run(["verilator", "--lint-only", "-Wall", "--top-module", path.stem,
                           str(WAIVERS), str(path)], capture_output=True, text=True)
    return (done.stdout + done.stderr).strip() if done.returncode else ""


def main(argv):
    toolchain.setup()
    folder = Path(argv[0] if argv else "build/verilog")
    files = sorted(folder.glob("*.v"))
    if not files:
        print(f"lint: no Verilog in {folder} (run make verilog)", file=sys.stderr)
        return 2
    failed = 0
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        reports = list(pool.map(lint, files))
    for path, report in zip(files, reports):
        print(f"{'FAIL' if report else 'ok  '} {path}")
        if report:
            print(report)
            failed += 1
    print(f"lint: {len(files) - failed} of {len(files)} modules clean")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

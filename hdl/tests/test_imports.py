"""Every module of ``iwarp_nic`` imports on its own, as the first import of a fresh
interpreter: no import cycle between the layers' packages (a cycle shows only for some orders
of first import, so each module is tried first)."""

import pkgutil
import subprocess
import sys

import pytest

import iwarp_nic

MODULES = sorted(info.name for info in pkgutil.walk_packages(iwarp_nic.__path__, "iwarp_nic.")
                 if not info.name.endswith("__main__"))


def test_modules_found():
    assert {"iwarp_nic.ddp.outstanding", "iwarp_nic.rdmap.request", "iwarp_nic.engine"} <= set(
        MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_first(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr

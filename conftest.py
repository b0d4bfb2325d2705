"""Project-wide pytest set-up: facility markers and the tier-3 marker.

Tests marked ``tshark``, ``linux_peer`` or ``siw`` need a facility from outside the venv
(:mod:`iwarp_tb.facilities`). Where it is missing they skip with a one-line reason, except under
``CI=true``, where ``.ci/run`` provides them and a missing one is a failure.
Everything under ``tb/`` is tier 3 (Verilator) and gets the ``cocotb`` marker.
"""

import os
from pathlib import Path

import pytest

from iwarp_tb import facilities

TB = Path(__file__).parent / "tb"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if TB in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cocotb)


def pytest_runtest_setup(item):
    for name, check in facilities.CHECKS.items():
        if item.get_closest_marker(name) is None:
            continue
        missing = check()
        if missing is None:
            continue
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} facility required under CI=true: {missing}", pytrace=False)
        pytest.skip(f"{name}: {missing}")

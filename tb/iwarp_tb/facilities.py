"""Outside facilities some tests need, and whether this machine has them.

Each check returns ``None`` when the facility is present, or a one-line reason when it is not.
The root ``conftest.py`` skips a test marked with a facility it lacks, or fails it under
``CI=true``, where ``.ci/run`` installs everything.
"""

import os
import shutil
from pathlib import Path


def _missing_tools(*tools):
    absent = [t for t in tools if shutil.which(t) is None]
    return f"not installed: {', '.join(absent)}" if absent else None


def tshark():
    return _missing_tools("tshark")


def linux_peer():
    if os.geteuid() != 0:
        return "needs root for a network namespace and a TAP device"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun"
    return _missing_tools("ip", "tc")


def siw():
    return _missing_tools("qemu-system-x86_64") or (
        None if os.environ.get("IWARP_SIW_GUEST") else "no siw guest image (IWARP_SIW_GUEST)")


CHECKS = {"tshark": tshark, "linux_peer": linux_peer, "siw": siw}

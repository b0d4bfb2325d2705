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
    return _missing_tools("ip", "tc", "ping")


def siw():
    """QEMU, and the siw guest either built (build/siw) or buildable from installed packages."""
    absent = _missing_tools("qemu-system-x86_64")
    if absent:
        return absent
    from iwarp_tb.siw import image

    return None if image.built("stock") else image.missing()


CHECKS = {"tshark": tshark, "linux_peer": linux_peer, "siw": siw}

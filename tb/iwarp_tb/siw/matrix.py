"""The interop matrix: what works between the simulated NIC and Linux siw, per siw build, NIC
role and tool, read from the JUnit XML of ``tb/siw/test_nic_vs_siw.py``.

``make interop`` runs those tests and writes the table into the README between its two
``interop-matrix`` markers::

    python -m iwarp_tb.siw.matrix build/interop/junit.xml --readme README.md

A test named ``test_<tool>_nic_<role>_vs_siw_<siw's role>[<siw build>]`` fills one cell: pass,
FAIL or skip. A cell with no test says what stands in the way (:data:`NOT_RUN`). The exit status
is 1 when a test failed or none was found, after the table is written.
"""

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from .image import VARIANTS

TOOLS = ("rping", "ucmatose", "ib_write_bw", "ib_read_bw", "ib_send_bw")
ROLES = ("client", "server")
BEGIN, END = "<!-- interop-matrix: begin -->", "<!-- interop-matrix: end -->"
_NAME = re.compile(r"test_(?P<tool>[a-z_]+?)_nic_(?P<role>client|server)_vs_siw_"
                   r"(?:client|server)\[(?P<variant>[a-z0-9]+)\]$")
#: Why a cell has no test: (tool, NIC role, siw build) or (tool, None, None) for every cell.
NOT_RUN = {
    ("ucmatose", "server", "stock"): "cannot work¹",
    ("ucmatose", "server", "crc"): "cannot work¹",
    ("ucmatose", "server", "rev1"): "cannot work¹",
    ("ib_read_bw", "server", "rev1"): "cannot work²",
}
NOTES = (
    "¹ siw's client offers no RTR, so under RFC 5044 7.1.2 the NIC's responder waits for its "
    "first FPDU, while cmatose's client waits for the server's messages first "
    "(docs/siw.md). With the p2p build the RTR breaks the tie.",
    "² MPA revision 1 carries no IRD and ORD: siw's ib_read_bw client keeps up to 128 Reads "
    "outstanding, beyond the NIC's IRD of 8, and the NIC ends the stream with RFC 5040's "
    "Terminate (DDP, MSN range not valid), as it should (docs/siw.md).",
    "rev1: siw built for MPA revision 1 still answers a revision 2 Request with revision 2 "
    "(its `mpa_version` sets only its own Request's), so with the NIC as client the run is "
    "revision 2; as server, revision 1.",
)


def results(junit):
    """``{(tool, role, variant): "pass" | "FAIL" | "skip"}`` from a JUnit XML file."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        match = _NAME.match(case.get("name", ""))
        if not match:
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            verdict = "FAIL"
        elif case.find("skipped") is not None:
            verdict = "skip"
        else:
            verdict = "pass"
        out[match["tool"], match["role"], match["variant"]] = verdict
    return out


def table(found):
    """The Markdown table of ``found`` (as :func:`results` gives it) and its notes."""
    variants = list(VARIANTS)
    lines = ["| tool | NIC as | " + " | ".join(f"siw {v}" for v in variants) + " |",
             "|---|---|" + "---|" * len(variants)]
    for tool in TOOLS:
        for role in ROLES:
            cells = [found.get((tool, role, v)) or NOT_RUN.get((tool, role, v))
                     or NOT_RUN.get((tool, None, None)) or "—" for v in variants]
            lines.append(f"| {tool} | {role} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"{note}  " for note in NOTES]).rstrip() + "\n"


def write_readme(readme, text):
    """Put ``text`` between the markers of ``readme``."""
    content = readme.read_text()
    head, begin, rest = content.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise SystemExit(f"{readme}: no {BEGIN} ... {END} markers")
    readme.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m iwarp_tb.siw.matrix",
                                     description="The NIC-against-siw interop matrix.")
    parser.add_argument("junit", type=Path, help="JUnit XML of tb/siw/test_nic_vs_siw.py")
    parser.add_argument("--readme", type=Path, help="write the table into this file too")
    args = parser.parse_args(argv)
    found = results(args.junit)
    text = table(found)
    print(text, end="")
    if args.readme:
        write_readme(args.readme, text)
    return 1 if not found or "FAIL" in found.values() else 0


if __name__ == "__main__":
    sys.exit(main())

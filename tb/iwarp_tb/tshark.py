"""tshark (Wireshark's dissectors) as the wire-format oracle of captures (recipes/tshark.md).

:func:`decode` runs tshark on a pcap with the iWARP dissectors in a fixed configuration (TCP
heuristics first so MPA is found without a port, Send reassembly off, the RPC-over-RDMA and
SMB Direct heuristics off, IP and TCP checksums checked) and returns the PDML tree and the
expert-info summary; :func:`fields` picks fields by name, :func:`rdmap_opcodes` counts the RDMAP
opcodes of the DDP segments by tshark's names, :func:`rdmap_messages` those of the messages (the
segments with DDP's Last flag), :func:`check_clean` asserts that nothing was malformed.
"""

import re
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter

__all__ = ["TSHARK", "OPCODE_NAMES", "decode", "fields", "rdmap_opcodes", "rdmap_messages",
           "check_clean", "check_fpdus"]

TSHARK = ["tshark", "-n", "-o", "tcp.try_heuristic_first:TRUE",
          "-o", "iwarp_ddp_rdmap.reassemble_iwarp_rdma_send:FALSE",
          "--disable-heuristic", "rpcrdma_iwarp", "--disable-heuristic", "smb_direct_iwarp",
          "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE", "-T", "pdml",
          "-z", "expert"]


#: tshark's names of the RDMAP opcodes 0 to 11 (tshark 4.0 does not know Immediate Data).
OPCODE_NAMES = ["Write", "Read Request", "Read Response", "Send", "Send with Invalidate",
                "Send with SE", "Send with SE and Invalidate", "Terminate", "Unknown", "Unknown",
                "Atomic Request", "Atomic Response"]


def decode(path):
    """``(root, expert)``: the PDML of every packet of ``path`` and the expert-info text."""
    done = subprocess.run([*TSHARK, "-r", str(path)], capture_output=True, text=True,
                          timeout=60)
    if done.returncode:
        raise AssertionError(f"tshark failed on {path}: {done.stderr}")
    xml, _, expert = done.stdout.partition("</pdml>")
    return ET.fromstring(xml + "</pdml>"), expert


def fields(root, name):
    """Every field called ``name`` in the PDML tree."""
    return [f for f in root.iter("field") if f.get("name") == name]


def _opcode(field):
    """tshark's name of the opcode in an ``iwarp_rdma.opcode`` field ("Write", ...)."""
    return re.sub(r" \(0x[0-9a-f]+\)$", "", field.get("showname").split(": ", 1)[1])


def rdmap_opcodes(root):
    """DDP segments per RDMAP opcode, by tshark's names ("Write", "Send with SE", ...)."""
    return Counter(_opcode(f) for f in fields(root, "iwarp_rdma.opcode"))


def rdmap_messages(root):
    """RDMAP messages per opcode: the DDP segments whose Last flag is set, whatever the
    segment sizes each sender chose."""
    return Counter(_opcode(fields(segment, "iwarp_rdma.opcode")[0])
                   for segment in root.iter("proto")
                   if segment.get("name") == "iwarp_ddp_rdmap"
                   and fields(segment, "iwarp_ddp.last_flag")[0].get("show") == "1")


def check_clean(root, expert):
    """Assert that tshark found no malformed packet and reported no expert error."""
    assert not fields(root, "_ws.malformed")
    assert not re.search(r"^Errors \(", expert, re.M), expert


def check_fpdus(path, ulpdus):
    """Assert that tshark reads the capture at ``path`` as one FPDU per ULPDU of ``ulpdus``,
    each with ``Good CRC32``, with their RDMAP opcodes, nothing malformed and no expert error."""
    root, expert = decode(path)
    assert len(fields(root, "iwarp_mpa.fpdu")) == len(ulpdus)
    checks = [f.get("showname") for f in fields(root, "iwarp_mpa.crc_check")]
    assert len(checks) == len(ulpdus), checks
    assert all("(Good CRC32)" in check for check in checks), checks
    assert rdmap_opcodes(root) == Counter(OPCODE_NAMES[u[1] & 0xF] for u in ulpdus)
    check_clean(root, expert)

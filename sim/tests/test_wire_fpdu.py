"""FPDUs, markers and CRC (RFC 5044 4-8): RFC worked examples, splits, errors, tshark oracle."""

import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iwarp_model.pcap import PcapWriter
from iwarp_model.wire.errors import CrcError, MarkerError, OversizeError
from iwarp_model.wire.fpdu import (
    Deframer,
    Framer,
    crc_field,
    fpdu_length,
    mulpdu,
    pad_length,
    wire_length,
)
from iwarp_model.wire.mpa import EnhancedData, MpaFrame
from iwarp_model.wire.rdmap import AtomicRequest, Opcode, ReadRequest, Segment, encode_segment
from iwarp_model.wire.terminate import ErrorCode, Terminate

# RFC 5044 figure 5: the first FPDU of a stream (leading marker), a Send of 24 zero bytes.
FIGURE_5 = bytes.fromhex(
    "00000000" "002a" "4143" "00000000" "00000000" "00000001" "00000000" + "00" * 24 + "52239983"
)
# RFC 5044 figure 6: the second FPDU, at stream offset 0x1ec, with a marker at 0x200.
FIGURE_6 = bytes.fromhex(
    "002a" "4143" "00000000" "00000000" "00000002" "00000000" "00000014" + "00" * 24 + "84925898"
)

# RFC 3720 B.4: data and the CRC as printed there, in wire order.
RFC3720_B4 = [
    (bytes(32), "aa36918a"),
    (b"\xff" * 32, "43aba862"),
    (bytes(range(32)), "4e79dd46"),
    (bytes(range(31, -1, -1)), "5cdb3f11"),
    (bytes.fromhex("01c00000 00000000 00000000 00000000 14000000 00000400 00000014 00000018"
                   "28000000 00000000 02000000 00000000"), "563a96d9"),
]


def send(msn: int, data: bytes) -> bytes:
    return encode_segment(Segment(Opcode.SEND, data, msn=msn))


@pytest.mark.parametrize("data, wire", RFC3720_B4)
def test_crc_field_is_rfc3720_wire_order(data, wire):
    assert crc_field(data) == bytes.fromhex(wire)


def test_rfc5044_figure_5():
    framer = Framer(crc=True, markers=True)
    assert framer.frame(send(1, bytes(24))) == FIGURE_5
    assert framer.position == len(FIGURE_5)
    assert Deframer(crc=True, markers=True).feed(FIGURE_5) == [send(1, bytes(24))]


def test_rfc5044_figure_6():
    """A first FPDU of 492 stream octets (leading marker included), then figure 6."""
    framer = Framer(crc=True, markers=True)
    first = framer.frame(send(1, bytes(492 - 4 - 2 - 4 - 18)))
    assert len(first) == 0x1EC
    second = framer.frame(send(2, bytes(24)))
    assert second == FIGURE_6
    deframer = Deframer(crc=True, markers=True)
    assert deframer.feed(first + second) == [send(1, bytes(464)), send(2, bytes(24))]


def test_lengths_and_mulpdu():
    assert [pad_length(n) for n in range(4)] == [2, 1, 0, 3]
    assert fpdu_length(42) == 48 and fpdu_length(16) == 24  # RFC 5044 figure 4: pad 2
    assert mulpdu(1460, markers=False) == 1454
    assert mulpdu(1460, markers=True) == 1460 - (6 + 4 * 3)
    assert mulpdu(1461, markers=False) == 1461 - 7
    assert mulpdu(100, markers=True) == 128  # never below 128 (RFC 5044 4.5)
    assert mulpdu(70000, markers=False) == 0xFFFF
    assert wire_length(42, position=0, markers=True) == 52
    assert wire_length(42, position=512 - 48, markers=True) == 48  # marker after: next FPDU's
    with pytest.raises(ValueError):
        wire_length(42, position=2)


@given(st.integers(160, 9000), st.integers(0, 127), st.booleans())
def test_mulpdu_fpdu_fits_the_emss(emss, slot, markers):
    """Wherever the FPDU starts, the worst-case marker count keeps it within the EMSS (from 160
    octets on; below, MULPDU stays at 128 and the FPDU may exceed a tiny EMSS, RFC 5044 4.5)."""
    size = mulpdu(emss, markers=markers)
    assert wire_length(size, position=4 * slot, markers=markers) <= emss
    assert Framer(crc=True, markers=markers, emss=emss, position=4 * slot).max_ulpdu == size


def test_framer_rejects_ulpdu_over_mulpdu():
    framer = Framer(crc=False, markers=False, emss=1460)
    framer.frame(bytes(1454))
    with pytest.raises(OversizeError):
        framer.frame(bytes(1455))


def _marker_offsets(wire: bytes, start: int) -> list[int]:
    return [i for i in range(len(wire)) if (start + i) % 512 == 0]


@pytest.mark.parametrize("crc", [True, False])
@pytest.mark.parametrize("k", range(0, 52, 4))
def test_marker_anywhere_every_split(crc, k):
    """A 48-octet FPDU placed so the marker at 512 falls k octets into it: leading (k=0), in the
    DDP header, the payload, right before the CRC (k=44), or between FPDUs (k=48). The stream
    (three FPDUs) is split in two at every octet and also fed one octet at a time."""
    start = 512 - k
    ulpdus = [send(1, bytes(range(24))), send(2, b"xyz"), send(3, bytes(100))]
    framer = Framer(crc=crc, markers=True, position=start)
    wire = b"".join(framer.frame(u) for u in ulpdus)
    first = wire_length(42, position=start, markers=True)
    at = 512 - start
    assert wire[at : at + 4] == (b"\0\0\0\0" if k in (0, 48) else bytes([0, 0, 0, k]))
    if k == 48:
        assert first == 48  # the marker opens the next FPDU
    for cut in range(len(wire) + 1):
        deframer = Deframer(crc=crc, markers=True, position=start)
        assert deframer.feed(wire[:cut]) + deframer.feed(wire[cut:]) == ulpdus
        assert deframer.buffered == 0 and deframer.position == start + len(wire)
    deframer = Deframer(crc=crc, markers=True, position=start)
    assert [u for i in range(len(wire)) for u in deframer.feed(wire[i : i + 1])] == ulpdus


@settings(max_examples=60)
@given(
    ulpdus=st.lists(st.binary(max_size=700), min_size=1, max_size=6),
    crc=st.booleans(),
    markers=st.booleans(),
    slot=st.integers(0, 300),
    data=st.data(),
)
def test_stream_round_trip(ulpdus, crc, markers, slot, data):
    start = 4 * slot
    framer = Framer(crc=crc, markers=markers, position=start)
    pieces = [framer.frame(u) for u in ulpdus]
    wire = b"".join(pieces)
    assert [len(p) for p in pieces] == [
        wire_length(len(u), position=start + sum(len(q) for q in pieces[:i]), markers=markers)
        for i, u in enumerate(ulpdus)
    ]
    if markers:  # a marker at every 512th octet, reserved half zero
        for offset in _marker_offsets(wire, start):
            assert wire[offset : offset + 2] == b"\0\0"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    deframer = Deframer(crc=crc, markers=markers, position=start)
    got, last = [], 0
    for cut in [*cuts, len(wire)]:
        got += deframer.feed(wire[last:cut])
        last = cut
    assert got == ulpdus


def test_crc_off_sends_zero_and_checks_nothing():
    wire = Framer(crc=False, markers=False).frame(b"abc")
    assert wire == bytes.fromhex("0003") + b"abc" + bytes(3) + bytes(4)
    corrupted = wire[:-4] + b"\x12\x34\x56\x78"
    assert Deframer(crc=False, markers=False).feed(corrupted) == [b"abc"]


def test_bad_crc_keeps_the_good_ulpdus_and_sticks():
    framer = Framer(crc=True, markers=False)
    good, bad = framer.frame(b"good"), bytearray(framer.frame(b"bad!"))
    bad[4] ^= 0x01
    deframer = Deframer(crc=True, markers=False)
    with pytest.raises(CrcError) as info:
        deframer.feed(good + bad + framer.frame(b"later"))
    assert info.value.delivered == (b"good",)
    assert info.value.position == len(good)
    with pytest.raises(CrcError):
        deframer.feed(b"")  # RFC 5044 8: nothing more is delivered on this half connection


def test_bad_crc_field_itself():
    wire = bytearray(Framer(crc=True, markers=True).frame(b"x" * 600))
    wire[-1] ^= 0x80
    with pytest.raises(CrcError):
        Deframer(crc=True, markers=True).feed(bytes(wire))


def _with_crc(wire: bytearray) -> bytes:
    """Recompute the CRC of a single FPDU."""
    covered = wire[:-4]
    return bytes(covered) + crc_field(bytes(covered))


@pytest.mark.parametrize("crc", [True, False])
def test_bad_marker_pointer(crc):
    wire = bytearray(Framer(crc=False, markers=True, position=500).frame(bytes(100)))
    assert wire[12:16] == bytes.fromhex("0000 000c")
    wire[15] = 0x10
    if crc:
        wire = bytearray(_with_crc(wire))
    with pytest.raises(MarkerError) as info:
        Deframer(crc=crc, markers=True, position=500).feed(bytes(wire))
    assert (info.value.position, info.value.expected, info.value.received) == (512, 12, 16)


def test_leading_marker_must_be_zero():
    wire = bytearray(Framer(crc=False, markers=True).frame(b"hello"))
    wire[3] = 0x04
    with pytest.raises(MarkerError):
        Deframer(crc=False, markers=True).feed(bytes(wire))


def test_marker_reserved_and_low_bits_ignored():
    """RFC 5044 4.2: RESERVED ignored on receive; the FPDUPTR's two low bits treated as zero."""
    wire = bytearray(Framer(crc=False, markers=True, position=500).frame(bytes(100)))
    wire[12:16] = bytes.fromhex("beef 000f")
    assert Deframer(crc=False, markers=True, position=500).feed(bytes(wire)) == [bytes(100)]


def test_missing_markers_detected():
    """An FPDU framed without markers, read by a receiver that expects them."""
    wire = Framer(crc=True, markers=False).frame(bytes(40))
    with pytest.raises((CrcError, MarkerError)):
        Deframer(crc=True, markers=True).feed(wire + bytes(64))


def test_length_limit():
    wire = Framer(crc=True, markers=False).frame(bytes(200))
    with pytest.raises(OversizeError):
        Deframer(crc=True, markers=False, max_ulpdu=128).feed(wire[:2])


# --- Wireshark's dissectors as an oracle (recipes/tshark.md) ---------------------------------

TSHARK = shutil.which("tshark")


def _tcp_frames(exchange):
    """Ethernet frames for a TCP handshake then ``exchange``: (from_initiator, payload) pairs."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    hosts = [("02:00:00:00:00:01", "10.0.0.1", 40000), ("02:00:00:00:00:02", "10.0.0.2", 9999)]
    seq = [1000, 5000]

    def frame(side, flags, payload=b""):
        (smac, sip, sport), (dmac, dip, dport) = hosts[side], hosts[1 - side]
        pkt = (Ether(src=smac, dst=dmac) / IP(src=sip, dst=dip) /
               TCP(sport=sport, dport=dport, flags=flags, seq=seq[side], ack=seq[1 - side],
                   window=65535) / payload)
        seq[side] += len(payload) + (1 if "S" in flags else 0)
        return bytes(pkt)

    out = [frame(0, "S"), frame(1, "SA"), frame(0, "A")]
    out += [frame(0 if initiator else 1, "PA", payload) for initiator, payload in exchange]
    return out


@pytest.mark.tshark
@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_tshark_decodes_our_stream(tmp_path):
    request = MpaFrame(reply=False, crc=True, enhanced=EnhancedData(4, 4), private_data=b"hi")
    reply = MpaFrame(reply=True, crc=False, enhanced=EnhancedData(4, 4))
    to_responder, to_initiator = Framer(crc=True, markers=False), Framer(crc=True, markers=False)
    read = ReadRequest(sink_stag=0x100, sink_to=0, size=64, src_stag=0x200, src_to=0x1000)
    send_segment = encode_segment(Segment(Opcode.SEND, b"hello tshark", msn=1))
    exchange = [
        (True, request.encode()),
        (False, reply.encode()),
        (True, to_responder.frame(send_segment)),
        (True, to_responder.frame(encode_segment(Segment(Opcode.WRITE, bytes(100), stag=0x200,
                                                         to=0x40)))),
        (True, to_responder.frame(encode_segment(Segment(Opcode.READ_REQUEST, header=read)))),
        (False, to_initiator.frame(encode_segment(Segment(Opcode.READ_RESPONSE, bytes(64),
                                                          stag=0x100, to=0)))),
        (True, to_responder.frame(encode_segment(Segment(
            Opcode.ATOMIC_REQUEST, msn=2, header=AtomicRequest.fetch_add(7, 0x200, 8, 1))))),
        (False, to_initiator.frame(encode_segment(Segment(
            Opcode.TERMINATE, header=Terminate.for_error(ErrorCode.DDP_UNTAGGED_INVALID_QN,
                                                         send_segment))))),
    ]
    path = tmp_path / "mpa.pcap"
    with PcapWriter(path) as pcap:
        for i, frame in enumerate(_tcp_frames(exchange)):
            pcap.write(frame, i * 1000)
    result = subprocess.run(
        [TSHARK, "-n", "-r", str(path), "-o", "tcp.try_heuristic_first:TRUE",
         "-o", "iwarp_ddp_rdmap.reassemble_iwarp_rdma_send:FALSE",
         "--disable-heuristic", "rpcrdma_iwarp", "--disable-heuristic", "smb_direct_iwarp",
         "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE", "-T", "pdml"],
        capture_output=True, text=True, timeout=60, check=True)
    fields = list(ET.fromstring(result.stdout).iter("field"))
    shown = Counter(f.get("name") for f in fields)
    opcodes = Counter(int(f.get("show"), 0) for f in fields if f.get("name") == "iwarp_rdma.opcode")
    assert opcodes == Counter({Opcode.SEND: 1, Opcode.WRITE: 1, Opcode.READ_REQUEST: 1,
                               Opcode.READ_RESPONSE: 1, Opcode.ATOMIC_REQUEST: 1,
                               Opcode.TERMINATE: 1})
    crcs = [f.get("showname", "") for f in fields if f.get("name") == "iwarp_mpa.crc_check"]
    assert len(crcs) == 6 and all("Good CRC32" in c for c in crcs), crcs
    assert shown["iwarp_mpa.req"] == shown["iwarp_mpa.rep"] == 1
    terminate = {f.get("name"): f.get("show") for f in fields if "term" in f.get("name")}
    assert terminate["iwarp_rdma.term_layer"] == "0x01"
    assert terminate["iwarp_rdma.term_errcode_ddp_untagged"] == "0x01"
    assert terminate["iwarp_rdma.term_ddp_h"].replace(":", "") == send_segment[:18].hex()

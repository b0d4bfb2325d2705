"""Terminate header (RFC 5040 4.8), RFC 6580/6581 error registry, mapping of decoder errors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_model.wire.errors import (
    BadFieldError,
    BadKeyError,
    BadOpcodeError,
    BadVersionError,
    CrcError,
    MarkerError,
    OversizeError,
    TruncatedError,
)
from iwarp_model.wire.fpdu import Deframer, Framer
from iwarp_model.wire.mpa import MpaFrame
from iwarp_model.wire.rdmap import Opcode, ReadRequest, Segment, decode_segment, encode_segment
from iwarp_model.wire.terminate import ErrorCode, Layer, Terminate, error_code_for

# RFC 6580 sections 3.1-3.3 and RFC 6581 section 8, transcribed: layer/etype/code.
REGISTRY = {
    "RDMAP_LOCAL_CATASTROPHIC": (0x0, 0x0, 0x00),
    "RDMAP_INVALID_STAG": (0x0, 0x1, 0x00),
    "RDMAP_BASE_BOUNDS": (0x0, 0x1, 0x01),
    "RDMAP_ACCESS_RIGHTS": (0x0, 0x1, 0x02),
    "RDMAP_STAG_NOT_ASSOCIATED": (0x0, 0x1, 0x03),
    "RDMAP_TO_WRAP": (0x0, 0x1, 0x04),
    "RDMAP_PROTECTION_CANNOT_INVALIDATE": (0x0, 0x1, 0x09),
    "RDMAP_PROTECTION_UNSPECIFIED": (0x0, 0x1, 0xFF),
    "RDMAP_INVALID_VERSION": (0x0, 0x2, 0x05),
    "RDMAP_UNEXPECTED_OPCODE": (0x0, 0x2, 0x06),
    "RDMAP_CATASTROPHIC_STREAM": (0x0, 0x2, 0x07),
    "RDMAP_CATASTROPHIC_GLOBAL": (0x0, 0x2, 0x08),
    "RDMAP_OPERATION_CANNOT_INVALIDATE": (0x0, 0x2, 0x09),
    "RDMAP_OPERATION_UNSPECIFIED": (0x0, 0x2, 0xFF),
    "DDP_LOCAL_CATASTROPHIC": (0x1, 0x0, 0x00),
    "DDP_TAGGED_INVALID_STAG": (0x1, 0x1, 0x00),
    "DDP_TAGGED_BASE_BOUNDS": (0x1, 0x1, 0x01),
    "DDP_TAGGED_STAG_NOT_ASSOCIATED": (0x1, 0x1, 0x02),
    "DDP_TAGGED_TO_WRAP": (0x1, 0x1, 0x03),
    "DDP_TAGGED_INVALID_VERSION": (0x1, 0x1, 0x04),
    "DDP_UNTAGGED_INVALID_QN": (0x1, 0x2, 0x01),
    "DDP_UNTAGGED_INVALID_MSN_NO_BUFFER": (0x1, 0x2, 0x02),
    "DDP_UNTAGGED_INVALID_MSN_RANGE": (0x1, 0x2, 0x03),
    "DDP_UNTAGGED_INVALID_MO": (0x1, 0x2, 0x04),
    "DDP_UNTAGGED_MESSAGE_TOO_LONG": (0x1, 0x2, 0x05),
    "DDP_UNTAGGED_INVALID_VERSION": (0x1, 0x2, 0x06),
    "MPA_TCP_CLOSED": (0x2, 0x0, 0x01),
    "MPA_CRC": (0x2, 0x0, 0x02),
    "MPA_MARKER": (0x2, 0x0, 0x03),
    "MPA_INVALID_FRAME": (0x2, 0x0, 0x04),
    "MPA_LOCAL_CATASTROPHIC": (0x2, 0x0, 0x05),
    "MPA_INSUFFICIENT_IRD": (0x2, 0x0, 0x06),
    "MPA_NO_MATCHING_RTR": (0x2, 0x0, 0x07),
}

SEND = encode_segment(Segment(Opcode.SEND, b"abc", msn=4))
READ = ReadRequest(sink_stag=0x11, sink_to=0x22, size=0x33, src_stag=0x44, src_to=0x55)
READ_SEGMENT = encode_segment(Segment(Opcode.READ_REQUEST, msn=2, header=READ))
WRITE = encode_segment(Segment(Opcode.WRITE, bytes(10), stag=0x77, to=0x88))


def test_registry_is_complete_and_right():
    assert {code.name: code.value for code in ErrorCode} == REGISTRY
    assert ErrorCode.MPA_CRC.layer is Layer.LLP and ErrorCode.MPA_CRC.ecode == 2


def test_lookup():
    assert ErrorCode.lookup(1, 2, 6) is ErrorCode.DDP_UNTAGGED_INVALID_VERSION
    assert ErrorCode.lookup(0, 0, 0x42) is ErrorCode.RDMAP_LOCAL_CATASTROPHIC  # "ALL"
    assert ErrorCode.lookup(0, 1, 0x05) is None
    assert ErrorCode.lookup(1, 3, 0) is None  # reserved for the LLP


def test_ddp_error_bytes():
    """Untagged "Invalid QN" about a Send: M and D, segment length, the 18-byte header."""
    term = Terminate.for_error(ErrorCode.DDP_UNTAGGED_INVALID_QN, SEND)
    assert term.encode() == bytes.fromhex("1201c000 0015") + SEND[:18]
    assert term.ddp_segment_length == len(SEND) and term.rdma_header == b""
    assert Terminate.decode(term.encode()) == term
    assert term.code is ErrorCode.DDP_UNTAGGED_INVALID_QN
    assert term.error_bits == 0x1201 == int.from_bytes(term.encode()[:2], "big")


def test_tagged_copy():
    term = Terminate.for_error(ErrorCode.DDP_TAGGED_BASE_BOUNDS, WRITE)
    assert term.ddp_header == WRITE[:14]
    assert Terminate.decode(term.encode()).ddp_header == WRITE[:14]


def test_remote_protection_on_read_request_copies_rdma_header():
    term = Terminate.for_error(ErrorCode.RDMAP_INVALID_STAG, READ_SEGMENT)
    assert term.encode()[:4] == bytes.fromhex("0100e000")  # M, D and R
    assert ReadRequest.decode(term.rdma_header) == READ
    assert Terminate.decode(term.encode()) == term
    wire = encode_segment(Segment(Opcode.TERMINATE, header=term))
    assert decode_segment(wire).header == term


def test_figure_10_rules():
    """RFC 5040 figure 10: which errors carry which copies."""
    assert Terminate.for_error(ErrorCode.RDMAP_LOCAL_CATASTROPHIC, SEND).encode() == bytes(4)
    assert Terminate.for_error(ErrorCode.MPA_CRC, SEND).encode() == bytes.fromhex("20020000")
    assert Terminate.for_error(ErrorCode.DDP_LOCAL_CATASTROPHIC, SEND).ddp_header == b""
    operation = Terminate.for_error(ErrorCode.RDMAP_CATASTROPHIC_STREAM, READ_SEGMENT)
    assert operation.ddp_header == READ_SEGMENT[:18] and operation.rdma_header == b""
    protection = Terminate.for_error(ErrorCode.RDMAP_ACCESS_RIGHTS, SEND)
    assert protection.ddp_header == SEND[:18] and protection.rdma_header == b""
    assert Terminate.for_error(ErrorCode.DDP_TAGGED_TO_WRAP, WRITE[:9]).ddp_header == b""


def test_siw_r_flag_without_rdma_header():
    """Linux siw sets R on protection errors for Sends but attaches no RDMA header."""
    wire = bytes.fromhex("0100e000 0003") + SEND[:18]
    term = Terminate.decode(wire)
    assert term.ddp_header == SEND[:18] and term.rdma_header == b""
    assert term.ddp_segment_length == 3


def test_d_without_m_and_m_without_d():
    term = Terminate(1, 2, 3, None, SEND[:18])
    assert term.encode()[:6] == bytes.fromhex("12034000 0000")
    assert Terminate.decode(term.encode()) == term
    only_m = Terminate(1, 2, 3, 99)
    assert only_m.encode() == bytes.fromhex("12038000 0063")
    assert Terminate.decode(only_m.encode()) == only_m


copies = st.sampled_from([b"", SEND[:18], WRITE[:14], READ_SEGMENT[:18]])


@given(st.integers(0, 15), st.integers(0, 15), st.integers(0, 255),
       st.none() | st.integers(0, 0xFFFF), copies, st.booleans())
def test_round_trip(layer, etype, ecode, length, ddp, with_rdma):
    rdma = READ.encode() if with_rdma and (ddp in (b"", READ_SEGMENT[:18])) else b""
    term = Terminate(layer, etype, ecode, length, ddp, rdma)
    assert Terminate.decode(term.encode()) == term


@pytest.mark.parametrize(
    "wire, error",
    [
        (bytes.fromhex("0100"), TruncatedError),
        (bytes.fromhex("01008000 00"), TruncatedError),
        (bytes.fromhex("01004000 0000"), TruncatedError),
        (bytes.fromhex("01004000 0000") + SEND[:10], TruncatedError),
        (bytes.fromhex("01002000") + READ.encode()[:20], TruncatedError),
        (bytes.fromhex("01000000 00"), BadFieldError),
    ],
)
def test_bad_terminates(wire, error):
    with pytest.raises(error):
        Terminate.decode(wire)


def test_constructor_checks():
    with pytest.raises(BadFieldError):
        Terminate(16, 0, 0)
    with pytest.raises(BadFieldError):
        Terminate(0, 0, 256)
    with pytest.raises(BadFieldError):
        Terminate(0, 1, 0, 5, SEND[:14])
    with pytest.raises(BadFieldError):
        Terminate(0, 1, 0, 5, SEND[:18], b"short")


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_error_code_for_decoder_errors():
    crc_bad = bytearray(Framer(crc=True, markers=False).frame(b"x"))
    crc_bad[2] ^= 1
    assert error_code_for(_raised(lambda: Deframer(crc=True, markers=False).feed(
        bytes(crc_bad)))) is ErrorCode.MPA_CRC
    assert error_code_for(MarkerError(512, 12, 16)) is ErrorCode.MPA_MARKER
    assert error_code_for(CrcError(0, 1, 2)) is ErrorCode.MPA_CRC
    for frame in (b"MPA ID Xyz Frame" + bytes(4), b"MPA ID Req Frame" + bytes.fromhex("0007 0000"),
                  b"MPA ID Req Frame" + bytes.fromhex("0001 0300")):
        assert error_code_for(_raised(lambda f=frame: MpaFrame.decode(f))) \
            is ErrorCode.MPA_INVALID_FRAME
    assert error_code_for(BadKeyError("Key", b"")) is ErrorCode.MPA_INVALID_FRAME

    def segment_error(index, value):
        wire = bytearray(SEND)
        wire[index] = value
        return error_code_for(_raised(lambda: decode_segment(bytes(wire))))

    assert segment_error(0, 0x40) is ErrorCode.DDP_UNTAGGED_INVALID_VERSION
    assert error_code_for(BadVersionError("DV", 2, tagged=True)) \
        is ErrorCode.DDP_TAGGED_INVALID_VERSION
    assert segment_error(1, 0x83) is ErrorCode.RDMAP_INVALID_VERSION
    assert segment_error(1, 0x4D) is ErrorCode.RDMAP_UNEXPECTED_OPCODE
    assert segment_error(1, 0x40) is ErrorCode.RDMAP_UNEXPECTED_OPCODE  # Write, untagged
    assert segment_error(9, 0x01) is ErrorCode.DDP_UNTAGGED_INVALID_QN
    assert error_code_for(BadOpcodeError("AOpCode", 1)) is ErrorCode.RDMAP_UNEXPECTED_OPCODE
    assert error_code_for(TruncatedError("x", 18, 3)) is ErrorCode.RDMAP_CATASTROPHIC_STREAM
    assert error_code_for(OversizeError("ULPDU_Length", 9000)) \
        is ErrorCode.RDMAP_CATASTROPHIC_STREAM

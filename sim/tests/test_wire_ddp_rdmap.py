"""DDP headers (RFC 5041 4) and RDMAP segments (RFC 5040 4, RFC 7306): bytes, trips, errors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_model.wire.ddp import TaggedHeader, UntaggedHeader, decode_header
from iwarp_model.wire.errors import (
    BadFieldError,
    BadOpcodeError,
    BadVersionError,
    TruncatedError,
)
from iwarp_model.wire.rdmap import (
    QUEUE_OF,
    TAGGED_OPCODES,
    AtomicOp,
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    Queue,
    ReadRequest,
    Segment,
    control_field,
    decode_segment,
    encode_segment,
)
from iwarp_model.wire.terminate import ErrorCode, Terminate

u32, u64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)


def test_rfc5044_figure_5_ulpdu():
    """The DDP segment inside RFC 5044 figure 5: Send, Last, QN 0, MSN 1, MO 0, 24 zeros."""
    wire = bytes.fromhex("4143 00000000 00000000 00000001 00000000") + bytes(24)
    assert encode_segment(Segment(Opcode.SEND, bytes(24), msn=1)) == wire
    assert decode_segment(wire) == Segment(Opcode.SEND, bytes(24), msn=1)


def test_opcode_table():
    """RFC 5040 figure 4 and RFC 7306 figure 2 / section 10."""
    assert [op.value for op in Opcode] == list(range(12))
    assert TAGGED_OPCODES == {Opcode.WRITE, Opcode.READ_RESPONSE}
    assert QUEUE_OF[Opcode.READ_REQUEST] == QUEUE_OF[Opcode.ATOMIC_REQUEST] == 1
    assert QUEUE_OF[Opcode.TERMINATE] == 2 and QUEUE_OF[Opcode.ATOMIC_RESPONSE] == 3
    sends = [Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE,
             Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE]
    assert {QUEUE_OF[op] for op in sends} == {Queue.SEND}
    assert [control_field(op) for op in (Opcode.WRITE, Opcode.TERMINATE)] == [0x40, 0x47]


def test_tagged_bytes():
    header = TaggedHeader(stag=0x01020304, to=0x1122334455667788, last=False, rsvd_ulp=0x40)
    assert header.encode() == bytes.fromhex("8140 01020304 1122334455667788")
    write = Segment(Opcode.WRITE, b"data", stag=0xAABBCCDD, to=5)
    assert write.encode() == bytes.fromhex("c140 aabbccdd 0000000000000005") + b"data"


def test_read_request_bytes():
    read = ReadRequest(sink_stag=1, sink_to=2, size=3, src_stag=4, src_to=5)
    wire = encode_segment(Segment(Opcode.READ_REQUEST, msn=7, header=read))
    assert wire == bytes.fromhex(
        "4141 00000000 00000001 00000007 00000000"
        "00000001 0000000000000002 00000003 00000004 0000000000000005")
    assert decode_segment(wire).header == read


def test_send_with_invalidate_bytes():
    wire = encode_segment(Segment(Opcode.SEND_SE_INVALIDATE, b"x", inv_stag=0xDEADBEEF, msn=3))
    assert wire == bytes.fromhex("4146 deadbeef 00000000 00000003 00000000") + b"x"
    assert decode_segment(wire).inv_stag == 0xDEADBEEF


def test_atomic_bytes():
    """RFC 7306 figures 4 and 6: 52- and 12-byte headers, AOpCode in the low 4 bits."""
    request = AtomicRequest.cmp_swap(9, stag=0x10, to=0x20, compare=3, swap=4)
    assert request.encode() == bytes.fromhex(
        "00000002 00000009 00000010 0000000000000020 0000000000000004 ffffffffffffffff"
        "0000000000000003 ffffffffffffffff")
    assert AtomicRequest.fetch_add(1, 2, 8, add=5).encode()[28:52] == bytes.fromhex(
        "0000000000000000 0000000000000000 ffffffffffffffff")  # add mask 0: a 64-bit add
    wire = encode_segment(Segment(Opcode.ATOMIC_REQUEST, header=request))
    assert wire[:6] == bytes.fromhex("414a 00000000") and wire[6:10] == bytes.fromhex("00000001")
    # the 28 reserved bits are ignored on receive
    odd = wire[:18] + bytes.fromhex("fffffff2") + wire[22:]
    assert decode_segment(odd).header == request
    response = encode_segment(Segment(Opcode.ATOMIC_RESPONSE, header=AtomicResponse(9, 77)))
    assert response == bytes.fromhex("414b 00000000 00000003 00000001 00000000"
                                     "00000009 000000000000004d")


def test_immediate_bytes():
    wire = encode_segment(Segment(Opcode.IMMEDIATE_DATA_SE, header=ImmediateData(b"12345678")))
    assert wire == bytes.fromhex("4149 00000000 00000000 00000001 00000000") + b"12345678"


tagged = st.builds(TaggedHeader, u32, u64, st.booleans(), st.integers(0, 255))
untagged = st.builds(UntaggedHeader, u32, u32, u32, st.booleans(), st.integers(0, 2**40 - 1))


@given(tagged | untagged, st.binary(max_size=20))
def test_ddp_header_round_trip(header, payload):
    wire = header.encode() + payload
    assert len(wire) == header.SIZE + len(payload)
    assert decode_header(wire) == header


rdmap_headers = {
    Opcode.READ_REQUEST: st.builds(ReadRequest, u32, u64, u32, u32, u64),
    Opcode.IMMEDIATE_DATA: st.builds(ImmediateData, st.binary(min_size=8, max_size=8)),
    Opcode.IMMEDIATE_DATA_SE: st.builds(ImmediateData, st.binary(min_size=8, max_size=8)),
    Opcode.ATOMIC_REQUEST: st.builds(AtomicRequest, st.sampled_from(AtomicOp), u32, u32, u64,
                                     u64, u64, u64, u64),
    Opcode.ATOMIC_RESPONSE: st.builds(AtomicResponse, u32, u64),
    Opcode.TERMINATE: st.builds(Terminate, st.integers(0, 15), st.integers(0, 15),
                                st.integers(0, 255), st.none() | st.integers(0, 0xFFFF)),
}


@st.composite
def segments(draw):
    op = draw(st.sampled_from(Opcode))
    if op in TAGGED_OPCODES:
        return Segment(op, draw(st.binary(max_size=64)), draw(st.booleans()), stag=draw(u32),
                       to=draw(u64))
    fields = dict(msn=draw(u32))
    if op in rdmap_headers:
        return Segment(op, header=draw(rdmap_headers[op]), **fields)
    inv = draw(u32) if op in (Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE) else 0
    return Segment(op, draw(st.binary(max_size=64)), draw(st.booleans()), mo=draw(u32),
                   inv_stag=inv, **fields)


@given(segments())
def test_segment_round_trip(segment):
    wire = encode_segment(segment)
    assert wire[0] & 0x03 == 1 and wire[1] >> 6 == 1 and wire[1] & 0x0F == segment.opcode
    assert decode_segment(wire) == segment


def _send():
    return bytearray(encode_segment(Segment(Opcode.SEND, b"payload")))


@pytest.mark.parametrize("dv", [0, 2, 3])
def test_bad_ddp_version(dv):
    wire = _send()
    wire[0] = wire[0] & 0xFC | dv
    with pytest.raises(BadVersionError) as info:
        decode_segment(bytes(wire))
    assert info.value.field == "DV" and info.value.tagged is False
    write = bytearray(encode_segment(Segment(Opcode.WRITE, b"", stag=1, to=2)))
    write[0] = write[0] & 0xFC | dv
    with pytest.raises(BadVersionError) as info:
        decode_segment(bytes(write))
    assert info.value.tagged is True


@pytest.mark.parametrize("rv", [0, 2, 3])
def test_bad_rdmap_version(rv):
    wire = _send()
    wire[1] = wire[1] & 0x3F | rv << 6
    with pytest.raises(BadVersionError) as info:
        decode_segment(bytes(wire))
    assert info.value.field == "RV"


@pytest.mark.parametrize("opcode", range(12, 16))
def test_unassigned_opcodes(opcode):
    wire = _send()
    wire[1] = 0x40 | opcode
    with pytest.raises(BadOpcodeError):
        decode_segment(bytes(wire))


def test_reserved_bits_not_checked():
    """RFC 5041 4.1 (DDP Rsvd) and RFC 5040 4.1 (RDMAP Rsv, unused Invalidate STag)."""
    wire = _send()
    wire[0] |= 0x3C
    wire[1] |= 0x30
    wire[2:6] = b"\xff\xff\xff\xff"
    assert decode_segment(bytes(wire)) == Segment(Opcode.SEND, b"payload")


def test_tagged_flag_must_match_opcode():
    wire = bytearray(encode_segment(Segment(Opcode.WRITE, b"", stag=1, to=2)))
    wire[1] = 0x43  # a Send opcode in a tagged segment
    with pytest.raises(BadFieldError) as info:
        decode_segment(bytes(wire))
    assert info.value.field == "T"
    untagged_write = _send()
    untagged_write[1] = 0x40
    with pytest.raises(BadFieldError):
        decode_segment(bytes(untagged_write))


def test_queue_number_must_match_opcode():
    wire = encode_segment(Segment(Opcode.SEND, b"x", qn=1))
    with pytest.raises(BadFieldError) as info:
        decode_segment(wire)
    assert info.value.field == "QN"


def test_header_sizes_enforced():
    read = encode_segment(Segment(Opcode.READ_REQUEST, header=ReadRequest(1, 2, 3, 4, 5)))
    with pytest.raises(TruncatedError):
        decode_segment(read[:-1])
    with pytest.raises(BadFieldError):
        decode_segment(read + b"\0")
    imm = encode_segment(Segment(Opcode.IMMEDIATE_DATA, header=ImmediateData(bytes(8))))
    with pytest.raises(TruncatedError):
        decode_segment(imm[:-1])
    with pytest.raises(TruncatedError):
        decode_segment(read[:10])
    with pytest.raises(TruncatedError):
        decode_segment(b"")
    not_last = bytearray(read)
    not_last[0] &= ~0x40
    with pytest.raises(BadFieldError):
        decode_segment(bytes(not_last))


def test_reserved_atomic_subcode():
    wire = bytearray(encode_segment(Segment(Opcode.ATOMIC_REQUEST,
                                            header=AtomicRequest.fetch_add(1, 2, 8, 1))))
    wire[21] = 0x01  # AOpCode 0001b is reserved (RFC 7306 10.1)
    with pytest.raises(BadOpcodeError):
        decode_segment(bytes(wire))


def test_constructor_checks():
    with pytest.raises(BadFieldError):
        Segment(Opcode.SEND, stag=5)
    with pytest.raises(BadFieldError):
        Segment(Opcode.WRITE, qn=0)
    with pytest.raises(BadFieldError):
        Segment(Opcode.SEND, inv_stag=1)
    with pytest.raises(BadFieldError):
        Segment(Opcode.READ_REQUEST)
    with pytest.raises(BadFieldError):
        Segment(Opcode.SEND, header=ImmediateData(bytes(8)))
    with pytest.raises(BadFieldError):
        Segment(Opcode.IMMEDIATE_DATA, b"x", header=ImmediateData(bytes(8)))
    with pytest.raises(BadFieldError):
        Segment(Opcode.WRITE, stag=2**32)
    with pytest.raises(BadFieldError):
        ImmediateData(bytes(7))


def test_terminate_segment():
    term = Terminate.for_error(ErrorCode.RDMAP_INVALID_VERSION)
    wire = encode_segment(Segment(Opcode.TERMINATE, header=term))
    assert wire == bytes.fromhex("4147 00000000 00000002 00000001 00000000 02050000")
    assert decode_segment(wire).header == term

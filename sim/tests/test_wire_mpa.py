"""MPA Request/Reply frames (RFC 5044 7.1, RFC 6581): bytes, round trips, reader, negotiation."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_model.wire.errors import (
    BadFieldError,
    BadKeyError,
    BadVersionError,
    OversizeError,
    TruncatedError,
)
from iwarp_model.wire.mpa import (
    KEY_REPLY,
    KEY_REQUEST,
    EnhancedData,
    MpaFrame,
    MpaFrameReader,
    negotiate,
    reject,
)

# RFC 5044 7.1.1 gives both keys in hex.
REQ_KEY_HEX = "4D 50 41 20 49 44 20 52 65 71 20 46 72 61 6D 65"
REP_KEY_HEX = "4D 50 41 20 49 44 20 52 65 70 20 46 72 61 6D 65"


def test_keys_are_the_rfc_bytes():
    assert KEY_REQUEST == bytes.fromhex(REQ_KEY_HEX)
    assert KEY_REPLY == bytes.fromhex(REP_KEY_HEX)


def test_siw_style_request_bytes():
    """What Linux siw sends for rping: C clear, S set, Rev 2, 4 bytes of IRD/ORD (1/1)."""
    frame = MpaFrame(reply=False, enhanced=EnhancedData(ird=1, ord=1))
    assert frame.encode() == KEY_REQUEST + bytes.fromhex("1002 0004 0001 0001")
    assert MpaFrame.decode(frame.encode()) == frame


def test_flag_bits_and_rev1_reply():
    frame = MpaFrame(reply=True, markers=True, crc=True, reject=True, revision=1,
                     private_data=b"no")
    assert frame.encode() == KEY_REPLY + bytes.fromhex("e001 0002") + b"no"


def test_enhanced_data_bits():
    """RFC 6581 9: |A|B| IRD |C|D| ORD |, 14-bit counts, network order."""
    data = EnhancedData(ird=0x3FFF, ord=5, peer_to_peer=True, rtr_send=True, rtr_read=True)
    assert data.encode() == bytes.fromhex("ffff 4005")
    assert EnhancedData(ird=2, ord=3, peer_to_peer=True, rtr_write=True).encode() == bytes.fromhex(
        "8002 8003")
    assert EnhancedData.decode(bytes.fromhex("ffff c005")) == EnhancedData(
        0x3FFF, 5, True, True, True, True)


def test_rtr_flags_ignored_without_peer_to_peer():
    """RFC 6581 9.2: with A clear, B, C and D are ignored on reception."""
    assert EnhancedData.decode(bytes.fromhex("4007 c009")) == EnhancedData(ird=7, ord=9)
    with pytest.raises(BadFieldError):
        EnhancedData(ird=1, ord=1, rtr_write=True)
    with pytest.raises(BadFieldError):
        EnhancedData(ird=0x4000, ord=0)


enhanced_data = st.builds(
    lambda ird, ord_, p2p, b, c, d: EnhancedData(ird, ord_, p2p, p2p and b, p2p and c, p2p and d),
    st.integers(0, 0x3FFF), st.integers(0, 0x3FFF), st.booleans(), st.booleans(), st.booleans(),
    st.booleans(),
)


@st.composite
def frames(draw):
    reply = draw(st.booleans())
    revision = draw(st.sampled_from([1, 2]))
    enhanced = draw(st.none() | enhanced_data) if revision == 2 else None
    room = 512 - (4 if enhanced else 0)
    return MpaFrame(
        reply=reply,
        markers=draw(st.booleans()),
        crc=draw(st.booleans()),
        reject=reply and draw(st.booleans()),
        revision=revision,
        enhanced=enhanced,
        private_data=draw(st.binary(max_size=room)),
    )


@given(frames())
def test_frame_round_trip(frame):
    wire = frame.encode()
    assert len(wire) == 20 + frame.pd_length
    assert MpaFrame.decode(wire, reply=frame.reply) == frame


@given(frames(), st.data())
def test_reader_assembles_any_split(frame, data):
    wire = frame.encode() + b"\x00\x2a FPDU"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    reader = MpaFrameReader(reply=frame.reply)
    got, start = None, 0
    for cut in [*cuts, len(wire)]:
        if got is None:
            got = reader.feed(wire[start:cut])
            start = cut
    assert got == frame
    assert reader.leftover + wire[start:] == b"\x00\x2a FPDU"


def test_reader_counts_needed_bytes():
    frame = MpaFrame(reply=True, enhanced=EnhancedData(4, 4), private_data=b"abc")
    wire = frame.encode()
    reader = MpaFrameReader(reply=True)
    assert reader.needed == 20
    assert reader.feed(wire[:7]) is None and reader.needed == 13
    assert reader.feed(wire[7:21]) is None and reader.needed == 27 - 21
    assert reader.feed(wire[21:]) == frame and reader.needed == 0
    with pytest.raises(ValueError):
        reader.feed(b"more")


def test_reader_fails_early():
    with pytest.raises(BadKeyError):
        MpaFrameReader(reply=True).feed(b"MPA ID Req")  # a request where a reply is due
    with pytest.raises(OversizeError):
        MpaFrameReader(reply=False).feed(KEY_REQUEST + bytes.fromhex("0002 0201"))
    with pytest.raises(BadVersionError):
        MpaFrameReader(reply=False).feed(KEY_REQUEST + bytes.fromhex("0003 0000"))


@pytest.mark.parametrize(
    "wire, error",
    [
        (b"MPA ID Xyz Frame" + bytes(4), BadKeyError),
        (KEY_REQUEST + bytes.fromhex("0000 0000"), BadVersionError),  # Rev 0 (RDMAC)
        (KEY_REQUEST + bytes.fromhex("0003 0000"), BadVersionError),
        (KEY_REQUEST + bytes.fromhex("0002 0201") + bytes(513), OversizeError),
        (KEY_REQUEST + bytes.fromhex("0002 0005") + bytes(4), TruncatedError),
        (KEY_REQUEST + bytes.fromhex("0002 0003") + bytes(4), BadFieldError),
        (KEY_REQUEST + bytes.fromhex("1001 0004") + bytes(4), BadFieldError),  # S needs Rev 2
        (KEY_REQUEST + bytes.fromhex("1002 0003") + bytes(3), BadFieldError),  # S, no room
        (KEY_REQUEST[:10], TruncatedError),
    ],
)
def test_bad_frames(wire, error):
    with pytest.raises(error):
        MpaFrame.decode(wire)


def test_wrong_kind_and_encoder_limits():
    request = MpaFrame(reply=False).encode()
    with pytest.raises(BadKeyError):
        MpaFrame.decode(request, reply=True)
    with pytest.raises(OversizeError):
        MpaFrame(reply=False, private_data=bytes(513))
    with pytest.raises(OversizeError):
        MpaFrame(reply=False, enhanced=EnhancedData(1, 1), private_data=bytes(509))
    assert MpaFrame(reply=False, enhanced=EnhancedData(1, 1), private_data=bytes(508)).pd_length \
        == 512
    with pytest.raises(BadFieldError):
        MpaFrame(reply=False, revision=1, enhanced=EnhancedData(1, 1))


def test_r_and_res_not_checked_in_a_request():
    """RFC 5044 7.1.1: R is not checked in a Request, Res bits are not checked anywhere."""
    frame = MpaFrame.decode(KEY_REQUEST + bytes.fromhex("2f01 0000"))
    assert frame == MpaFrame(reply=False, revision=1)


def test_negotiate_crc_and_markers_per_direction():
    request = MpaFrame(reply=False, markers=True, crc=False)
    reply = MpaFrame(reply=True, markers=False, crc=True)
    result = negotiate(request, reply)
    assert result.crc
    # The Request's M asks the responder to mark what it sends; the Reply's M the initiator.
    assert result.markers_from_responder and not result.markers_from_initiator
    assert result.tx_markers(initiator=False) and result.rx_markers(initiator=True)
    assert not result.tx_markers(initiator=True) and not result.rx_markers(initiator=False)
    assert not negotiate(MpaFrame(reply=False), MpaFrame(reply=True)).crc
    with pytest.raises(ValueError):
        negotiate(reply, request)


def test_negotiate_rtr():
    offer = EnhancedData(4, 4, peer_to_peer=True, rtr_send=True, rtr_write=True)
    answer = EnhancedData(4, 4, peer_to_peer=True, rtr_write=True, rtr_read=True)
    result = negotiate(MpaFrame(reply=False, enhanced=offer), MpaFrame(reply=True,
                                                                       enhanced=answer))
    assert result.peer_to_peer and result.rtr_write
    assert not result.rtr_send and not result.rtr_read
    plain = negotiate(MpaFrame(reply=False, enhanced=offer), MpaFrame(reply=True, revision=1))
    assert not plain.peer_to_peer and not plain.rtr_write


def test_reject_mirrors_the_request():
    request = MpaFrame(reply=False, crc=True, enhanced=EnhancedData(2, 8, True, rtr_read=True))
    frame = reject(request, b"need ORD 4", ird=0, ord=4)
    assert frame.reject and frame.reply and frame.revision == 2
    assert frame.enhanced == EnhancedData(0, 4, True, rtr_read=True)
    assert MpaFrame.decode(frame.encode(), reply=True) == frame
    assert reject(MpaFrame(reply=False, revision=1)).enhanced is None

"""The packets <-> beats helper that every testbench uses follows the stream rules."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_nic.stream import DATA_BYTES
from iwarp_tb.beats import Beat, Packet, check_beat, from_beats, to_beats, to_columns

packets = st.lists(st.builds(Packet, st.binary(min_size=1, max_size=200), st.booleans()),
                   min_size=1, max_size=8)


@given(packets, st.sampled_from(DATA_BYTES))
def test_round_trip(pkts, width):
    beats = [b for p in pkts for b in to_beats(p, width)]
    for beat in beats:
        check_beat(beat, width)
    got = from_beats(beats, width)
    assert got == pkts and [p.err for p in got] == [p.err for p in pkts]


@given(packets, st.sampled_from(DATA_BYTES))
def test_columns_match_beats(pkts, width):
    beats = [b for p in pkts for b in to_beats(p, width)]
    cols = to_columns(pkts, width)
    assert cols.count == len(beats)
    for i, beat in enumerate(beats):
        data = int.from_bytes(cols.data[i * width:(i + 1) * width], "little")
        (keep,) = struct.unpack_from("<Q", cols.keep, 8 * i)
        assert Beat(data, keep, bool(cols.last[i]), bool(cols.err[i])) == beat


def test_lane_order_and_partial_keep():
    assert to_beats(b"\x01\x02\x03", 2) == [Beat(0x0201, 0b11, False), Beat(0x03, 0b01, True)]


@pytest.mark.parametrize("bad, message", [
    (Beat(0, 0, True), "empty"),
    (Beat(0, 0b101, True), "contiguous"),
    (Beat(0, 0b0111, False), "partial keep"),
    (Beat(0, 0b1111, False, True), "err on a beat"),
])
def test_rule_violations_caught(bad, message):
    with pytest.raises(AssertionError, match=message):
        from_beats([bad], 4)


def test_unfinished_packet_caught():
    with pytest.raises(AssertionError, match="without last"):
        from_beats([Beat(1, 0b1111, False)], 4)
    with pytest.raises(ValueError):
        to_beats(b"", 4)

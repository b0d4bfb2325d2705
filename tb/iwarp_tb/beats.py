"""Packets <-> beats: the only place where byte strings become stream beats and back.

Both simulators (Amaranth's, and Verilator under cocotb or the native beat player) go through
these two functions, so every testbench splits and reassembles packets by the same rules
(:mod:`iwarp_nic.stream`): lane 0 first, ``keep`` partial only on ``last``, no empty beats, ``err``
on the last beat of a bad packet.
"""

from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["Beat", "Packet", "Columns", "to_beats", "to_columns", "from_beats",
           "from_tagged_beats", "check_beat"]


class Beat(NamedTuple):
    data: int  # little-endian: lane 0 in bits 7..0
    keep: int
    last: bool
    err: bool = False


class Packet(bytes):
    """Bytes with an ``err`` flag (the packet's last beat carried ``err``)."""

    err: bool

    def __new__(cls, payload=b"", err=False):
        self = super().__new__(cls, payload)
        self.err = bool(err)
        return self

    def __repr__(self):
        return f"Packet({bytes(self)!r}{', err=True' if self.err else ''})"


def to_beats(packet: bytes, data_bytes: int, *, err: bool = None) -> list[Beat]:
    """Split one packet into beats of ``data_bytes``. ``err`` defaults to ``packet.err``."""
    if not packet:
        raise ValueError("a packet has at least one byte: streams carry no empty beats")
    if err is None:
        err = getattr(packet, "err", False)
    beats = []
    for start in range(0, len(packet), data_bytes):
        chunk = packet[start:start + data_bytes]
        last = start + data_bytes >= len(packet)
        beats.append(Beat(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, last,
                          bool(err) and last))
    return beats


def check_beat(beat: Beat, data_bytes: int) -> None:
    """Raise AssertionError if ``beat`` breaks the stream rules (a DUT output check)."""
    full = (1 << data_bytes) - 1
    if beat.last:
        assert beat.keep != 0, f"empty last beat: {beat}"
        assert beat.keep & (beat.keep + 1) == 0, f"keep not contiguous from lane 0: {beat}"
    else:
        assert beat.keep == full, f"partial keep on a beat that is not last: {beat}"
        assert not beat.err, f"err on a beat that is not last: {beat}"


def from_beats(beats: Iterable[Beat], data_bytes: int) -> list[Packet]:
    """Reassemble beats into packets, checking every beat against the stream rules.

    A trailing packet with no ``last`` beat is an error: it means the DUT stopped mid-packet.
    """
    packets, current = [], bytearray()
    for beat in beats:
        beat = Beat(*beat)
        check_beat(beat, data_bytes)
        n = beat.keep.bit_length()
        current += (beat.data & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
        if beat.last:
            packets.append(Packet(current, beat.err))
            current = bytearray()
    if current:
        raise AssertionError(f"stream ended inside a packet ({len(current)} bytes without last)")
    return packets


def from_tagged_beats(transfers: Iterable[dict], data_bytes: int) -> list[tuple[int, Packet]]:
    """Reassemble the transfers of a stream that interleaves connections' packets (each a dict
    of ``data``, ``keep``, ``last``, ``conn`` and maybe ``err``) into ``(conn, packet)`` pairs,
    checking the stream rules and that all beats of a packet name one connection."""
    transfers = list(transfers)
    packets = from_beats((Beat(t["data"], t["keep"], t["last"], t.get("err", 0))
                          for t in transfers), data_bytes)
    conns, current = [], set()
    for t in transfers:
        current.add(t["conn"])
        if t["last"]:
            if len(current) != 1:
                raise AssertionError(f"a packet's beats name connections {sorted(current)}")
            conns.append(current.pop())
    return list(zip(conns, packets))


class Columns(NamedTuple):
    """Beats of many packets, column by column (for the native player): ``data`` is every beat's
    lanes back to back (unused lanes zero), ``keep`` one u64 per beat, ``last`` and ``err`` one
    byte per beat. Built per packet, not per beat, so millions of beats take milliseconds."""

    count: int
    data: bytes
    keep: bytes
    last: bytes
    err: bytes


def to_columns(packets: Iterable[bytes], data_bytes: int) -> Columns:
    """The beats of ``packets`` (same rules as :func:`to_beats`) as :class:`Columns`."""
    full = ((1 << data_bytes) - 1).to_bytes(8, "little")
    data, keep, last, err = [], [], [], []
    count = 0
    for packet in packets:
        if not packet:
            raise ValueError("a packet has at least one byte: streams carry no empty beats")
        beats = -(-len(packet) // data_bytes)
        tail = len(packet) - (beats - 1) * data_bytes
        data += [packet, bytes(beats * data_bytes - len(packet))]
        keep += [full * (beats - 1), ((1 << tail) - 1).to_bytes(8, "little")]
        last += [bytes(beats - 1), b"\x01"]
        err += [bytes(beats - 1), b"\x01" if getattr(packet, "err", False) else b"\x00"]
        count += beats
    return Columns(count, b"".join(data), b"".join(keep), b"".join(last), b"".join(err))

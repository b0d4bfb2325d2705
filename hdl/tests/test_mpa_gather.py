# amaranth: UnusedElaboratable=no
"""FrameGather against the model's framing, widths 1, 8 and 64.

Each connection's stream is built by the model: an MPA Request or Reply
(:class:`iwarp_model.wire.mpa.MpaFrame`), then FPDUs from :class:`iwarp_model.wire.fpdu.Framer`
with markers or not, ULPDUs of random lengths. The streams are cut into TCP-like chunks and the
chunks of all connections interleaved at random, with random idle and stall cycles on every
stream; a host answers each STARTUP release with the FPDUS command (the connection's markers
and CRC setting) before that connection's FPDU chunks may go, or, for a peer that sends its
FPDUs right behind its startup frame (as Linux siw's Responder does), at some point among them.
The oracle replays the same chunks and commands against the frame boundaries the model
produced: after each chunk, a connection's octets up to its last complete frame are released
(before FPDU mode, only the startup frame; the command releases what was held), so the whole
sequence of releases (connection, kind, marker position, octets, and the settings an FPDUS piece
carries: markers, CRC, and whether it is the connection's first FPDUS piece) must match.
"""

import random
from dataclasses import dataclass, field

import pytest

from iwarp_model.wire.errors import CrcError, MarkerError, OversizeError
from iwarp_model.wire.fpdu import Deframer, Framer, wire_length
from iwarp_model.wire.mpa import MpaFrame
from iwarp_nic.mpa import ErrorKind, MpaReceiver
from iwarp_nic.mpa.gather import FrameGather, GatherOp, ReleaseKind, max_frame_ulpdu
from iwarp_tb.amsim import run
from iwarp_tb.beats import from_tagged_beats
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    recv,
    recv_packets,
    send,
    send_packets,
    until_quiet,
)

IDLE = STALL = 0.3
WIDTHS = (1, 8, 64)
CONNS = 3
RING = 4096
CHUNK = 1460


@dataclass
class Stream:
    """One connection's octets, where its frames end, and what the oracle has released."""

    conn: int
    startup: bytes
    markers: bool
    crc: bool = False
    octets: bytearray = field(default_factory=bytearray)
    ends: list = field(default_factory=list)      # offsets where frames end, ascending
    delivered: int = 0
    released: int = 0
    passing: int | None = None      # offset from which framing is lost (an over-long length)
    ring: int = RING                # the gather's ring and largest chunk
    chunk: int = CHUNK
    commanded: bool = False         # FPDUS given
    lost: bool = False              # framing is lost: octets go as they come
    after: ReleaseKind = ReleaseKind.EARLY      # the kind of what follows the startup frame
    fpdus_out: bool = False         # an FPDUS piece has been released
    held_out: int = 0               # octets the FPDUS command released

    def held_framing(self):
        """Where the frames after the startup frame end when framed without markers, as the
        gather frames what comes before FPDU mode, and where that framing is lost (or None)."""
        limit = max_frame_ulpdu(self.ring, self.chunk)
        ends, at = [], len(self.startup)
        while at + 2 <= len(self.octets):
            length = int.from_bytes(self.octets[at:at + 2], "big")
            if length > limit:
                return ends, at + 2
            at += wire_length(length)
            ends.append(at)
        return ends, None

    def piece(self):
        """What the gather releases after the chunk that brought ``delivered`` octets."""
        head = len(self.startup)
        ends, passing = self.ends, self.passing
        if not self.commanded and self.delivered > head:
            # Held: the startup frame goes alone, unless the held octets leave no room for a
            # chunk or are framed into an over-long length.
            ends, passing = [head], self.held_framing()[1]
            if self.delivered - head > self.ring - self.chunk:
                passing = self.delivered
        if self.lost or (passing is not None and self.delivered >= passing):
            self.lost = True
            return self.release(self.delivered)
        return self.release(max([self.released] + [e for e in ends if e <= self.delivered]))

    def command(self):
        """What the FPDUS command releases (None for nothing)."""
        self.commanded = True
        if self.lost:
            return None
        if not self.markers:
            self.after = ReleaseKind.FPDUS
            piece = self.piece()
        else:
            piece = self.release(self.delivered)    # framed without markers: wrongly
            self.lost = piece is not None
            if not self.lost:
                self.after = ReleaseKind.FPDUS
        self.held_out = len(piece[3]) if piece else 0
        return piece

    def release(self, end):
        if end == self.released:
            return None
        kind = ReleaseKind.STARTUP if self.released < len(self.startup) else self.after
        start, self.released = self.released, end
        if kind == ReleaseKind.FPDUS:
            settings = (int(self.markers), int(self.crc), int(not self.fpdus_out))
            self.fpdus_out = True
        else:
            settings = (0, 0, 0)
        return (self.conn, kind, (start - len(self.startup)) % 512,
                bytes(self.octets[start:end])) + settings


def build(rng, conn, n_fpdus, *, oversize_at=None, largest=2599, big=False, crc=None,
          markers=None):
    """A connection's stream: a startup frame, then ``n_fpdus`` FPDUs (one with ULPDU_Length
    0xFFFF, its field complete at ``passing``, when ``oversize_at`` is given). With ``big``, the
    largest private data and a last FPDU of ``largest`` octets. The FPDUs' ``crc`` and
    ``markers`` are random unless given."""
    pd_size = 512 if big else rng.choice([0, 1, 3, 17, 100, 512])
    pd = bytes(rng.getrandbits(8) for _ in range(pd_size))
    frame = MpaFrame(reply=rng.random() < 0.5, markers=rng.random() < 0.5,
                     crc=rng.random() < 0.5, private_data=pd).encode()
    s = Stream(conn, frame, markers=rng.random() < 0.5)
    s.octets += frame
    s.ends.append(len(frame))
    s.crc = rng.random() < 0.5      # the CRC setting the host gives with FPDUS
    if crc is not None:
        s.crc = crc
    if markers is not None:
        s.markers = markers
    framer = Framer(crc=s.crc, markers=s.markers)
    for k in range(n_fpdus):
        size = rng.choice([0, 1, 2, 3, 14, 28, rng.randint(0, 600),
                           rng.randint(500, largest)])
        if big and k == n_fpdus - 1:
            size = largest
        elif s.markers and rng.random() < 0.3:
            # Sized to end on a marker, so the next FPDU begins with a leading marker.
            position = framer.position
            size = next(size for size in range(largest + 1) if (position + wire_length(
                size, position=position, markers=True)) % 512 == 0)
        fpdu = framer.frame(bytes(rng.getrandbits(8) for _ in range(size)))
        if k == oversize_at:
            # The length field (after a leading marker, if any) claims 0xFFFF.
            at = 4 if s.markers and (len(s.octets) - len(frame)) % 512 == 0 else 0
            fpdu = fpdu[:at] + b"\xff\xff" + fpdu[at + 2:]
            s.passing = len(s.octets) + at + 2
        s.octets += fpdu
        s.ends.append(len(s.octets))
    return s


def chunks_of(rng, s, n, chunk=CHUNK, *, cross=False):
    """The startup frame's chunks, then the FPDUs' (with ``cross``, the last of the first list
    may run on into the FPDUs, as a segment that carries a Reply and the FPDUs behind it)."""
    sizes = (1, 2, 3, 7, n, n + 1, 64, 300, chunk)
    head = len(s.startup)
    if cross and rng.random() < 0.5:
        head = min(len(s.octets), head + rng.randint(1, chunk // 2))

    def cut(lo, hi):
        out = []
        while lo < hi:
            size = min(rng.choice(sizes), hi - lo)
            out.append((lo, lo + size))
            lo += size
        return out

    return cut(0, head), cut(head, len(s.octets))


def drivers(n, dut, streams, rng, startup_seen, *, early=(), never=()):
    """The testbenches that feed ``streams`` to ``dut`` (a gather, or something with one at its
    input): a sender of their chunks, interleaved at random, and a host that starts every
    connection and gives FPDUS once ``startup_seen(conn)``; FPDU chunks go only after it. The
    connections in ``early`` send theirs at once, the startup frame's last chunk perhaps running
    on into them, and the sender gives their FPDUS once their startup frame is seen and one to
    four of their FPDUs have gone (never for those in ``never``). Returns the two, the oracle's
    list of expected releases (filled as chunks and commands go) and a dict whose ``"sent"``
    says all went."""
    plans = {s.conn: chunks_of(rng, s, n, cross=s.conn in early) for s in streams}
    allowed = {s.conn: False for s in streams}      # FPDU chunks may go
    expected = []
    state = {"sent": False, "started": False, "commanding": False}
    # The offset behind which the sender gives an early connection's FPDUS.
    held_until = {s.conn: s.ends[min(rng.randint(1, 4), len(s.ends) - 1)] for s in streams}

    async def command(ctx, s):
        """FPDUS for ``s``, the two testbenches taking turns on the command port."""
        while state["commanding"]:
            await ctx.tick()
        state["commanding"] = True
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_cmd),
                   [{"op": GatherOp.FPDUS.value, "conn": s.conn, "markers": int(s.markers),
                     "crc": int(s.crc)}], rng=rng, idle=IDLE)
        state["commanding"] = False

    async def sender(ctx):
        bus = AmaranthBus(ctx)
        while not state["started"]:                 # START before a connection's octets
            await ctx.tick()
        def uncommanded():
            return [c for c in sorted(set(early) - set(never)) if not streams[c].commanded]

        while any(plans[c][0] or plans[c][1] for c in plans) or uncommanded():
            for c in uncommanded():
                s = streams[c]
                if startup_seen(c) and (s.delivered >= held_until[c] or not plans[c][1]):
                    piece = s.command()             # between this connection's chunks
                    if piece:
                        expected.append(piece)
                    await command(ctx, s)
            ready = [c for c in plans if plans[c][0]
                     or (plans[c][1] and (allowed[c] or (c in early and not plans[c][0])))]
            if not ready:
                await ctx.tick()
                continue
            c = rng.choice(ready)
            s = streams[c]
            startup, fpdus = plans[c]
            lo, hi = (startup if startup else fpdus).pop(0)
            s.delivered = hi
            piece = s.piece()
            if piece:
                expected.append(piece)
            await send(bus, StreamPort.amaranth(dut.i_header), [{"conn": c, "length": hi - lo}],
                       rng=rng, idle=IDLE)
            await send_packets(bus, StreamPort.amaranth(dut.i), [bytes(s.octets[lo:hi])], n,
                               rng=rng, idle=IDLE)
        state["sent"] = True

    async def host(ctx):
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_cmd),
                   [{"op": GatherOp.START.value, "conn": s.conn, "markers": 0, "crc": 0}
                    for s in streams],
                   rng=rng, idle=IDLE)
        state["started"] = True
        done = set(early)
        while len(done) < len(streams):
            for s in streams:
                if s.conn not in done and startup_seen(s.conn):
                    done.add(s.conn)
                    assert s.command() is None      # nothing held: no release
                    await command(ctx, s)
                    allowed[s.conn] = True
            await ctx.tick()

    return sender, host, expected, state


def gather_run(n, streams, rng, *, early=(), never=()):
    """Run the streams through a FrameGather; return (expected, got) release lists."""
    dut = FrameGather(n, conns=CONNS, ring_bytes=RING, max_chunk=CHUNK)
    got = []

    def startup_seen(conn):
        return any(g[0] == conn and g[1] == ReleaseKind.STARTUP for g in got)

    sender, host, expected, state = drivers(n, dut, streams, rng, startup_seen, early=early,
                                            never=never)

    async def receiver(ctx):
        bus = AmaranthBus(ctx)
        while not state["sent"] or len(got) < len(expected):
            [header] = await recv(bus, StreamPort.amaranth(dut.o_header), 1, rng=rng,
                                  stall=STALL, timeout=20_000)
            [octets] = await recv_packets(bus, StreamPort.amaranth(dut.o), 1, n, rng=rng,
                                          stall=STALL)
            assert header["length"] == len(octets)
            got.append(released(header, octets))

    run(dut, sender, host, receiver, name=f"mpa_gather_w{n}")
    return expected, got


def released(header, octets):
    """A release as the oracle writes it: (conn, kind, position, octets, markers, crc, first)."""
    return (header["conn"], ReleaseKind(header["kind"]), header["position"], bytes(octets),
            header["markers"], header["crc"], header["first"])


def check(expected, got):
    assert len(got) == len(expected), f"{len(got)} releases, {len(expected)} expected"
    for k, (e, g) in enumerate(zip(expected, got)):
        assert g[:2] == e[:2], f"release {k}: {g[:2]} != {e[:2]}"
        assert g[3] == e[3], f"release {k} (conn {e[0]}, {e[1]}): octets differ, " \
                             f"{len(g[3])} != {len(e[3])}"
        if e[1] != ReleaseKind.STARTUP:
            assert g[2] == e[2], f"release {k}: position {g[2]} != {e[2]}"
        assert g[4:] == e[4:], f"release {k} (conn {e[0]}, {e[1]}): markers, crc, first " \
                               f"{g[4:]} != {e[4:]}"


@pytest.mark.parametrize("n", WIDTHS)
def test_random_streams(n):
    """Several connections at once: every release matches the oracle's."""
    rng = random.Random(500 + n)
    fpdus = 6 if n == 1 else 40
    streams = [build(rng, c, fpdus) for c in range(CONNS)]
    expected, got = gather_run(n, streams, rng)
    check(expected, got)
    assert sorted(g[0] for g in got if g[6]) == list(range(CONNS))    # one first piece each


@pytest.mark.parametrize("n", WIDTHS)
def test_framing_lost(n):
    """An over-long ULPDU_Length on one connection and early octets on another: from there on
    their octets are released as they come, the third connection's frames as before."""
    rng = random.Random(600 + n)
    fpdus = 5 if n == 1 else 20
    streams = [build(rng, 0, fpdus, oversize_at=3), build(rng, 1, fpdus, markers=False),
               build(rng, 2, fpdus)]
    expected, got = gather_run(n, streams, rng, early={1}, never={1})
    check(expected, got)
    kinds = {(g[0], g[1]) for g in got}
    assert (1, ReleaseKind.EARLY) in kinds
    assert sorted(g[0] for g in got if g[6]) == [0, 2]     # no FPDUS command, no first piece


@pytest.mark.parametrize("n", WIDTHS)
def test_fpdus_before_fpdu_mode(n):
    """Peers that send FPDUs right behind their startup frame, in its last segment or after it,
    before this end has set FPDU mode: without markers, the FPDUs wait in the ring and the
    FPDUS command releases them as the first FPDUS piece; with markers (framed wrongly while
    held), as EARLY, as does everything after."""
    rng = random.Random(900 + n)
    fpdus = 6 if n == 1 else 25
    streams = [build(rng, 0, fpdus, markers=False), build(rng, 1, fpdus, markers=False),
               build(rng, 2, fpdus, markers=True)]
    expected, got = gather_run(n, streams, rng, early={0, 1, 2})
    check(expected, got)
    kinds = {c: {g[1] for g in got if g[0] == c} for c in range(CONNS)}
    for c in (0, 1):
        assert kinds[c] == {ReleaseKind.STARTUP, ReleaseKind.FPDUS}, f"connection {c}"
        assert b"".join(g[3] for g in got if g[0] == c) == streams[c].octets
    assert ReleaseKind.EARLY in kinds[2] and ReleaseKind.FPDUS not in kinds[2]
    assert streams[0].held_out and streams[1].held_out     # the commands released FPDUs


@pytest.mark.parametrize("n", WIDTHS)
def test_slot_reuse(n):
    """One slot, a small ring (1 KiB, chunks up to 300 octets) and a slow reader: connection
    after connection is started on it, each cut off inside its largest frame. Every connection's
    releases match the oracle's (its first FPDUS piece marked first again, with its own markers
    and CRC setting), and the octets its predecessor left unreleased do not take its room (with
    them, its 532-octet startup frame would not fit)."""
    rng = random.Random(700 + n)
    ring, chunk = 1024, 300
    dut = FrameGather(n, conns=2, ring_bytes=ring, max_chunk=chunk)
    largest = dut.max_ulpdu
    rounds = [build(rng, 1, 3 if n == 1 else 8, largest=largest, big=True) for _ in range(6)]
    for s in rounds:
        s.ring, s.chunk = ring, chunk
    expected, got = [], []

    async def bench(ctx):
        bus = AmaranthBus(ctx)
        cmd, header = StreamPort.amaranth(dut.i_cmd), StreamPort.amaranth(dut.i_header)
        for s in rounds:
            await send(bus, cmd, [{"op": GatherOp.START.value, "conn": 1, "markers": 0,
                                   "crc": 0}])
            startup, fpdus = chunks_of(rng, s, n, chunk)
            # Cut off inside the last frame.
            while fpdus and fpdus[-1][1] > s.ends[-2]:
                fpdus.pop()
            lo = fpdus[-1][1] if fpdus else len(s.startup)
            fpdus += [(k, min(k + chunk, s.ends[-1] - 1)) for k in range(lo, s.ends[-1] - 1, chunk)]
            for k, (lo, hi) in enumerate(startup + fpdus):
                if k == len(startup):
                    while len(got) < len(expected):
                        await ctx.tick()
                    assert s.command() is None
                    await send(bus, cmd, [{"op": GatherOp.FPDUS.value, "conn": 1,
                                           "markers": int(s.markers), "crc": int(s.crc)}])
                s.delivered = hi
                piece = s.piece()
                if piece:
                    expected.append(piece)
                await send(bus, header, [{"conn": 1, "length": hi - lo}], rng=rng, idle=IDLE)
                await send_packets(bus, StreamPort.amaranth(dut.i), [bytes(s.octets[lo:hi])],
                                   n, rng=rng, idle=IDLE)
        while len(got) < len(expected):
            await ctx.tick()

    async def receiver(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [header] = await recv(bus, StreamPort.amaranth(dut.o_header), 1, rng=rng,
                                  stall=0.8, timeout=10**9)
            [octets] = await recv_packets(bus, StreamPort.amaranth(dut.o), 1, n, rng=rng,
                                          stall=0.8)
            got.append(released(header, octets))

    run(dut, bench, monitors=[receiver], name=f"mpa_gather_reuse_w{n}")
    check(expected, got)
    assert sum(g[6] for g in got) == len(rounds)    # each START then FPDUS: a first piece again
    assert sum(len(s.octets) for s in rounds) > 4 * ring


def test_parameters():
    assert max_frame_ulpdu(4096, 1460) == FrameGather(8).max_ulpdu
    with pytest.raises(ValueError, match="ring_bytes"):
        FrameGather(8, ring_bytes=1024)
    with pytest.raises(ValueError, match="max_chunk"):
        FrameGather(8, max_chunk=0)


# MpaReceiver: the gather and the several-connection deframer behind it.

KIND = {CrcError: ErrorKind.CRC, MarkerError: ErrorKind.MARKER, OversizeError: ErrorKind.LENGTH}


def deframed(s, max_ulpdu):
    """What the model's Deframer makes of a connection's FPDUs: its packets (the ULPDU behind its
    length field, and ``None`` for a bad FPDU's, which ends with ``err``) and its error."""
    deframer = Deframer(crc=s.crc, markers=s.markers, max_ulpdu=max_ulpdu)
    try:
        ulpdus, kind = deframer.feed(bytes(s.octets[len(s.startup):])), None
    except (CrcError, MarkerError, OversizeError) as error:
        ulpdus, kind = list(error.delivered), KIND[type(error)]
    packets = [len(u).to_bytes(2, "big") + u for u in ulpdus]
    return packets + ([None] if kind is not None else []), kind


@pytest.mark.parametrize("n", WIDTHS)
def test_receiver(n):
    """Three connections through MpaReceiver: the host gets each startup frame and answers it;
    each connection's ULPDUs are the model Deframer's of its stream, one connection failing
    on an over-long length and one on a bad CRC while the third runs to its end."""
    rng = random.Random(800 + n)
    fpdus = 5 if n == 1 else 25
    streams = [build(rng, 0, fpdus, oversize_at=fpdus // 2), build(rng, 1, fpdus, crc=True),
               build(rng, 2, fpdus)]
    bad = streams[1].ends[1 + fpdus // 3]       # a CRC field's last octet, spoiled
    streams[1].octets[bad - 1] ^= 0x10
    dut = MpaReceiver(n, conns=CONNS, ring_bytes=RING, max_chunk=CHUNK)
    startups, packets, events = {}, [], []
    sender, host, _, state = drivers(n, dut, streams, rng, lambda c: c in startups)

    async def startup_reader(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [header] = await recv(bus, StreamPort.amaranth(dut.o_startup_header), 1,
                                  timeout=10**9)
            [octets] = await recv_packets(bus, StreamPort.amaranth(dut.o_startup), 1, n)
            startups[header["conn"]] = (ReleaseKind(header["kind"]), bytes(octets))

    async def reader(ctx):
        bus = AmaranthBus(ctx)
        while True:
            beats = await recv(bus, StreamPort.amaranth(dut.o), 1, packets=True, rng=rng,
                               stall=STALL, timeout=10**9)
            packets.extend(from_tagged_beats(beats, n))

    async def errors(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [event] = await recv(bus, StreamPort.amaranth(dut.o_error), 1, rng=rng,
                                 stall=STALL, timeout=10**9)
            events.append((event["conn"], ErrorKind(event["kind"])))

    async def bench(ctx):
        while not state["sent"]:
            await ctx.tick()
        # Longer than a failed connection's chunk takes to be thrown away at one octet a cycle.
        await until_quiet(ctx, [dut.o, dut.o_error, dut.o_startup], 2 * CHUNK)

    run(dut, sender, host, bench, monitors=[startup_reader, reader, errors],
        name=f"mpa_receiver_w{n}")
    kinds = {}
    for s in streams:
        assert startups[s.conn] == (ReleaseKind.STARTUP, s.startup), f"connection {s.conn}"
        want, kinds[s.conn] = deframed(s, dut.max_ulpdu)
        mine = [p for c, p in packets if c == s.conn]
        assert len(mine) == len(want), f"connection {s.conn}: {len(mine)} != {len(want)}"
        for k, (got, octets) in enumerate(zip(mine, want)):
            assert got.err == (octets is None), f"connection {s.conn}, packet {k}"
            assert octets is None or bytes(got) == octets, f"connection {s.conn}, packet {k}"
    assert kinds == {0: ErrorKind.LENGTH, 1: ErrorKind.CRC, 2: None}
    assert sorted(events) == [(0, ErrorKind.LENGTH), (1, ErrorKind.CRC)]

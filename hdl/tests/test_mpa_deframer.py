# amaranth: UnusedElaboratable=no
"""FpduDeframer against the model's Deframer, at widths 1, 8 and 64.

Each test frames random ULPDUs with the model's ``Framer`` (CRC and markers on or off; lengths
0 to a few KiB, around the 512-byte marker period, and 16 KiB at the wider widths), cuts the
stream into random chunks and feeds it with random idles and stalls. The model's ``Deframer``
fed the same stream is the oracle: the DUT must give exactly its ULPDUs (each behind its
ULPDU_Length field), then, when the model raised, one error event of the same kind and nothing
after it. Errors are made on purpose (a CRC field, a marker's FPDUPTR, a ULPDU_Length above
``max_ulpdu``) and at random (any octet of the stream changed).

The test marked ``tshark`` takes Wireshark's dissectors as the oracle of the gateware framer's
FPDUs (RDMAP segments of every opcode, CRC on, behind an MPA Request and Reply in a pcap), then
deframes that stream.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_model.capture import StreamCapture
from iwarp_model.wire.ddp import TAGGED_HEADER_SIZE
from iwarp_model.wire.errors import CrcError, MarkerError, OversizeError
from iwarp_model.wire.fpdu import MARKER_INTERVAL, Deframer, Framer
from iwarp_model.wire.mpa import MpaFrame
from iwarp_model.wire.rdmap import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    ReadRequest,
    Segment,
)
from iwarp_model.wire.terminate import ErrorCode, Terminate
from iwarp_nic.mpa import ErrorKind, FpduDeframer, FpduFramer, ReleaseKind
from iwarp_nic.mpa.gather import max_frame_ulpdu
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import from_tagged_beats
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets
from iwarp_tb.tshark import check_fpdus

IDLE = STALL = 0.3
KIND = {CrcError: ErrorKind.CRC, MarkerError: ErrorKind.MARKER, OversizeError: ErrorKind.LENGTH}


def frame_stream(rng, lengths, *, crc, markers):
    """The stream of FPDUs for random ULPDUs of ``lengths``, and each FPDU's (start, end)."""
    framer = Framer(crc=crc, markers=markers)
    stream, spans = bytearray(), []
    for length in lengths:
        start = framer.position
        stream += framer.frame(rng.randbytes(length))
        spans.append((start, framer.position))
    return stream, spans


def chunks(rng, stream, longest):
    """The stream cut into packets of 1 to ``longest`` octets."""
    out, at = [], 0
    while at < len(stream):
        size = rng.randint(1, longest)
        out.append(bytes(stream[at:at + size]))
        at += size
    return out


def oracle(stream, *, crc, markers, max_ulpdu):
    """The model's ULPDUs for ``stream`` and the kind of error it raised (or None)."""
    deframer = Deframer(crc=crc, markers=markers, max_ulpdu=max_ulpdu)
    try:
        return deframer.feed(bytes(stream)), None
    except (CrcError, MarkerError, OversizeError) as error:
        return list(error.delivered), KIND[type(error)]


def simulate(n, stream, *, crc, markers, max_ulpdu, expect_packets, expect_event, seed,
             idle=IDLE, stall=STALL, longest=None):
    """Feed ``stream`` in random chunks; return the packets, the error events and whatever
    complete packet came after the expected ones."""
    dut = FpduDeframer(n)
    rng = random.Random(seed)
    got = {"events": [], "extra": []}
    done = []
    pieces = chunks(rng, stream, longest or 3 * n + 5)

    async def source(ctx):
        ctx.set(dut.crc, crc)
        ctx.set(dut.markers, markers)
        ctx.set(dut.max_ulpdu, max_ulpdu)
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), pieces, n,
                           rng=random.Random(seed + 1), idle=idle, timeout=5000)
        done.append("source")

    async def sink(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(dut.o)
        got["packets"] = await recv_packets(bus, port, expect_packets, n,
                                            rng=random.Random(seed + 2), stall=stall,
                                            timeout=5000)
        # A stream cut mid-FPDU leaves beats, but no complete packet may come.
        got["extra"] = await trailing_packets(ctx, dut, done)

    run(dut, source, sink, error_monitor(dut, got, done, seed + 3, stall, ErrorKind),
        name=f"mpa_deframer_w{n}")
    return got["packets"], got["events"], got["extra"]


async def trailing_packets(ctx, dut, done):
    """After the expected packets, take whatever ``dut.o`` offers until the input is all
    taken and 400 cycles more; return the ``err`` of every packet end seen."""
    ctx.set(dut.o.ready, 1)
    ends, quiet = [], 0
    while quiet < 400:
        quiet = quiet + 1 if "source" in done else 0
        valid, last, err = (await ctx.tick().sample(dut.o.valid, dut.o.payload.last,
                                                    dut.o.payload.err))[2:]
        if valid and last:
            ends.append(err)
    done.append("sink")
    return ends


def error_monitor(dut, got, done, seed, stall, decode):
    """A testbench taking ``dut.o_error``'s events, with random stalls, into ``got["events"]``
    (each through ``decode``) until the sink is done."""
    async def events(ctx):
        stalls = random.Random(seed)
        while "sink" not in done:
            ready = stalls.random() >= stall
            ctx.set(dut.o_error.ready, ready)
            valid, event = (await ctx.tick().sample(dut.o_error.valid, dut.o_error.payload))[2:]
            if valid and ready:
                got["events"].append(decode(event))
    return events


def check(n, stream, *, crc, markers, max_ulpdu=0xFFFF, seed=0, **kw):
    ulpdus, kind = oracle(stream, crc=crc, markers=markers, max_ulpdu=max_ulpdu)
    packets, events, extra = simulate(
        n, stream, crc=crc, markers=markers, max_ulpdu=max_ulpdu,
        expect_packets=len(ulpdus) + (kind is not None), expect_event=kind, seed=seed, **kw)
    for k, ulpdu in enumerate(ulpdus):
        assert bytes(packets[k]) == len(ulpdu).to_bytes(2, "big") + ulpdu, f"ULPDU {k}"
        assert not packets[k].err, f"ULPDU {k}"
    if kind is not None:
        assert packets[-1].err, "the bad FPDU's packet must end with err"
    if kind is ErrorKind.LENGTH:
        assert len(packets[-1]) == 1, "an oversize FPDU's packet is one octet"
    assert events == ([kind] if kind else []), events
    assert extra == [], "a packet after the expected ones"
    return ulpdus, kind


def random_lengths(rng, count, longest, big=()):
    lengths = [0, 1, 2, 3, 4, 5, 506, 507, 508, 509, 510, 511, 512, 1018]
    lengths += [rng.randint(0, longest) for _ in range(count)]
    rng.shuffle(lengths)
    return lengths + list(big)


WIDTHS = [(1, 12, 600, ()), (8, 30, 2000, (16384,)), (64, 40, 4000, (16384, 9000))]


@pytest.mark.parametrize("crc, markers", [(True, True), (True, False), (False, True),
                                          (False, False)])
@pytest.mark.parametrize("n, count, longest, big", WIDTHS)
def test_against_model(n, count, longest, big, crc, markers):
    rng = random.Random(n * 4 + 2 * crc + markers)
    stream, _ = frame_stream(rng, random_lengths(rng, count, longest, big), crc=crc,
                             markers=markers)
    ulpdus, kind = check(n, stream, crc=crc, markers=markers, seed=n)
    assert kind is None and len(ulpdus) == count + 14 + len(big)


def pads_at_markers(rng, n, count):
    """ULPDU lengths whose FPDUs end their pad right before a marker (which the CRC then
    covers), that marker ``D`` octets after the FPDU's start for ``D`` of one, two and three
    core beats and a word more; a filler FPDU before each brings the stream there."""
    core = max(n, 4)
    lengths, position = [], 0
    for _ in range(count):
        distance = rng.choice([core, 2 * core, 3 * core, core + 4, 2 * core + 4])
        for filler in range(1200):
            end = Framer(crc=True, markers=True, position=position)
            end.frame(bytes(filler))
            if end.position % 512 == -distance % 512:
                break
        lengths += [filler, distance - 2]
        framer = Framer(crc=True, markers=True, position=end.position)
        framer.frame(bytes(lengths[-1]))
        position = framer.position
    return lengths


@pytest.mark.parametrize("n", [1, 8, 64])
def test_pad_ends_at_marker(n):
    """A marker right after the pad, at the first lane of a beat: the CRC covers it, so the
    beat before is not the FPDU's last (found by the RX chain benchmark)."""
    rng = random.Random(80 + n)
    stream, _ = frame_stream(rng, pads_at_markers(rng, n, 12), crc=True, markers=True)
    ulpdus, kind = check(n, stream, crc=True, markers=True, seed=n)
    assert kind is None and len(ulpdus) == 24


@pytest.mark.parametrize("n", [1, 8, 64])
def test_full_rate(n):
    """Back to back, no idle input and no stalled output; one-octet and whole-stream chunks."""
    rng = random.Random(7 * n)
    stream, _ = frame_stream(rng, random_lengths(rng, 10, 1500), crc=True, markers=True)
    check(n, stream, crc=True, markers=True, idle=0, stall=0, seed=n)
    check(n, stream, crc=True, markers=True, idle=0, stall=0, seed=n, longest=len(stream))


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("fault", ["crc", "marker", "length"])
def test_error(n, fault):
    """A bad CRC field, a bad FPDUPTR or a ULPDU_Length over ``max_ulpdu`` in FPDU ``k``: the
    model's ULPDUs before it, the error event, nothing after."""
    for trial in range(3):
        rng = random.Random(1000 * n + 10 * trial + len(fault))
        lengths = [rng.randint(0, 1300) for _ in range(8)]
        crc = fault != "marker"        # the CRC covers the markers: it would fail first
        stream, spans = frame_stream(rng, lengths, crc=crc, markers=True)
        max_ulpdu = 0xFFFF
        if fault == "crc":
            k = rng.randrange(len(spans))
            stream[spans[k][1] - 1 - rng.randrange(4)] ^= 1 << rng.randrange(8)
        elif fault == "marker":
            at = rng.choice([at for at in range(0, len(stream), MARKER_INTERVAL)])
            stream[at + 2 + rng.randrange(2)] ^= 1 << rng.randrange(8)
            if stream[at + 3] & 3:         # a low bit, which the receiver ignores: no error
                stream[at + 3] ^= 4
        else:
            k = rng.randrange(1, len(spans))
            lengths[k] = max(lengths[k], max(lengths[:k]) + 1)
            stream, spans = frame_stream(random.Random(trial), lengths, crc=crc, markers=True)
            max_ulpdu = rng.randint(max(lengths[:k]), lengths[k] - 1)
        _, kind = check(n, stream, crc=crc, markers=True, max_ulpdu=max_ulpdu, seed=n + trial)
        assert kind == {"crc": ErrorKind.CRC, "marker": ErrorKind.MARKER,
                        "length": ErrorKind.LENGTH}[fault]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_random_corruption(n):
    """Any octet of the stream changed: whatever the model makes of it, so must the DUT."""
    for trial in range(6):
        rng = random.Random(5000 * n + trial)
        crc, markers = rng.random() < 0.7, rng.random() < 0.7
        stream, _ = frame_stream(rng, [rng.randint(0, 900) for _ in range(6)], crc=crc,
                                 markers=markers)
        stream[rng.randrange(len(stream))] ^= rng.randrange(1, 256)
        check(n, stream, crc=crc, markers=markers, seed=trial)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_garbage(n):
    """Streams of random octets (random lengths, mostly oversize or failing their CRC): the
    model's verdict, no hang; with a small ``max_ulpdu`` too."""
    for trial in range(8):
        rng = random.Random(9000 * n + trial)
        crc, markers = bool(trial & 1), bool(trial & 2)
        stream = rng.randbytes(rng.randint(1, 3000))
        check(n, stream, crc=crc, markers=markers, max_ulpdu=rng.choice([0xFFFF, 600]),
              seed=trial)


def segments(rng):
    """RDMAP segments of every opcode as the model encodes them: those with a payload at 0, 1
    and 1300 octets."""
    out = []
    for opcode in Opcode:
        kw = {}
        if opcode in (Opcode.WRITE, Opcode.READ_RESPONSE):
            kw = {"stag": rng.getrandbits(32), "to": rng.getrandbits(64)}
        elif opcode in (Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE):
            kw = {"inv_stag": rng.getrandbits(32)}
        offending = Segment(Opcode.WRITE, b"x", stag=1, to=2).encode()[:TAGGED_HEADER_SIZE]
        header = {
            Opcode.READ_REQUEST: ReadRequest(rng.getrandbits(32), rng.getrandbits(64),
                                             rng.randint(0, 1 << 20), rng.getrandbits(32),
                                             rng.getrandbits(64)),
            Opcode.TERMINATE: Terminate.for_error(ErrorCode.RDMAP_INVALID_STAG, offending),
            Opcode.IMMEDIATE_DATA: ImmediateData(rng.randbytes(8)),
            Opcode.IMMEDIATE_DATA_SE: ImmediateData(rng.randbytes(8)),
            Opcode.ATOMIC_REQUEST: AtomicRequest.fetch_add(
                rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(61) << 3, 5),
            Opcode.ATOMIC_RESPONSE: AtomicResponse(rng.getrandbits(32), rng.getrandbits(64)),
        }.get(opcode)
        for length in ((0, 1, 1300) if header is None else (0,)):
            out.append(Segment(opcode, rng.randbytes(length), header=header, **kw).encode())
    return out


def framed(n, ulpdus):
    """The gateware framer's FPDUs of ``ulpdus``: CRC on, markers off."""
    dut = FpduFramer(n)
    got = {}

    async def headers(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_header),
                   [{"ulpdu_length": len(u), "crc": 1, "markers": 0, "position": 0}
                    for u in ulpdus])

    async def payloads(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_payload),
                           [u for u in ulpdus if u], n)

    async def fpdus(ctx):
        ctx.set(dut.o_length.ready, 1)
        got["fpdus"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                          len(ulpdus), n)

    run(dut, headers, payloads, fpdus, name=f"mpa_framer_tshark_w{n}")
    return [bytes(p) for p in got["fpdus"]]


@pytest.mark.tshark
@pytest.mark.parametrize("n", [1, 8, 64])
def test_tshark(tmp_path, n):
    """tshark finds each gateware FPDU with ``Good CRC32`` and the RDMAP opcodes as sent; the
    deframer returns the segments from the same stream."""
    ulpdus = segments(random.Random(n))
    fpdus = framed(n, ulpdus)
    path = tmp_path / f"mpa_w{n}.pcap"
    with StreamCapture(path, ("10.0.0.1", 40000), ("10.0.0.2", 5000)) as capture:
        capture.sent(MpaFrame(reply=False, crc=True, revision=1).encode())
        capture.received(MpaFrame(reply=True, crc=True, revision=1).encode())
        for fpdu in fpdus:
            capture.sent(fpdu)
    check_fpdus(path, ulpdus)
    got, kind = check(n, b"".join(fpdus), crc=True, markers=False, seed=n)
    assert kind is None and got == ulpdus


@pytest.mark.parametrize("n", [1, 8, 64])
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "mpa_deframer.v"
    path.write_text(verilog.convert(FpduDeframer(n), name="mpa_deframer"))
    assert lint(path) == ""


# Several connections: the gather's pieces, interleaved.

PIECE_CONNS = 3
PIECE_MAX_ULPDU = max_frame_ulpdu(4096, 1460)


def incarnation(rng, conn, first_piece, fault):
    """One connection's stream of FPDUs (random settings, ``fault`` put in one FPDU), cut into
    pieces as the gather releases them; returns the pieces and, per piece, what the deframer
    must give: ``(conn, packet, err)`` per FPDU and the error event, as the model makes them."""
    crc = fault == "crc" or (fault != "marker" and rng.random() < 0.6)
    markers = fault == "marker" or rng.random() < 0.6
    lengths = [rng.choice([rng.randint(0, 40), rng.randint(0, PIECE_MAX_ULPDU)])
               for _ in range(rng.randint(1, 12))]
    stream, spans = frame_stream(rng, lengths, crc=crc, markers=markers)
    bad = rng.randrange(len(spans))
    start, end = spans[bad]
    if fault == "crc":
        stream[end - 1 - rng.randrange(4)] ^= 1 << rng.randrange(8)
    elif fault == "marker":
        at = rng.choice(range(0, len(stream), MARKER_INTERVAL))
        stream[at + 3] ^= 4 << rng.randrange(6)     # FPDUPTR's low octet, not its low two bits
        bad = max(k for k, (lo, _) in enumerate(spans) if lo <= at)
    elif fault == "length":
        field = start + (4 if markers and start % MARKER_INTERVAL == 0 else 0)
        stream[field:field + 2] = rng.randint(PIECE_MAX_ULPDU + 1, 0xFFFF).to_bytes(2, "big")
    ulpdus, kind = oracle(stream, crc=crc, markers=markers, max_ulpdu=PIECE_MAX_ULPDU)
    assert kind == KIND.get({"crc": CrcError, "marker": MarkerError,
                             "length": OversizeError}.get(fault)), (fault, kind)
    if kind is None:
        bad = len(spans)
    assert len(ulpdus) == bad
    # Pieces of whole FPDUs; after an over-long length, of the octets as they come.
    bounds = [0]
    while bounds[-1] < len(stream):
        k = next(k for k, (lo, _) in enumerate(spans) if lo == bounds[-1])
        if kind is ErrorKind.LENGTH and k >= bad:
            bounds.append(min(len(stream), bounds[-1] + rng.randint(1, 1500)))
            spans.append((bounds[-1], None))
        else:
            bounds.append(spans[min(len(spans), k + rng.randint(1, 3)) - 1][1])
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        header = {"conn": conn, "length": hi - lo, "kind": ReleaseKind.FPDUS.value,
                  "position": lo % MARKER_INTERVAL, "markers": int(markers), "crc": int(crc),
                  "first": int(first_piece and lo == 0)}
        expect, events = [], []
        for k, (s, e) in enumerate(spans[:len(ulpdus) + 1]):
            if e is None or not lo <= s < hi:
                continue
            if k < len(ulpdus):
                expect.append((conn, len(ulpdus[k]).to_bytes(2, "big") + ulpdus[k], False))
            elif kind is not None:
                expect.append((conn, None, True))
                events.append((conn, kind))
        pieces.append((header, bytes(stream[lo:hi]), expect, events))
    return pieces


def simulate_pieces(n, pieces, *, seed, idle=IDLE, stall=STALL):
    """Feed the pieces in order; return the packets as ``(conn, octets, err)``, the error
    events as ``(conn, kind)``, and the packets that came after the expected ones."""
    dut = FpduDeframer(n, conns=PIECE_CONNS, max_ulpdu=PIECE_MAX_ULPDU)
    expected = sum(len(p[2]) for p in pieces)
    got = {"events": []}
    done = []

    async def headers(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_piece), [p[0] for p in pieces],
                   rng=random.Random(seed), idle=idle, timeout=20000)

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), [p[1] for p in pieces],
                           n, rng=random.Random(seed + 1), idle=idle, timeout=20000)
        done.append("source")

    async def sink(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(dut.o)
        beats = await recv(bus, port, expected, packets=True, rng=random.Random(seed + 2),
                           stall=stall, timeout=20000)
        got["packets"] = [(c, bytes(p), p.err) for c, p in from_tagged_beats(beats, n)]
        got["extra"] = await trailing_packets(ctx, dut, done)

    run(dut, headers, source, sink,
        error_monitor(dut, got, done, seed + 3, stall,
                      lambda event: (event.conn, ErrorKind(event.kind))),
        name=f"mpa_deframer_pieces_w{n}")
    return got["packets"], got["events"], got["extra"]


def interleave(rng, per_conn):
    """The pieces of every connection merged at random, each connection's in its order."""
    queues = [list(q) for q in per_conn if q]
    out = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


@pytest.mark.parametrize("n", [1, 8, 64])
def test_pieces(n):
    """Three connections' pieces interleaved, each connection a slot used twice (its second
    stream starting with ``first``); CRC, marker and length faults in some streams: every
    connection gets the model's ULPDUs and error of its own stream, in the pieces' order, and
    a failed connection stops only itself until its next stream. Each trial places the three
    faults anew; at one octet a beat two trials (of four) for CI time."""
    for trial in range(2 if n == 1 else 4):
        rng = random.Random(40 + 100 * n + trial)
        faults = [None, None, "crc", "marker", "length", None]
        rng.shuffle(faults)
        per_conn = [incarnation(rng, c, True, faults[2 * c])
                    + incarnation(rng, c, True, faults[2 * c + 1]) for c in range(PIECE_CONNS)]
        pieces = interleave(rng, per_conn)
        packets, events, extra = simulate_pieces(n, pieces, seed=n + trial)
        expect = [e for p in pieces for e in p[2]]
        assert len(packets) == len(expect)
        for k, ((conn, octets, err), (c, want, bad)) in enumerate(zip(packets, expect)):
            assert (conn, err) == (c, bad), f"packet {k}"
            if want is not None:
                assert octets == want, f"packet {k} of connection {c}"
        assert events == [e for p in pieces for e in p[3]]
        assert extra == [], "a packet after the expected ones"

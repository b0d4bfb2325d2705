# amaranth: UnusedElaboratable=no
"""FpduFramer against the model's Framer, bit-exact, at widths 1, 8 and 64; short FPDUs at all.

Each FPDU is a random request (ULPDU length, CRC on or off, markers on or off, a stream position
chosen so that a marker lands before the length field, among the ULPDU's words, right after the
pad or right after the CRC, or anywhere) and its output packet must be exactly
``iwarp_model.wire.fpdu.Framer(...).frame(ulpdu)``, its ``o_length`` exactly the model's
``wire_length``; random idle cycles on both inputs and stalls on both outputs. Payloads of the
wrong length must give the model's FPDU of the truncated or zero-filled ULPDU with ``err``, and
leave the FPDUs after them intact. Then the sustained rate on 4 KiB FPDUs, the latency, the
Verilog lint.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_model.wire.fpdu import Framer, fpdu_length, pad_length, wire_length
from iwarp_nic.mpa import FpduFramer
from iwarp_nic.stream import DATA_BYTES
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import to_beats
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.3


def expected(request, payload):
    """The model's FPDU for ``request`` whose payload packet was ``payload`` (of any length),
    and whether the framer must flag it."""
    length = request["ulpdu_length"]
    ulpdu = (payload + bytes(length))[:length]
    framer = Framer(crc=bool(request["crc"]), markers=bool(request["markers"]),
                    position=request["position"] & ~3)   # the framer ignores the low bits
    return framer.frame(ulpdu), len(payload) != length


def position_for(rng, length):
    """A stream position (multiple of 4) putting a 512-byte boundary at an interesting place of
    an FPDU of ``length`` ULPDU bytes (offsets without markers, close enough to aim)."""
    body = 2 + length + pad_length(length)              # length field, ULPDU, pad
    offset = rng.choice([
        0,                                              # a leading marker
        4,                                              # right after the length field's word
        4 * rng.randrange(1, body // 4 + 1),            # after any word of the body
        body,                                           # right after the pad (CRC-covered)
        body - 4,                                       # before the pad's word
        fpdu_length(length),                            # right after the CRC: the next FPDU's
        rng.randrange(0, 512, 4),                       # anywhere
        508, 4 * rng.randrange(125, 128),               # positions 508 and around
    ])
    return -offset % 512


def random_fpdus(rng, count, longest, *, big=()):
    """``count`` random requests with payloads; the short lengths 0..5 and the lengths around
    512-byte boundaries come first, then random ones up to ``longest``, then ``big``."""
    lengths = [0, 1, 2, 3, 4, 5, 506, 507, 508, 509, 510, 511, 512, 1018, 1022, 1024]
    lengths += [rng.randint(0, longest) for _ in range(count - len(lengths))]
    lengths = [x for x in lengths if x <= longest] + list(big)
    fpdus = []
    for k, length in enumerate(lengths):
        request = {"ulpdu_length": length, "crc": rng.random() < 0.6,
                   "markers": rng.random() < 0.7, "position": 0}
        # Positions are multiples of 4; some requests carry junk in the two low bits (509..511
        # for 508), which the framer must ignore.
        request["position"] = position_for(rng, length) | (rng.randrange(4) if k % 4 == 3 else 0)
        fpdus.append((request, rng.randbytes(length)))
    return fpdus


def simulate(n, fpdus, *, seed, idle=IDLE, stall=STALL, timeout=20_000):
    """Send the requests and payloads (a payload of 0 bytes sends no packet); return the output
    packets and the ``o_length`` values."""
    dut = FpduFramer(n)
    got = {}
    rng_of = (lambda k: random.Random(seed * 10 + k)) if idle or stall else (lambda k: None)

    async def headers(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_header),
                   [req for req, _ in fpdus], rng=rng_of(1), idle=idle,
                   timeout=timeout)

    async def payloads(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_payload),
                           [p for _, p in fpdus if p], n, rng=rng_of(2), idle=idle,
                           timeout=timeout)

    async def packets(ctx):
        got["packets"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                            len(fpdus), n, rng=rng_of(3), stall=stall,
                                            timeout=timeout)

    async def lengths(ctx):
        transfers = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_length), len(fpdus),
                               rng=rng_of(4), stall=stall, timeout=timeout)
        got["lengths"] = [t["data"] for t in transfers]

    run(dut, headers, payloads, packets, lengths, name=f"mpa_framer_w{n}")
    return got["packets"], got["lengths"]


def check(fpdus, packets, lengths):
    assert len(packets) == len(fpdus)
    for k, ((request, payload), packet, length) in enumerate(zip(fpdus, packets, lengths)):
        frame, err = expected(request, payload)
        what = f"FPDU {k}: {request}, payload of {len(payload)} bytes"
        assert bytes(packet) == frame, what
        assert packet.err == err, what
        assert length == len(frame) == wire_length(
            request["ulpdu_length"], position=request["position"] & ~3,
            markers=bool(request["markers"])), what


@pytest.mark.parametrize("n, count, longest, big", [
    (1, 40, 1100, ()),
    (8, 60, 3000, (16384, 9000)),
    (64, 80, 4000, (16384, 12000, 16380)),
])
def test_against_model(n, count, longest, big):
    rng = random.Random(n)
    fpdus = random_fpdus(rng, count, longest, big=big)
    packets, lengths = simulate(n, fpdus, seed=n)
    check(fpdus, packets, lengths)


@pytest.mark.parametrize("idle, stall", [(IDLE, STALL), (0, 0), (0, 0.8)],
                         ids=["random", "full_rate", "stalled"])
@pytest.mark.parametrize("n", DATA_BYTES)
def test_every_position(n, idle, stall):
    """Short FPDUs at every position a marker can take relative to them, markers and CRC on:
    with random idles and stalls, back to back at full rate, and into a mostly stalled output
    (the CRC FIFO and the CRC engine's output full)."""
    rng = random.Random(100 + n)
    fpdus = []
    for length in (0, 1, 2, 3, 4, 5, 6, 7, 13):
        for offset in range(0, fpdu_length(length) + 4, 4):
            request = {"ulpdu_length": length, "crc": 1, "markers": 1,
                       "position": -offset % 512}
            fpdus.append((request, rng.randbytes(length)))
    packets, lengths = simulate(n, fpdus, seed=100 + n, idle=idle, stall=stall)
    check(fpdus, packets, lengths)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_wrong_payload_lengths(n):
    """Payloads longer or shorter than ULPDU_Length, among good ones: each bad one gives the
    FPDU of its truncated or zero-filled ULPDU with err, the good ones are untouched."""
    rng = random.Random(200 + n)
    fpdus = []
    for k in range(40):
        length = rng.choice([1, 2, 3, 5, rng.randint(1, 300), rng.randint(500, 1100)])
        kind = k % 3
        if kind == 1:       # longer: by a byte, by a beat or more
            payload = rng.randbytes(length + rng.choice([1, 2, n, 3 * n + 1]))
        elif kind == 2 and length > 1:   # shorter (a packet has at least one byte)
            payload = rng.randbytes(rng.randint(1, length - 1))
        else:
            payload = rng.randbytes(length)
        request = {"ulpdu_length": length, "crc": rng.random() < 0.7,
                   "markers": rng.random() < 0.7, "position": position_for(rng, length)}
        fpdus.append((request, payload))
    packets, lengths = simulate(n, fpdus, seed=200 + n)
    check(fpdus, packets, lengths)
    assert sum(p.err for p in packets) >= 20


def train(n, count, length):
    """``count`` back-to-back FPDUs of ``length`` bytes, markers and CRC on, at consecutive
    stream positions (as the caller advances them with ``o_length``)."""
    rng = random.Random(300 + n)
    framer = Framer(crc=True, markers=True, position=rng.randrange(0, 512, 4))
    fpdus = []
    for _ in range(count):
        request = {"ulpdu_length": length, "crc": 1, "markers": 1,
                   "position": framer.position % 512}
        payload = rng.randbytes(length)
        framer.frame(payload)
        fpdus.append((request, payload))
    return fpdus


@pytest.mark.parametrize("n, count", [(8, 8), (64, 40)])
def test_throughput(n, count):
    """4 KiB FPDUs back to back, markers and CRC on, inputs always offered and the output always
    ready: output beats per cycle from the first output beat to the last at least 0.99."""
    fpdus = train(n, count, 4096)
    dut = FpduFramer(n)
    got = {}

    async def headers(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_header), [r for r, _ in fpdus])

    async def payloads(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_payload),
                           [p for _, p in fpdus], n)

    async def lengths(ctx):
        await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_length), count)

    async def sink(ctx):
        ctx.set(dut.o.ready, 1)
        beats, cycle, first, packets, current = [], 0, None, [], bytearray()
        while len(packets) < count:
            _, _, valid, data, keep, last, err = await ctx.tick().sample(
                dut.o.valid, dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last,
                dut.o.payload.err)
            if valid:
                first = cycle if first is None else first
                beats.append(cycle)
                current += data.to_bytes(n, "little")[:keep.bit_length()]
                assert not err
                if last:
                    packets.append(bytes(current))
                    current = bytearray()
                    if len(packets) == 1:
                        got["second"] = len(beats)
            cycle += 1
        got["rate"] = len(beats) / (beats[-1] - first + 1)
        rest = beats[got["second"]:]
        got["gaps"] = rest[-1] - rest[0] + 1 - len(rest)
        got["packets"] = packets

    run(dut, headers, payloads, lengths, sink, name=f"mpa_framer_rate_w{n}")
    assert got["packets"] == [expected(r, p)[0] for r, p in fpdus]
    print(f"width {n}: {count} FPDUs of 4096 bytes, {got['rate']:.4f} output beats per cycle, "
          f"{got['gaps']} idle cycles from the second FPDU on")
    assert got["rate"] >= 0.99
    assert got["gaps"] == 0     # only the first FPDU waits for its CRC


@pytest.mark.parametrize("n", [1, 8, 64])
def test_latency(n):
    """Cycles from the header taken by an idle framer (its payload offered with it) to the
    first output beat, FPDUs sent one at a time. One value for each kind of FPDU: with or
    without a leading marker (which needs no payload), and whether its first beat is also the
    last before the CRC (then it waits for the CRC engine)."""
    dut = FpduFramer(n)
    cases = [(100, 1, 0), (37, 0, 4), (3, 1, 508), (5, 1, 0), (1000, 1, 8), (0, 0, 0),
             (200, 1, 0), (300, 0, 100), (1, 1, 4), (0, 1, 0)]
    fpdus = [({"ulpdu_length": length, "crc": 1, "markers": markers, "position": position},
              bytes(k % 251 for k in range(length)))
             for length, markers, position in cases]
    measured = []

    async def testbench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.o_length.ready, 1)
        for request, payload in fpdus:
            for name, value in request.items():
                ctx.set(dut.i_header.payload[name], value)
            ctx.set(dut.i_header.valid, 1)
            beats = to_beats(payload, n) if payload else []
            for name in ("data", "keep", "last"):
                ctx.set(dut.i_payload.payload[name], getattr(beats[0], name) if beats else 0)
            ctx.set(dut.i_payload.valid, bool(payload))
            *_, ready, in_ready = await ctx.tick().sample(dut.i_header.ready,
                                                          dut.i_payload.ready)
            assert ready and not in_ready
            ctx.set(dut.i_header.valid, 0)
            cycles, taken, out, frame = 0, 0, bytearray(), expected(request, payload)[0]
            started = None
            while len(out) < len(frame):
                *_, in_ready, valid, data, keep = await ctx.tick().sample(
                    dut.i_payload.ready, dut.o.valid, dut.o.payload.data, dut.o.payload.keep)
                cycles += 1
                if in_ready and taken < len(beats):
                    taken += 1
                    if taken < len(beats):
                        for name in ("data", "keep", "last"):
                            ctx.set(dut.i_payload.payload[name], getattr(beats[taken], name))
                    else:
                        ctx.set(dut.i_payload.valid, 0)
                if valid:
                    started = cycles if started is None else started
                    out += data.to_bytes(n, "little")[:keep.bit_length()]
            measured.append(started)
            assert bytes(out) == frame
            for _ in range(20):
                await ctx.tick()

    run(dut, testbench, name=f"mpa_framer_latency_w{n}")
    kinds = {}
    for cycles, (length, markers, position) in zip(measured, cases):
        one_beat = wire_length(length, position=position, markers=bool(markers)) - 4 <= n
        kinds.setdefault((bool(markers and not position), one_beat), set()).add(cycles)
    print(f"width {n}: cycles to the first beat by (leading marker, one beat before the CRC): "
          f"{kinds}")
    assert all(len(values) == 1 for values in kinds.values())


@pytest.mark.parametrize("n", [1, 8, 64])
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "mpa_framer.v"
    path.write_text(verilog.convert(FpduFramer(n), name="mpa_framer"))
    assert lint(path) == ""


def test_parameters():
    for bad in (0, 3, 128, "8"):
        with pytest.raises(ValueError, match="data_bytes"):
            FpduFramer(bad)

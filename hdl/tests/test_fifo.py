# amaranth: UnusedElaboratable=no
"""PacketFifo against a cycle-by-cycle Python model, widths 1, 8 and 64, with random idle,
stall, err and overflow: only whole good packets come out, in order; ``free`` is the memory's
free space at every cycle; the counters match; no bubble on ``o``; the read latency."""

import random

import pytest

from iwarp_nic.fifo import PacketFifo
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, Packet, from_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, send_packets

WIDTHS = (1, 8, 64)


class Model:
    """What the FIFO must hold and deliver, fed with the transfers sampled at each clock edge.

    A beat that arrives while ``free`` reads 0 overflows its packet (with ``overflow="drop"``);
    ``check`` compares ``free`` with the beats the memory must hold: those of the packet being
    written plus committed beats not yet taken from ``o``, less the one in ``o``'s register."""

    def __init__(self, n, depth, overflow):
        self.n, self.depth, self.overflow = n, depth, overflow
        self.current = bytearray()
        self.written = 0
        self.dropping = False
        self.committed = []             # packets expected on o, in order
        self.unread = 0                 # committed beats not yet taken from o
        self.overflows = self.discarded = 0
        self.out = []                   # beats taken from o

    def check(self, free, out_valid):
        assert free % self.n == 0
        assert self.depth - free // self.n == self.written + self.unread - out_valid, \
            f"free {free} with {self.written} written, {self.unread} unread, o {out_valid}"

    def beat_in(self, beat, free):
        if self.dropping:
            self.dropping = not beat.last
        elif beat.last and beat.err:
            self.discarded += 1
            self.current, self.written = bytearray(), 0
        elif free == 0:
            assert self.overflow == "drop", "a beat was taken while full"
            self.overflows += 1
            self.current, self.written = bytearray(), 0
            self.dropping = not beat.last
        else:
            k = beat.keep.bit_length()
            self.current += beat.data.to_bytes(self.n, "little")[:k]
            self.written += 1
            if beat.last:
                self.committed.append(bytes(self.current))
                self.unread += self.written
                self.current, self.written = bytearray(), 0

    def beat_out(self, beat):
        self.out.append(beat)
        self.unread -= 1
        assert self.unread >= 0, "a beat out that was never committed"


def watch(fifo, model, state):
    """Feed ``model`` with every edge's transfers until ``state['done']``."""
    i, o = fifo.i, fifo.o

    async def tb(ctx):
        while not state.get("done"):
            _, _, iv, ir, data, keep, last, err, free, ov, orr, odata, okeep, olast = \
                await ctx.tick().sample(i.valid, i.ready, i.payload.data, i.payload.keep,
                                        i.payload.last, i.payload.err, fifo.free, o.valid,
                                        o.ready, o.payload.data, o.payload.keep, o.payload.last)
            model.check(free, ov)
            if model.overflow == "drop":
                assert ir, "i stalled with overflow='drop'"
            if iv and ir:
                model.beat_in(Beat(data, keep, last, err), free)
            if ov and orr:
                model.beat_out(Beat(odata, okeep, olast))
            state["idle"] = 0 if iv or ov else state.get("idle", 0) + 1
    return tb


def random_packets(rng, n, count, longest):
    return [Packet(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, longest))),
                   rng.random() < 0.2) for _ in range(count)]


def check_fifo(n, depth, overflow, packets, *, idle, stall, seed):
    """Run ``packets`` through the FIFO against the model; compare the output, the counters
    read at the end, and the output with the good packets of the input in order."""
    rng = random.Random(seed)
    fifo = PacketFifo(n, depth, overflow=overflow)
    model = Model(n, depth, overflow)
    state = {}

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(fifo.i), packets, n,
                           rng=random.Random(rng.random()), idle=idle)
        state["sent"] = True

    async def sink(ctx):
        sink_rng = random.Random(rng.random())
        while not state.get("done"):
            ctx.set(fifo.o.ready, sink_rng.random() >= stall)
            await ctx.tick()
            if state.get("sent") and state.get("idle", 0) > 8:
                state["counters"] = (ctx.get(fifo.overflows), ctx.get(fifo.discarded))
                state["done"] = True

    run(fifo, source, sink, watch(fifo, model, state), name=f"fifo_w{n}")
    got = from_beats(model.out, n)
    assert [bytes(p) for p in got] == model.committed
    assert model.unread == 0 and model.written == 0
    assert state["counters"] == (model.overflows, model.discarded)
    good = iter(bytes(p) for p in packets if not p.err)
    assert all(any(p == q for q in good) for p in model.committed), "order or content"
    return model


@pytest.mark.parametrize("n", WIDTHS)
def test_drop(n):
    """Small FIFO, slow consumer: overflows (packets longer than the FIFO included), err."""
    rng = random.Random(10 + n)
    depth = 8
    packets = random_packets(rng, n, 30 if n == 1 else 80, n * depth * 3 // 2)
    model = check_fifo(n, depth, "drop", packets, idle=0.2, stall=0.6, seed=rng.random())
    assert model.overflows and model.discarded and len(model.committed) > len(packets) // 4


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("depth", [5, 16])
def test_stall(n, depth):
    """Packets up to the FIFO's size: every good packet comes out, none overflows."""
    rng = random.Random(20 + n + depth)
    packets = random_packets(rng, n, 30 if n == 1 else 80, n * depth)
    model = check_fifo(n, depth, "stall", packets, idle=0.3, stall=0.5, seed=rng.random())
    assert model.committed == [bytes(p) for p in packets if not p.err]
    assert model.overflows == 0 and model.discarded


@pytest.mark.parametrize("n", WIDTHS)
def test_roomy(n):
    """A FIFO that is never full: nothing but err packets is lost."""
    rng = random.Random(30 + n)
    packets = random_packets(rng, n, 30 if n == 1 else 80, 3 * n + 5)
    model = check_fifo(n, 64, "drop", packets, idle=0.3, stall=0.3, seed=rng.random())
    assert model.committed == [bytes(p) for p in packets if not p.err]


@pytest.mark.parametrize("n", WIDTHS)
def test_back_to_back(n):
    """Packets stored while ``o`` stalls, then ``o`` opened while more arrive at full rate:
    every beat of every packet leaves on consecutive cycles, and ``i`` never stalls."""
    rng = random.Random(40 + n)
    size = 3 * n + 1                                    # 4 beats, the last of one byte
    first = [Packet(bytes(rng.getrandbits(8) for _ in range(size))) for _ in range(4)]
    more = [Packet(bytes(rng.getrandbits(8) for _ in range(size))) for _ in range(8)]
    fifo = PacketFifo(n, 64, overflow="stall")
    beats = (len(first) + len(more)) * 4
    state = {}

    async def source(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(fifo.i)
        await send_packets(bus, port, first, n)
        for _ in range(4):
            await ctx.tick()
        ctx.set(fifo.o.ready, 1)
        state["open"] = True
        await send_packets(bus, port, more, n)

    async def sink(ctx):
        while "open" not in state:
            await ctx.tick()
        got = []
        while len(got) < beats:
            _, _, valid, ready, data, keep, last = await ctx.tick().sample(
                fifo.o.valid, fifo.i.ready, fifo.o.payload.data, fifo.o.payload.keep,
                fifo.o.payload.last)
            assert valid, f"bubble on o after {len(got)} beats"
            assert ready
            got.append(Beat(data, keep, last))
        assert [bytes(p) for p in from_beats(got, n)] == [bytes(p) for p in first + more]

    run(fifo, source, sink, name=f"fifo_b2b_w{n}")


@pytest.mark.parametrize("n", WIDTHS)
def test_latency(n):
    """The first beat is offered two cycles after the last beat of its packet is taken."""
    fifo = PacketFifo(n, 16)
    packet = Packet(bytes(range(2 * n + 1)))

    async def tb(ctx):
        ctx.set(fifo.o.ready, 1)
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(fifo.i)
        await send_packets(bus, port, [packet], n)
        # send_packets returns just after the edge that took the last beat.
        cycles = 1
        while not ctx.get(fifo.o.valid):
            assert cycles < 10
            await ctx.tick()
            cycles += 1
        assert cycles == 2

    run(fifo, tb, name=f"fifo_lat_w{n}")


def test_parameters():
    with pytest.raises(ValueError):
        PacketFifo(3, 8)
    with pytest.raises(ValueError):
        PacketFifo(8, 1)
    with pytest.raises(ValueError):
        PacketFifo(8, 8, overflow="block")

# amaranth: UnusedElaboratable=no
"""TxRing against a bytearray per connection, widths 1, 8 and 64.

A writer appends random chunks to every connection's byte stream at random alignments, from
sequence numbers just below 2**32 (so both the ring and the 32-bit sequence space wrap), while a
reader concurrently fetches random ranges of the bytes already written and not yet released,
with random idle and stall cycles on all four streams; a window per connection keeps the writer
off bytes still to be read, as the engine's control does. Then the throughput of back-to-back
writes and reads, and the Verilog lint.
"""

import random
import subprocess

import pytest
from amaranth.back import verilog

from iwarp_nic.tcp.ring import TxRing
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.3
WIDTHS = (1, 2, 8, 64)  # 2: the ECPIX-5 server's width
CONNS = 3


class Shadow:
    """The oracle: each connection's ring as a bytearray, and the window of its stream.

    ``written[c]``: every byte before it (from ``released[c]`` on) is in the DUT and may be read;
    ``released[c]``: bytes before it will not be read again, so the writer may reuse their place.
    Sequence numbers are kept unwrapped here and reduced modulo 2**32 for the DUT.
    """

    def __init__(self, rng, conns, ring_bytes):
        self.ring_bytes = ring_bytes
        self.rings = [bytearray(ring_bytes) for _ in range(conns)]
        start = [2**32 - rng.randint(1, 3 * ring_bytes) for _ in range(conns)]
        self.written = list(start)
        self.released = list(start)
        self.reading = [[] for _ in range(conns)]   # starts of reads not yet answered

    def store(self, conn, seq, data):
        ring = self.rings[conn]
        for k, byte in enumerate(data):
            ring[(seq + k) % self.ring_bytes] = byte

    def fetch(self, conn, seq, length):
        ring = self.rings[conn]
        return bytes(ring[(seq + k) % self.ring_bytes] for k in range(length))

    def room(self, conn):
        return self.ring_bytes - (self.written[conn] - self.released[conn])


def dut_for(n):
    return TxRing(n, CONNS, 4 * n if n > 1 else 32)


def request(conn, seq, length):
    return {"conn": conn, "seq": seq % 2**32, "length": length}


@pytest.mark.parametrize("n", WIDTHS)
def test_random_against_bytearray(n):
    rng = random.Random(1000 + n)
    dut = dut_for(n)
    shadow = Shadow(rng, CONNS, dut.ring_bytes)
    writes, reads = (60, 80) if n == 1 else (150, 200)
    expected = []                               # (conn, seq, bytes) per read, in order
    state = {"reads_sent": 0}

    def longest(room):
        return min(room, rng.choice([1, n, n + 1, 3 * n + 5, dut.ring_bytes]))

    async def writer(ctx):
        bus = AmaranthBus(ctx)
        for _ in range(writes):
            conn = rng.randrange(CONNS)
            while shadow.room(conn) == 0:
                await ctx.tick()
            length = rng.randint(1, longest(shadow.room(conn)))
            seq = shadow.written[conn]
            data = bytes(rng.getrandbits(8) for _ in range(length))
            shadow.store(conn, seq, data)
            await send(bus, StreamPort.amaranth(dut.i_write), [request(conn, seq, length)],
                       rng=rng, idle=IDLE)
            await send_packets(bus, StreamPort.amaranth(dut.i_data), [data], n, rng=rng,
                               idle=IDLE)
            # The ring reports the write once it is readable: only then may it be read.
            [report] = await recv(bus, StreamPort.amaranth(dut.o_written), 1, rng=rng,
                                  stall=STALL)
            assert report == request(conn, seq + length, length)
            shadow.written[conn] += length
        state["writes_done"] = True

    async def reader(ctx):
        bus = AmaranthBus(ctx)
        for _ in range(reads):
            while True:
                ready = [c for c in range(CONNS) if shadow.written[c] > shadow.released[c]]
                if ready:
                    break
                await ctx.tick()
            conn = rng.choice(ready)
            lo, hi = shadow.released[conn], shadow.written[conn]
            seq = rng.choice([lo, rng.randint(lo, hi - 1)])
            length = rng.randint(1, hi - seq)
            expected.append((conn, seq, shadow.fetch(conn, seq, length)))
            shadow.reading[conn].append(seq)
            await send(bus, StreamPort.amaranth(dut.i_read), [request(conn, seq, length)],
                       rng=rng, idle=IDLE)
            state["reads_sent"] += 1

    async def receiver(ctx):
        bus = AmaranthBus(ctx)
        port = StreamPort.amaranth(dut.o_data)
        for k in range(reads):
            while state["reads_sent"] <= k:
                await ctx.tick()
            [got] = await recv_packets(bus, port, 1, n, rng=rng, stall=STALL)
            conn, seq, data = expected[k]
            assert bytes(got) == data, f"read {k}: conn {conn} seq {seq} length {len(data)}"
            shadow.reading[conn].remove(seq)
            # Release some of what is no longer needed: the writer may now reuse its place.
            limit = min(shadow.reading[conn] + [shadow.written[conn]])
            if rng.random() < 0.7 and limit > shadow.released[conn]:
                shadow.released[conn] = rng.randint(shadow.released[conn], limit)
        # Let the writer finish: whatever is left is released.
        while not state.get("writes_done"):
            for c in range(CONNS):
                shadow.released[c] = shadow.written[c]
            await ctx.tick()

    run(dut, writer, reader, receiver, name=f"tcp_ring_w{n}")
    assert all(w > 2**32 for w in shadow.written), "every stream crossed 2**32"


def read_span(seqs, lengths, n):
    """The cycles from the first to the last output beat of back-to-back reads with no stall.

    The ring reads every word that holds wanted bytes, one per cycle. HeadTrim holds the first
    word of a misaligned read (so the first output comes a cycle later), and a read whose last
    word holds more bytes than the offset it drops ends with a tail beat a cycle after that
    word, which delays the next read's first word when that one is aligned (it passes at once).
    """
    words, gaps, tail = 0, 0, False
    for seq, length in zip(seqs, lengths):
        offset = seq % n
        words += -(-(offset + length) // n)
        gaps += tail and offset == 0
        tail = offset > 0 and (offset + length - 1) % n + 1 > offset
    return words + gaps + tail - (seqs[0] % n > 0)


async def span(ctx, iface, count, out, key):
    """Record in ``out[key]`` the cycles from the first to the ``count``-th transfer of
    ``iface``, both included."""
    cycle, taken, first = 0, 0, None
    while taken < count:
        _, _, valid, ready = await ctx.tick().sample(iface.valid, iface.ready)
        if valid and ready:
            first = cycle if first is None else first
            taken += 1
        cycle += 1
    out[key] = cycle - first


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("n", WIDTHS)
def test_throughput(n, aligned):
    """Writes, then reads of the same ranges, all back to back with no idle or stall. A write
    loses a cycle only after a packet whose last beat spills into a further word; reads take
    a word per cycle with no gap between requests other than the trim's (see read_span)."""
    rng = random.Random(2000 + n + aligned)
    ring = 512 * n
    dut = TxRing(n, CONNS, ring)
    count = 12 if n == 1 else 60
    lengths = [rng.choice([1, n, rng.randint(1, 6 * n)]) for _ in range(count)]
    conns = [rng.randrange(CONNS) for _ in range(count)]
    seqs = []
    for k in range(count):
        # No two ranges share a byte of the ring: each gets its own slice.
        base = k * 6 * n + (0 if aligned else rng.randrange(n))
        seqs.append((rng.getrandbits(20) * ring + base) % 2**32)
    data = [bytes(rng.getrandbits(8) for _ in range(k)) for k in lengths]
    beats = sum(-(-k // n) for k in lengths)
    # Writes that store one word more than they have beats (the last write's is after the end).
    spills = sum(1 for s, k in zip(seqs[:-1], lengths) if -(-(s % n + k) // n) > -(-k // n))
    requests = [request(c, s, k) for c, s, k in zip(conns, seqs, lengths)]
    cycles = {}

    async def write_requests(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_write), requests)

    async def write_data(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_data), data, n)
        cycles["written"] = True

    async def read_requests(ctx):
        while "written" not in cycles:
            await ctx.tick()
        await ctx.tick()
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_read), requests)

    async def read_data(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o_data), count, n)
        assert [bytes(p) for p in got] == data

    async def write_meter(ctx):
        await span(ctx, dut.i_data, beats, cycles, "write")

    async def write_reports(ctx):
        got = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_written), count)
        assert got == [request(c, s + k, k) for c, s, k in zip(conns, seqs, lengths)]

    async def read_meter(ctx):
        await span(ctx, dut.o_data, beats, cycles, "read")

    run(dut, write_requests, write_data, read_requests, read_data, write_meter, read_meter,
        write_reports, name=f"tcp_ring_rate_w{n}")
    assert cycles["write"] == beats + spills
    assert cycles["read"] == read_span(seqs, lengths, n)
    if aligned:
        assert spills == 0 and cycles["read"] == beats
    elif n > 1:
        assert spills > 0


@pytest.mark.parametrize("n", WIDTHS)
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "tx_ring.v"
    path.write_text(verilog.convert(TxRing(n, 3, 16 * n), name="tx_ring"))
    done = subprocess.run(["verilator", "--lint-only", "-Wall", "-Wno-DECLFILENAME",
                           "-Wno-UNUSEDSIGNAL", "-Wno-PROCASSINIT", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_parameters():
    for bad in (0, 3, 16, 24):
        with pytest.raises(ValueError, match="ring_bytes"):
            TxRing(8, 2, bad)
    with pytest.raises(ValueError, match="data_bytes"):
        TxRing(3, 2, 64)
    with pytest.raises(ValueError, match="conns"):
        TxRing(8, 0, 64)

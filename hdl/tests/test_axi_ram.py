# amaranth: UnusedElaboratable=no
"""Block RAM as an AXI4 subordinate (``iwarp_nic.axi_ram.AxiRam``) under the Amaranth
simulator, behind the NIC's own DMA engine (:class:`iwarp_nic.dma.DmaMaster`, so the bursts
are those the NIC issues: unaligned starts and ends, up to 16 beats, never across 4 KiB) with
random idle and back-pressure on every client port, and the word port at the same time. The
reference is a bytearray: the RAM's initial contents with the commanded writes applied.
Covered: reads of the initial contents while writes go on elsewhere, every write read back
afterwards (through AXI and through the word port), bursts outside the RAM
(DECERR: reported as errors, nothing written), bursts the RAM does not take (a narrow size,
FIXED, WRAP: SLVERR, nothing written, zeros read), and bad parameters.
"""

import random

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from iwarp_nic.axi import Burst, Resp
from iwarp_nic.axi_ram import AxiRam
from iwarp_nic.dma import DmaMaster
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.dma_clients import commands, read_client, write_client
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

SIZE = 16 * 1024
BASE = 0xFFFF_F000_7FFF_0000    # high address bits set: the whole 64-bit decode is used


class _DmaToRam(Elaboratable):
    """The DMA engine (one write client, two read clients) in front of the RAM."""

    def __init__(self, n, init):
        self.dma = DmaMaster(n, write_clients=1, read_clients=2)
        self.ram = AxiRam(n, SIZE, base=BASE, init=init)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma, m.submodules.ram = self.dma, self.ram
        wiring.connect(m, self.dma.m_axi, self.ram.s_axi)
        return m


def _within(cmds, lo, hi):
    return [(a, k) for a, k in cmds if lo <= a and a + k <= hi]


def _word_port(ram, rng, memory, writes, reads):
    """Testbenches for the word port: ``writes`` (then their answers), and once all are
    answered ``reads``; returns them and the list the read answers go to. ``memory`` (the
    reference) gets the writes' strobed octets, in the word their address falls in."""
    n, got = ram.data_bytes, []
    for w in writes:
        for lane in range(n):
            if w["strb"] >> lane & 1:
                memory[w["addr"] // n * n + lane] = w["data"] >> 8 * lane & 0xFF

    async def writer(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(ram.i_write), writes, rng=rng,
                   idle=0.3)

    async def reader(ctx):
        bus = AmaranthBus(ctx)
        done = await recv(bus, StreamPort.amaranth(ram.o_write_done), len(writes), rng=rng,
                          stall=0.3)
        assert done == [{"error": 0}] * len(writes)
        asker = StreamPort.amaranth(ram.i_read)
        answers = StreamPort.amaranth(ram.o_read)
        for r in reads:     # one at a time: send, then wait for the answer
            await send(bus, asker, [r], rng=rng, idle=0.3)
            got.extend(await recv(bus, answers, 1, rng=rng, stall=0.3))
    return [writer, reader], got


@pytest.mark.parametrize("n", (8, 16, 64))
def test_dma_to_ram(n):
    """Client 0 reads the initial contents of the RAM's second quarter (and beyond its end and
    below its start: DECERR) while the write client writes its first (and outside it), and
    the word port writes words of the third; once every write is done, client 1 reads each
    written range back, and the word port reads its own words and words of the fourth
    quarter."""
    rng = random.Random(f"ram{n}")
    init = rng.randbytes(SIZE)
    quarter = SIZE // 4
    half = BASE + quarter
    writes = _within(commands(rng, n, 30, BASE + 1, max_len=400)[0], BASE, half)
    reads = _within(commands(rng, n, 30, half + 3, max_len=400)[0], half, BASE + 2 * quarter)
    outside = [(BASE + SIZE + 5, 70), (BASE - 4096 + 17, 40), (BASE + 2 * SIZE, 8)]
    writes = writes[:8] + outside[:2] + writes[8:] + outside[2:]
    reads = reads[:5] + outside + reads[5:]
    payloads = [rng.randbytes(k) for _, k in writes]
    back = [(a, k) for a, k in writes if k and BASE <= a < BASE + SIZE]
    dut = _DmaToRam(n, init)
    seen, got, got_back = [], [], []
    benches = write_client(dut.dma.i_write0_command, dut.dma.i_write0_data,
                           dut.dma.o_write0_done, writes, payloads, random.Random(1), idle=0.3,
                           stall=0.3, seen=seen)
    benches += read_client(dut.dma.i_read0_command, dut.dma.o_read0_data, reads,
                           random.Random(2), idle=0.3, stall=0.3, got=got)
    command_back, reader_back = read_client(dut.dma.i_read1_command, dut.dma.o_read1_data, back,
                                            random.Random(3), idle=0.2, stall=0.3,
                                            got=got_back)

    async def after_writes(ctx):
        while len(seen) < len(writes):
            await ctx.tick()
        await command_back(ctx)

    memory = bytearray(init)
    words = rng.sample(range(2 * quarter, 3 * quarter, n), 40)
    local_writes = [{"addr": a + rng.randrange(n), "data": rng.getrandbits(8 * n),
                     "strb": rng.getrandbits(n)} for a in words]
    local_reads = [{"addr": a + rng.randrange(n)}
                   for a in words[:20] + rng.sample(range(3 * quarter, SIZE, n), 20)]
    local, local_got = _word_port(dut.ram, random.Random(4), memory, local_writes, local_reads)
    run(dut, *benches, after_writes, reader_back, *local, name=f"axi_ram_w{n}")

    def bad(a, k):
        return not BASE <= a < BASE + SIZE

    assert seen == [int(bad(a, k)) for a, k in writes]
    assert [p.err for p in got] == [bad(a, k) for a, k in reads if k]
    assert [bytes(p) for p, (a, k) in zip(got, [c for c in reads if c[1]])
            if not bad(a, k)] == [init[a - BASE:a - BASE + k] for a, k in reads
                                  if k and not bad(a, k)]
    for (a, k), data in zip(writes, payloads):
        if not bad(a, k):
            memory[a - BASE:a - BASE + k] = data
    assert got_back == [Packet(bytes(memory[a - BASE:a - BASE + k])) for a, k in back]
    assert local_got == [{"data": int.from_bytes(memory[r["addr"] // n * n:][:n], "little"),
                          "error": 0} for r in local_reads]


async def _write_burst(ctx, axi, addr, data, *, size, burst):
    """One write burst of ``data`` (whole beats, every strobe set); returns its response."""
    n = len(axi.wstrb)
    beats = [data[i:i + n] for i in range(0, len(data), n)]
    ctx.set(axi.awaddr, addr)
    ctx.set(axi.awlen, len(beats) - 1)
    ctx.set(axi.awsize, size)
    ctx.set(axi.awburst, burst)
    ctx.set(axi.awvalid, 1)
    await ctx.tick().until(axi.awready)
    ctx.set(axi.awvalid, 0)
    for i, beat in enumerate(beats):
        ctx.set(axi.wdata, int.from_bytes(beat, "little"))
        ctx.set(axi.wstrb, (1 << n) - 1)
        ctx.set(axi.wlast, i == len(beats) - 1)
        ctx.set(axi.wvalid, 1)
        await ctx.tick().until(axi.wready)
    ctx.set(axi.wvalid, 0)
    ctx.set(axi.bready, 1)
    (resp,) = await ctx.tick().sample(axi.bresp).until(axi.bvalid)
    ctx.set(axi.bready, 0)
    return resp


async def _read_burst(ctx, axi, addr, beats, *, size, burst):
    """One read burst; returns ``(data, [rresp per beat], [rlast per beat])``."""
    n = len(axi.wstrb)
    ctx.set(axi.araddr, addr)
    ctx.set(axi.arlen, beats - 1)
    ctx.set(axi.arsize, size)
    ctx.set(axi.arburst, burst)
    ctx.set(axi.arvalid, 1)
    await ctx.tick().until(axi.arready)
    ctx.set(axi.arvalid, 0)
    ctx.set(axi.rready, 1)
    data, resps, lasts = b"", [], []
    for _ in range(beats):
        rdata, rresp, rlast = await ctx.tick().sample(
            axi.rdata, axi.rresp, axi.rlast).until(axi.rvalid)
        data += rdata.to_bytes(n, "little")
        resps.append(rresp)
        lasts.append(rlast)
    ctx.set(axi.rready, 0)
    return data, resps, lasts


def test_bursts_the_ram_does_not_take():
    """A narrow size, a FIXED and a WRAP burst are answered SLVERR, write nothing and read
    zeros for every beat of the burst; an INCR burst of full size then reads the contents
    intact, and one outside the RAM is DECERR."""
    n = 8
    init = bytes(range(256)) * (4096 // 256)
    ram = AxiRam(n, 4096, base=0x1000, init=init)
    axi = ram.s_axi
    results = []

    async def bench(ctx):
        for size, burst in ((2, Burst.INCR), (3, Burst.FIXED), (3, Burst.WRAP)):
            results.append(await _write_burst(ctx, axi, 0x1040, bytes(32), size=size,
                                              burst=burst))
            results.append(await _read_burst(ctx, axi, 0x1040, 4, size=size, burst=burst))
        results.append(await _read_burst(ctx, axi, 0x1040, 4, size=3, burst=Burst.INCR))
        results.append(await _write_burst(ctx, axi, 0x2000, bytes(8), size=3,
                                          burst=Burst.INCR))

    run(ram, bench, name="axi_ram_refused")
    refused = (bytes(32), [Resp.SLVERR] * 4, [0, 0, 0, 1])
    assert results[:6] == [Resp.SLVERR, refused] * 3
    assert results[6] == (init[0x40:0x60], [Resp.OKAY] * 4, [0, 0, 0, 1])
    assert results[7] == Resp.DECERR


@pytest.mark.parametrize("bad", [dict(data_bytes=3), dict(size=6000), dict(size=2048),
                                 dict(base=0x800), dict(init=bytes(4097)),
                                 dict(base=1 << 64)])
def test_bad_parameters(bad):
    args = {"data_bytes": 8, "size": 4096, **bad}
    with pytest.raises(ValueError):
        AxiRam(args.pop("data_bytes"), args.pop("size"), **args)

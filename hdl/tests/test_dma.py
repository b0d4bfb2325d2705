# amaranth: UnusedElaboratable=no
"""The DMA engine (``iwarp_nic.dma``) under the Amaranth simulator, against
:class:`iwarp_tb.axi_memory.AxiMemory`, which checks the AXI4 rules (4 KiB, burst length,
strobes inside the burst, wlast, VALID held) and that no byte outside the commanded ranges is
written, with random stalls and latencies on every channel. The reference for writes is the
commands' own bytes at their addresses; for reads the memory's bytes; for errors, which
commands touch a range the memory answers SLVERR for.

Covered: random addresses and lengths (0, 1 byte up to several KiB, across 4 KiB, unaligned
starts and ends), the writer and reader alone at every width and several burst sizes, the
master with several clients at once with random idle and back-pressure, round-robin fairness,
error responses, bad parameters, and full-rate throughput with reads in flight.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring

from iwarp_nic.dma import BurstSplitter, DmaMaster, DmaReader, DmaWriter, LanePad, ReadReserve
from iwarp_tb.amsim import run
from iwarp_tb.axi_memory import AxiMemory
from iwarp_tb.beats import Packet
from iwarp_tb.dma_clients import commands, read_client, write_client
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send, send_packets

WIDTHS = (8, 16, 32, 64)
BASE = 0xFFFF_F000_7FFF_0000        # high address bits set: the whole 64-bit path is used


def _expected_reads(memory, cmds, bad=()):
    return [Packet(memory.read(a, k), any(a < hi and lo < a + k for lo, hi in bad))
            for a, k in cmds if k]


# -- the writer and the reader alone ------------------------------------------------------

@pytest.mark.parametrize("n,max_burst", [(4, 16), (8, 16), (16, 16), (32, 16), (64, 16), (8, 1),
                                         (8, 4), (16, 256), (64, 256)])
def test_writer_random(n, max_burst):
    rng = random.Random(f"w{n}-{max_burst}")
    dut = DmaWriter(n, max_burst=max_burst, outstanding=5 if max_burst == 4 else 16)
    memory = AxiMemory(dut.m_axi, n, rng=rng, stall=0.3, b_latency=(0, 12),
                       max_burst=max_burst)
    cmds, end = commands(rng, n, 40, BASE + 5, max_len=2000 + 40 * n)
    memory.write(BASE, rng.randbytes(end + 4096 - BASE))   # old contents, to stay as they were
    before = memory.read(BASE, end + 4096 - BASE)
    payloads = [rng.randbytes(k) for _, k in cmds]
    for a, k in cmds:
        memory.allow_write(a, k)
    seen = []
    run(dut, *write_client(dut.i_command, dut.i_data, dut.o_done, cmds, payloads, rng,
                            idle=0.2, stall=0.2, seen=seen, memory=memory),
        monitors=[memory.bench()], name=f"dma_writer_w{n}")
    assert seen == [0] * len(cmds)
    expect = bytearray(before)
    for (a, k), p in zip(cmds, payloads):
        expect[a - BASE:a - BASE + k] = p
    assert memory.read(BASE, len(expect)) == expect
    assert all(b.beats <= max_burst for b in memory.bursts)
    chunk = min(max_burst * n, 4096)
    if any(-(-a // chunk) * chunk + chunk <= a + k for a, k in cmds):
        assert max(b.beats for b in memory.bursts) == chunk // n


@pytest.mark.parametrize("n,max_burst", [(4, 16), (8, 16), (16, 16), (32, 16), (64, 16), (8, 2),
                                         (32, 256)])
def test_reader_random(n, max_burst):
    rng = random.Random(f"r{n}-{max_burst}")
    dut = DmaReader(n, max_burst=max_burst)
    memory = AxiMemory(dut.m_axi, n, rng=rng, stall=0.3, r_latency=(0, 20),
                       max_burst=max_burst)
    memory.allow_write(0, 0)                # no write at all
    cmds, end = commands(rng, n, 40, BASE + 3, max_len=2000 + 40 * n)
    memory.write(BASE, rng.randbytes(end - BASE + 4096))
    got = []
    run(dut, *read_client(dut.i_command, dut.o_data, cmds, rng, idle=0.2, stall=0.3, got=got),
        monitors=[memory.bench()], name=f"dma_reader_w{n}")
    expect = _expected_reads(memory, cmds)
    assert got == expect and not any(p.err for p in got)
    assert memory.max_reads > 1


class _ReservedReader(wiring.Component):
    """A :class:`ReadReserve` in front of a :class:`DmaReader`: the client's side."""

    def __init__(self, n, beats):
        self.reserve, self.reader = ReadReserve(n, beats), DmaReader(n)
        super().__init__({"i_command": self.reserve.signature.members["i_command"],
                          "o_data": self.reserve.signature.members["o_data"],
                          "m_axi": self.reader.signature.members["m_axi"]})

    def elaborate(self, platform):
        m = Module()
        m.submodules.reserve, m.submodules.reader = self.reserve, self.reader
        wiring.connect(m, wiring.flipped(self.i_command), self.reserve.i_command)
        wiring.connect(m, self.reserve.o_command, self.reader.i_command)
        wiring.connect(m, self.reader.o_data, self.reserve.i_data)
        wiring.connect(m, self.reserve.o_data, wiring.flipped(self.o_data))
        wiring.connect(m, self.reader.m_axi, wiring.flipped(self.m_axi))
        return m


@pytest.mark.parametrize("n,beats", [(8, 8), (8, 64), (64, 8)])
def test_read_reserve(n, beats):
    """Reads of up to ``beats`` beats, a client that stalls most cycles: every read's bytes
    come back in order, and the reader's data is never held up (``i_data`` ready whenever
    it is valid), which is what keeps the other clients' reads going."""
    rng = random.Random(f"reserve{n}-{beats}")
    dut = _ReservedReader(n, beats)
    memory = AxiMemory(dut.m_axi, n, rng=rng, stall=0.2, r_latency=(0, 12))
    memory.allow_write(0, 0)
    cmds, end = commands(rng, n, 60, BASE + 1, max_len=beats * n, gap=40)
    cmds = [(a, k if -(-k // n) <= beats else beats * n) for a, k in cmds]
    memory.write(BASE, rng.randbytes(end - BASE + 4096))
    held = []

    async def watch(ctx):
        data = dut.reserve.i_data
        while True:
            _, _, valid, ready = await ctx.tick().sample(data.valid, data.ready)
            if valid and not ready:
                held.append(True)

    got = []
    run(dut, *read_client(dut.i_command, dut.o_data, cmds, rng, idle=0.1, stall=0.8, got=got),
        monitors=[memory.bench(), watch], name=f"dma_read_reserve_w{n}")
    assert got == _expected_reads(memory, cmds)
    assert not held, "the reserve held up the reader's data"
    assert memory.max_reads > 1


def test_lane_pad():
    """The write-data realigner alone, against a model of its output: each packet's bytes from
    lane ``count`` on, strobes on exactly those lanes, one beat per input beat plus a tail."""
    n = 8
    rng = random.Random(7)
    dut = LanePad(n)
    packets = [rng.randbytes(rng.randint(1, 4 * n)) for _ in range(120)]
    counts = [rng.randrange(n) for _ in packets]
    expect = []
    for count, p in zip(counts, packets):
        lanes = [None] * count + list(p)
        lanes += [None] * (-len(lanes) % n)
        for k in range(0, len(lanes), n):
            beat = lanes[k:k + n]
            strb = sum(1 << j for j, b in enumerate(beat) if b is not None)
            data = {j: b for j, b in enumerate(beat) if b is not None}
            expect.append((data, strb, int(k + n >= len(lanes))))
    got = []

    async def counter(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_count),
                   [{"data": c} for c in counts], rng=rng, idle=0.3)

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), packets, n, rng=rng,
                           idle=0.3)

    async def sink(ctx):
        for t in await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(expect), rng=rng,
                            stall=0.3):
            data = {j: t["data"] >> 8 * j & 0xFF for j in range(n) if t["strb"] >> j & 1}
            got.append((data, t["strb"], t["last"]))

    run(dut, counter, source, sink)
    assert got == expect


def _split(n, max_burst, rng):
    dut = BurstSplitter(n, max_burst=max_burst, addr_width=64)
    chunk = min(n * max_burst, 4096)
    cmds = [(rng.randrange(1 << 64), rng.choice([0, 1, rng.randint(1, min(20 * chunk, 65535))]))
            for _ in range(60)]
    cmds = [(a, k) for a, k in cmds if a + k < 1 << 64]
    expect = []
    for a, k in cmds:
        if not k:
            expect.append(("empty",))
            continue
        at, end = a, a + k - 1
        while True:
            stop = min(end, (at // chunk + 1) * chunk - 1)
            expect.append((at, stop // n - at // n, stop == end, end % n))
            if stop == end:
                break
            at = stop + 1
    got = []

    async def source(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                   [{"addr": a, "length": k} for a, k in cmds], rng=rng, idle=0.2)

    async def sink(ctx):
        for t in await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(expect), rng=rng,
                            stall=0.2, timeout=1000):
            got.append(("empty",) if t["empty"] else
                       (t["addr"], t["len"], bool(t["last"]), t["end"]))

    run(dut, source, sink)
    return got, expect


@pytest.mark.parametrize("n,max_burst", [(8, 16), (64, 64), (16, 256), (4, 1)])
def test_splitter_bursts(n, max_burst):
    """The cut itself, against an independent enumeration over the whole 64-bit space: every
    burst ends at a chunk boundary (``min(n * max_burst, 4096)``) or the command's end, and the
    bursts cover the command's beats exactly; a length-0 command gives one ``empty``."""
    got, expect = _split(n, max_burst, random.Random(f"s{n}-{max_burst}"))
    assert got == expect


# -- the master: several clients ------------------------------------------------------------

def _master_run(n, rng, *, writers, readers, count, stall, errors=(), idle=0.3, port_stall=0.3,
                max_len=3000):
    dut = DmaMaster(n, write_clients=writers, read_clients=readers)
    memory = AxiMemory(dut.m_axi, n, rng=rng, stall=stall, b_latency=(0, 15),
                       r_latency=(0, 30), max_burst=16)
    for lo, hi in errors:
        memory.inject_error(lo, hi - lo)
    at, benches = BASE + 1, []
    write_cmds, write_data, seen = [], [], []
    for k in range(writers):
        cmds, at = commands(rng, n, count, at, max_len=max_len)
        data = [rng.randbytes(length) for _, length in cmds]
        for a, length in cmds:
            memory.allow_write(a, length)
        write_cmds.append(cmds)
        write_data.append(data)
        seen.append([])
        benches += write_client(getattr(dut, f"i_write{k}_command"),
                                 getattr(dut, f"i_write{k}_data"),
                                 getattr(dut, f"o_write{k}_done"), cmds, data,
                                 random.Random(rng.random()), idle=idle, stall=port_stall,
                                 seen=seen[k], memory=memory)
    read_cmds, got = [], []
    for k in range(readers):
        cmds, end = commands(rng, n, count, at, max_len=max_len)
        memory.write(at, rng.randbytes(end - at))
        read_cmds.append(cmds)
        got.append([])
        benches += read_client(getattr(dut, f"i_read{k}_command"),
                                getattr(dut, f"o_read{k}_data"), cmds,
                                random.Random(rng.random()), idle=idle, stall=port_stall,
                                got=got[k])
        at = end
    run(dut, *benches, monitors=[memory.bench()], name=f"dma_master_w{n}")
    for k in range(writers):
        assert seen[k] == [int(any(a < hi and lo < a + length for lo, hi in errors))
                           for a, length in write_cmds[k]], f"write client {k}"
        for (a, length), data in zip(write_cmds[k], write_data[k]):
            if not any(a < hi and lo < a + length for lo, hi in errors):
                assert memory.read(a, length) == data, f"write client {k} at {a:#x}"
    for k in range(readers):
        expect = _expected_reads(memory, read_cmds[k], errors)
        assert len(got[k]) == len(expect), f"read client {k}"
        for g, e in zip(got[k], expect):
            assert g.err == e.err, f"read client {k}"
            if not e.err:
                assert g == e, f"read client {k}"
    return dut, memory


@pytest.mark.parametrize("n", WIDTHS)
def test_master_clients(n):
    """Three write and three read clients at once, each with its own random idle and
    back-pressure, the memory stalling every channel."""
    _master_run(n, random.Random(f"m{n}"), writers=3, readers=3, count=12, stall=0.3)


@pytest.mark.parametrize("n", (8, 64))
def test_master_errors(n):
    """SLVERR on some 64-byte blocks: exactly the commands touching them report
    ``done.error`` or a packet with ``err``; the others are unaffected."""
    rng = random.Random(f"e{n}")
    errors = []
    at = BASE
    for _ in range(40):
        at += 64 * rng.randint(5, 60)
        errors.append((at, at + 64 * rng.randint(1, 3)))
    _master_run(n, rng, writers=2, readers=2, count=20, stall=0.2, errors=errors)


def test_round_robin():
    """Three clients with a command always ready: the grants rotate 0, 1, 2, 0, ... and a
    client's data goes through in one piece (each command is one burst at its own address)."""
    n = 8
    dut = DmaMaster(n, write_clients=3, read_clients=1)
    rng = random.Random(11)
    memory = AxiMemory(dut.m_axi, n, rng=rng)
    per_client = 20
    owner = {}
    benches = []
    for k in range(3):
        cmds = [(BASE + 4096 * k + 64 * j, 24) for j in range(per_client)]
        for a, _ in cmds:
            owner[a] = k
            memory.allow_write(a, 24)
        benches += write_client(getattr(dut, f"i_write{k}_command"),
                                 getattr(dut, f"i_write{k}_data"),
                                 getattr(dut, f"o_write{k}_done"), cmds,
                                 [bytes([k]) * 24] * per_client, rng, idle=0, stall=0, seen=[])
    run(dut, *benches, monitors=[memory.bench()])
    order = [owner[b.addr] for b in memory.bursts if b.kind == "write"]
    assert order == [0, 1, 2] * per_client
    for b in memory.bursts:
        assert all(data >> 8 * j & 0xFF == owner[b.addr] for data, strb in b.data
                   for j in range(n) if strb >> j & 1)


@pytest.mark.parametrize("bad", [
    dict(data_bytes=2), dict(data_bytes=128), dict(max_burst=3), dict(max_burst=512),
    dict(write_outstanding=2), dict(read_outstanding=300), dict(addr_width=16),
    dict(write_clients=0, read_clients=0), dict(write_clients=17), dict(read_clients=-1),
])
def test_bad_parameters(bad):
    args = dict(data_bytes=8, write_clients=1, read_clients=1)
    args.update(bad)
    with pytest.raises(ValueError):
        DmaMaster(args.pop("data_bytes"), **args)


# -- throughput -----------------------------------------------------------------------------

def _rate(cycles):
    return len(cycles) / (cycles[-1] - cycles[0] + 1)


@pytest.mark.parametrize("n", (8, 64))
@pytest.mark.parametrize("shape", ["long", "short"])
def test_throughput(n, shape):
    """No stalls anywhere: W and R carry a beat on (nearly) every cycle from the first beat to
    the last, across bursts, commands and the two clients of each direction, with read data 60
    to 100 cycles behind; reads overlap (at least 8 bursts in flight). ``long``: 4 KiB
    commands, unaligned, write responses 8 to 16 cycles behind. ``short``: 1 to ``n`` bytes
    each, anywhere (one or two beats, so a command each cycle or so: no bubble per command),
    write responses 4 to 8 cycles behind (16 bursts of so few beats in flight must cover the
    round trip); writes only, as 16 such reads in flight cannot cover 100 cycles of latency."""
    rng = random.Random(n)
    dut = DmaMaster(n, write_clients=2, read_clients=2)
    memory = AxiMemory(dut.m_axi, n, rng=rng, b_latency=(8, 16) if shape == "long" else (4, 8),
                       r_latency=(60, 100))
    if shape == "long":
        count, length = (4 if n == 8 else 16), 4096
    else:
        count, length = 100, None
    benches, seen, got = [], [[], []], [[], []]
    at = BASE + 3
    for k in range(2):
        cmds = []
        for _ in range(count):
            cmds.append((at, length or rng.randint(1, n)))
            at += cmds[-1][1] + rng.randint(0, n)
        benches += write_client(getattr(dut, f"i_write{k}_command"),
                                 getattr(dut, f"i_write{k}_data"),
                                 getattr(dut, f"o_write{k}_done"), cmds,
                                 [rng.randbytes(k) for _, k in cmds], rng, idle=0, stall=0,
                                 seen=seen[k])
        if shape == "long":
            cmds = [(at + j * (length + 7), length) for j in range(count)]
            at += count * (length + 7)
            memory.write(cmds[0][0], rng.randbytes(count * (length + 7)))
            benches += read_client(getattr(dut, f"i_read{k}_command"),
                                    getattr(dut, f"o_read{k}_data"), cmds, rng, idle=0,
                                    stall=0, got=got[k])
    run(dut, *benches, monitors=[memory.bench()])
    w_rate = _rate(memory.w_cycles)
    print(f"\nDMA w{n} {shape}: W {w_rate:.4f} beats/cycle over {len(memory.w_cycles)} beats",
          end="")
    assert w_rate >= 0.95
    if shape == "long":
        r_rate = _rate(memory.r_cycles)
        print(f", R {r_rate:.4f} over {len(memory.r_cycles)}, {memory.max_reads} reads in "
              f"flight at most")
        assert r_rate >= 0.95
        assert memory.max_reads >= 8

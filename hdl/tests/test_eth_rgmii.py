# amaranth: UnusedElaboratable=no
"""The RGMII adapter under the Amaranth simulator, with GmiiMac behind it, against an RGMII PHY
model written here from the RGMII 2.0 signal definitions: the PHY's receive clock runs off the
core clock by up to +-1000 ppm, frames are scapy-built with zlib's CRC-32, in-band status and
false-carrier symbols fill the gaps. RX: every frame arrives with the MAC's verdict; TX: the pins
decode to the frames sent; loopback: TX pins replayed into RX on the other clock. The elastic
buffer alone: overflow and underrun end runs flagged, never silently wrong. The clock meter tells
125 MHz from 25 MHz and from a stopped clock."""

import gc
import random
import zlib

import pytest
from amaranth import ClockDomain, Elaboratable, Module
from amaranth.sim import Simulator
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from iwarp_nic.eth import PREAMBLE, GmiiMac
from iwarp_nic.eth.rgmii import (
    GMII_RX_PINS,
    GMII_TX_PINS,
    GmiiRxCrossing,
    RgmiiAdapter,
    RxClockMeter,
)
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv_packets, send_packets

CORE_PERIOD = 8e-9
#: The PHY's receive clock against the core's: nominal, and 1000 ppm either way (five times what
#: 802.3 allows between two ends).
PPM = {"same": 0, "rxc_fast": -1000, "rxc_slow": 1000}

# --- The PHY side, from the RGMII 2.0 signal definitions ---------------------------------------

#: In-band status nibble (RD while RX_CTL is low at both edges): link up, 125 MHz, full duplex.
INBAND_STATUS = 0b1101
#: GMII false carrier (RX_DV low, RX_ER high, RXD 0x0E): RX_CTL low then high.
FALSE_CARRIER = 0x0E


def rgmii_pairs(gmii):
    """Per-edge RGMII receive values, ``(rd_rise, rd_fall, ctl_rise, ctl_fall)`` per cycle, for
    GMII ``(rxd, rx_dv, rx_er)`` cycles: RD carries RXD[3:0] at the rising edge and RXD[7:4] at
    the falling one, RX_CTL carries RX_DV, then RX_DV XOR RX_ER."""
    return [(rxd & 0xF, rxd >> 4, dv, dv ^ er) for rxd, dv, er in gmii]


def gmii_from_pairs(pairs):
    """The inverse of :func:`rgmii_pairs`: GMII ``(txd, tx_en, tx_er)`` from TD/TX_CTL pairs."""
    return [(rise | fall << 4, ctl_rise, ctl_rise ^ ctl_fall)
            for rise, fall, ctl_rise, ctl_fall in pairs]


def fcs(frame):
    return zlib.crc32(frame).to_bytes(4, "little")


def random_frame(rng, length):
    """A frame without FCS of ``length`` (>= 14) bytes, built by scapy."""
    ether = Ether(dst=rng.randbytes(6), src=rng.randbytes(6), type=0x0800)
    return bytes(ether / Raw(rng.randbytes(length - 14)))


class RxCase:
    """One frame on the wire and what the MAC must make of it."""

    def __init__(self, frame, kind):
        good = fcs(frame)
        self.kind = kind
        self.wire = PREAMBLE + frame + (bytes(b ^ 0xFF for b in good) if kind == "bad_fcs"
                                        else good)
        self.expect = Packet(frame, kind != "frames_ok")


def gmii_line(cases, rng, *, gap=(12, 20)):
    """GMII receive cycles for ``cases``: gaps of in-band status (or, now and then, a false
    carrier) between frames; a "phy_errors" case has RX_ER high on one random byte."""
    idle = (INBAND_STATUS | INBAND_STATUS << 4, 0, 0)
    line = [idle] * 8
    for case in cases:
        bad = rng.randrange(8, len(case.wire)) if case.kind == "phy_errors" else -1
        line += [(b, 1, int(j == bad)) for j, b in enumerate(case.wire)]
        filler = [idle] * rng.randint(*gap)
        if rng.random() < 0.3:
            filler[len(filler) // 2] = (FALSE_CARRIER, 0, 1)
        line += filler
    return line + [idle] * 8


def gmii_frames(gmii):
    """Runs of TX_EN high from GMII ``(txd, en, er)`` cycles; ``er`` must stay low."""
    frames, current = [], None
    for txd, en, er in gmii:
        assert not er, "the MAC never signals a transmit error"
        if en:
            current = (current or bytearray()) + bytes([txd])
        elif current is not None:
            frames.append(bytes(current))
            current = None
    return frames


def check_sent(wire, frame):
    """A frame from the TX pins: preamble, the frame padded to 60 bytes, a good FCS."""
    assert wire[:8] == PREAMBLE
    body = wire[8:]
    assert body[:-4] == frame + bytes(max(0, 60 - len(frame)))
    assert body[-4:] == fcs(body[:-4])


# --- Simulation --------------------------------------------------------------------------------

class AdapterAndMac(Elaboratable):
    """RgmiiAdapter with GmiiMac on its GMII side; domains ``sync`` and ``rgmii_rx``."""

    def __init__(self, rx_depth=32):
        self.adapter = RgmiiAdapter(rx_depth=rx_depth)
        self.mac = GmiiMac()

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.domains.rgmii_rx = ClockDomain("rgmii_rx")
        m.submodules.adapter = adapter = self.adapter
        m.submodules.mac = mac = self.mac
        m.d.comb += [getattr(mac, name).eq(getattr(adapter, name)) for name in GMII_RX_PINS]
        m.d.comb += [getattr(adapter, name).eq(getattr(mac, name)) for name in GMII_TX_PINS]
        return m


def simulate(dut, rx_period, *testbenches):
    sim = Simulator(dut)
    sim.add_clock(CORE_PERIOD, domain="sync")
    if rx_period is not None:
        sim.add_clock(rx_period, domain="rgmii_rx", phase=rx_period / 3)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def rx_period(ppm):
    return CORE_PERIOD * (1 + ppm * 1e-6)


async def play_pairs(ctx, edges, pairs):
    """Drive per-edge receive values, one pair per ``rgmii_rx`` cycle."""
    for rise, fall, ctl_rise, ctl_fall in pairs:
        ctx.set(edges.rd, [rise, fall])
        ctx.set(edges.rx_ctl, [ctl_rise, ctl_fall])
        await ctx.tick("rgmii_rx")


def edge_pair(td, ctl):
    """``(td_rise, td_fall, ctl_rise, ctl_fall)`` from sampled TD and TX_CTL edge pairs."""
    return td[0], td[1], ctl[0], ctl[1]


def run_rx(cases, ppm, rng, **line):
    dut = AdapterAndMac()
    gmii = gmii_line(cases, rng, **line)
    expected = [c for c in cases if len(c.wire) > 8 + 4]
    state = {}

    async def phy(ctx):
        await play_pairs(ctx, dut.adapter.phy, rgmii_pairs(gmii))
        await ctx.tick("rgmii_rx").repeat(64)
        mac, adapter = dut.mac, dut.adapter
        state["counters"] = {name: ctx.get(getattr(mac, f"rx_{name}")) for name in
                             ("frames_ok", "bad_fcs", "runts", "phy_errors", "overflows")}
        state["underruns"] = ctx.get(adapter.rx_underruns)
        state["overflows"] = ctx.get(adapter.rx_overflows)

    async def sink(ctx):
        state["got"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.mac.o),
                                          len(expected), 1, timeout=len(gmii) * 2)

    simulate(dut, rx_period(ppm), phy, sink)
    assert state["got"] == [c.expect for c in expected]
    assert [p.err for p in state["got"]] == [c.expect.err for c in expected]
    for kind, count in state["counters"].items():
        assert count == sum(c.kind == kind for c in cases), kind
    assert state["underruns"] == 0 and state["overflows"] == 0


@pytest.mark.parametrize("ppm", PPM)
def test_rx_frames(ppm):
    """Good, bad-FCS, PHY-error and runt frames of 60..300 bytes through adapter and MAC, the
    receive clock off by ``ppm``: each arrives exact with the MAC's verdict, counted once."""
    rng = random.Random(f"rx{ppm}")
    cases = []
    for _ in range(24):
        kind = rng.choice(["frames_ok"] * 4 + ["bad_fcs", "phy_errors", "runts"])
        length = rng.randint(20, 59) if kind == "runts" else rng.randint(60, 300)
        cases.append(RxCase(random_frame(rng, length), kind))
    run_rx(cases, PPM[ppm], rng)


@pytest.mark.parametrize("ppm", ["rxc_fast", "rxc_slow"])
def test_rx_long_frames_back_to_back(ppm):
    """Maximum frames with the shortest gap a receiver may see (the preamble shrunk, 5 idle
    cycles): nothing is lost, no FIFO hole, even with the clocks 1000 ppm apart."""
    rng = random.Random(f"long{ppm}")
    cases = [RxCase(random_frame(rng, 1514), "frames_ok") for _ in range(5)]
    for case in cases:
        case.wire = case.wire[2:]  # a PHY may eat preamble bytes
    run_rx(cases, PPM[ppm], rng, gap=(5, 5))


def run_tx(frames, rng):
    dut = AdapterAndMac()
    pairs, state = [], {"sent": False}

    async def source(ctx):
        # The MAC needs a frame's beats back to back (a packet FIFO feeds it in a node): idle
        # cycles go between frames only.
        for frame in frames:
            await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.mac.i), [frame], 1)
            await ctx.tick().repeat(rng.choice([1, 1, 2, 30]))
        state["sent"] = True

    async def pins(ctx):
        edges, quiet = dut.adapter.phy, 0
        while not state["sent"] or quiet < 40:
            *_, td, ctl = await ctx.tick().sample(edges.td, edges.tx_ctl)
            pairs.append(edge_pair(td, ctl))
            quiet = 0 if ctl[0] else quiet + 1

    simulate(dut, None, source, pins)
    return pairs


def test_tx_frames():
    """Frames into the MAC leave as RGMII edge pairs that decode to preamble, frame, padding and
    FCS, with at least 12 idle cycles between frames."""
    rng = random.Random("tx")
    frames = [random_frame(rng, rng.choice([rng.randint(14, 59), rng.randint(60, 400)]))
              for _ in range(16)]
    gmii = gmii_from_pairs(run_tx(frames, rng))
    wires = gmii_frames(gmii)
    assert len(wires) == len(frames)
    for wire, frame in zip(wires, frames, strict=True):
        check_sent(wire, frame)
    gaps, idle = [], 0
    for _, en, _ in gmii:
        if en and idle:
            gaps.append(idle)
        idle = 0 if en else idle + 1
    assert min(gaps[1:]) >= 12


@pytest.mark.parametrize("ppm", ["rxc_fast", "rxc_slow"])
def test_loopback(ppm):
    """TX pins replayed into RX on the other clock: every frame comes back exact (runts padded),
    once, in order."""
    rng = random.Random(f"loop{ppm}")
    frames = [random_frame(rng, rng.randint(14, 600)) for _ in range(12)]
    dut = AdapterAndMac()
    wire, got = [], []

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.mac.i), frames, 1)

    async def tx_pins(ctx):
        edges = dut.adapter.phy
        while len(got) < len(frames):
            *_, td, ctl = await ctx.tick().sample(edges.td, edges.tx_ctl)
            wire.append(edge_pair(td, ctl))

    async def rx_pins(ctx):
        # The PHY's RX side repeats what arrives, a fixed pipeline later, on its own clock.
        await ctx.tick("rgmii_rx").repeat(20)
        while len(got) < len(frames):
            pair = wire.pop(0) if wire else (0, 0, 0, 0)
            await play_pairs(ctx, dut.adapter.phy, [pair])

    async def sink(ctx):
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.mac.o),
                                      len(frames), 1, timeout=20_000))

    simulate(dut, rx_period(PPM[ppm]), source, tx_pins, rx_pins, sink)
    assert got == [f + bytes(max(0, 60 - len(f))) for f in frames]
    assert not any(p.err for p in got)


# --- The elastic buffer alone ------------------------------------------------------------------

def crossing_runs(gmii_out):
    """Runs of ``rx_dv`` from ``(rxd, dv, er)`` cycles, as ``(bytes, flagged)``: the bytes
    without ``rx_er``, and whether any byte had it."""
    runs, current, flagged = [], None, False
    for rxd, dv, er in gmii_out:
        if dv:
            current = current if current is not None else bytearray()
            if er:
                flagged = True
            else:
                current.append(rxd)
        elif current is not None:
            runs.append((bytes(current), flagged))
            current, flagged = None, False
    return runs


def run_crossing(runs, gaps, rx_clock, depth):
    """Play ``runs`` (byte strings), each followed by its ``gaps`` idle cycles, into a
    GmiiRxCrossing whose RX clock has period ``rx_clock``; return the output runs and the two
    counters."""
    m = Module()
    m.domains.sync = ClockDomain("sync")
    m.domains.rgmii_rx = ClockDomain("rgmii_rx")
    m.submodules.dut = dut = GmiiRxCrossing(depth)
    line = [(0, 0, 0)] * 4
    for run, gap in zip(runs, gaps, strict=True):
        line += [(b, 1, 0) for b in run] + [(0, 0, 0)] * gap
    out, state = [], {}

    async def rx(ctx):
        for rxd, dv, er in line + [(0, 0, 0)] * 200:
            ctx.set(dut.i_rxd, rxd)
            ctx.set(dut.i_rx_dv, dv)
            ctx.set(dut.i_rx_er, er)
            await ctx.tick("rgmii_rx")
        state["done"] = True

    async def core(ctx):
        while "done" not in state:
            *_, rxd, dv, er = await ctx.tick().sample(dut.o_rxd, dut.o_rx_dv, dut.o_rx_er)
            out.append((rxd, dv, er))
        state["overflows"] = ctx.get(dut.overflows)
        state["underruns"] = ctx.get(dut.underruns)

    sim = Simulator(m)
    sim.add_clock(CORE_PERIOD, domain="sync")
    sim.add_clock(rx_clock, domain="rgmii_rx")
    sim.add_testbench(rx)
    sim.add_testbench(core)
    sim.run()
    return crossing_runs(out), state["overflows"], state["underruns"]


def test_crossing_overflow():
    """Bursts of runs one idle cycle apart into a 16-byte FIFO: the reader, which idles
    HOLD + 1 cycles per run, falls behind until the FIFO overflows. Every run that comes out
    without rx_er is exact and in order, the others are cut short and flagged, and overflows
    counts the runs hit."""
    rng = random.Random("overflow")
    runs = [rng.randbytes(rng.randint(6, 30)) for _ in range(80)]
    gaps = [rng.choice([1, 1, 1, 40]) for _ in runs]
    got, overflows, underruns = run_crossing(runs, gaps, CORE_PERIOD, 16)
    exact = cut = lost = 0
    sent = iter(runs)
    for run, flagged in got:
        for want in sent:
            if run == want and not flagged:
                exact += 1
                break
            if flagged and len(run) < len(want) and want.startswith(run):
                cut += 1
                break
            lost += 1
        else:
            raise AssertionError(f"{run!r} (flagged {flagged}) matches no run sent")
    lost += sum(1 for _ in sent)
    assert underruns == 0 and overflows == cut + lost
    assert exact > 10 and cut > 3, (exact, cut, lost)


def test_crossing_underrun():
    """A receive clock 20% slower than the core: long runs drain the FIFO mid-run; the hole is
    filled with rx_er, so each such run is flagged, and short runs still come out exact."""
    rng = random.Random("underrun")
    runs = [rng.randbytes(n) for n in (5, 200, 6, 150, 5, 300)]
    got, overflows, underruns = run_crossing(runs, [12] * len(runs), CORE_PERIOD * 1.2, 64)
    assert [run for run, _ in got] == runs
    assert [flagged for _, flagged in got] == [False, True, False, True, False, True]
    assert underruns > 0 and overflows == 0


@pytest.mark.parametrize("period,gigabit", [(CORE_PERIOD, 1), (rx_period(1000), 1),
                                            (CORE_PERIOD * 1.2, 0), (40e-9, 0), (None, 0)])
def test_clock_meter(period, gigabit):
    """``gigabit`` after a few windows: set for 125 MHz (even 1000 ppm off), clear for a clock
    20% slow, for 25 MHz (100 Mb/s) and for no clock at all."""
    m = Module()
    m.domains.sync = ClockDomain("sync")
    m.domains.rgmii_rx = ClockDomain("rgmii_rx")
    m.submodules.meter = meter = RxClockMeter(window_log2=8)
    seen = []

    async def watch(ctx):
        for _ in range(6):
            await ctx.tick().repeat(256)
            seen.append(ctx.get(meter.gigabit))

    simulate(m, period, watch)
    assert seen[2:] == [gigabit] * 4


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_parameters():
    with pytest.raises(ValueError, match="depth"):
        GmiiRxCrossing(8)
    with pytest.raises(ValueError, match="window_log2"):
        RxClockMeter(window_log2=3)
    assert GmiiRxCrossing(100).depth == 128
    gc.collect()  # the unelaborated crossing warns when collected: here, under the filter

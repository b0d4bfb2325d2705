"""The Ethernet MACs (GMII, XGMII) under the Amaranth simulator, against zlib's CRC-32 and
scapy-built frames: RX from PHY-side words this file encodes, TX decoded from the PHY pins,
and TX looped back into RX."""

import gc
import random
import warnings
import zlib

import pytest
from amaranth.hdl import UnusedElaboratable
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from iwarp_model import crc32
from iwarp_nic.eth import IFG, PREAMBLE, GmiiMac, RxChecker, TxFramer, XgmiiMac
from iwarp_nic.eth.xgmii import ERROR, IDLE, START, TERMINATE
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet, from_beats, to_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, recv_packets, send, send_packets

PHY = {"gmii": GmiiMac, "xgmii": XgmiiMac}


def fcs(frame):
    return crc32(frame).to_bytes(4, "little")


def random_frame(rng, length):
    """An Ethernet frame (no FCS) of ``length`` bytes built by scapy."""
    ether = Ether(dst=rng.randbytes(6), src=rng.randbytes(6), type=0x0800)
    frame = bytes(ether / Raw(rng.randbytes(max(0, length - 14))))
    return frame[:length]


class Case:
    """One frame into RX: ``wire`` (FCS included) and the expected output and verdict."""

    def __init__(self, frame, *, bad_fcs=False, phy_err=False, max_frame=1518):
        good = fcs(frame)
        self.wire = frame + (bytes(b ^ 0xFF for b in good) if bad_fcs else good)
        self.phy_err = phy_err
        size = len(self.wire)
        self.kind = ("phy_errors" if phy_err else "runts" if size < 64 else
                     "oversize" if size > max_frame else "bad_fcs" if bad_fcs else "frames_ok")
        self.expect = Packet(frame, self.kind != "frames_ok") if frame else None


# PHY-side encoders and decoders, written from clauses 35 and 46 for the tests.

def gmii_words(cases, rng):
    """(rxd, rx_dv, rx_er) per cycle for ``cases`` with random gaps >= 12."""
    words = [(0, 0, 0)] * 4
    for case in cases:
        body = PREAMBLE + case.wire
        bad = rng.randrange(8, len(body)) if case.phy_err else -1
        words += [(b, 1, int(j == bad)) for j, b in enumerate(body)]
        words += [(0, 0, 0)] * rng.randint(IFG, IFG + 4)
    return words


def xgmii_words(cases, rng, starts=None):
    """(rxd, rxc) per cycle: each frame starts in lane 0 or 4 (``starts`` or random), its
    terminate falls where its length puts it, gaps are >= 5 bytes as clause 46 allows RX."""
    lanes = [(IDLE, 1)] * 8
    for j, case in enumerate(cases):
        start = starts[j % len(starts)] if starts else rng.choice([0, 4])
        while (len(lanes) - start) % 8 or lanes[-5:] != [(IDLE, 1)] * 5:
            lanes.append((IDLE, 1))
        body = [(START, 1)] + [(b, 0) for b in PREAMBLE[1:] + case.wire]
        if case.phy_err:  # /E/ replaces a byte; the MAC passes it on as 0xFE
            at = rng.randrange(8, len(body))
            body[at] = (ERROR, 1)
            if at - 8 < len(case.expect):
                frame = bytearray(case.expect)
                frame[at - 8] = ERROR
                case.expect = Packet(frame, True)
        lanes += body + [(TERMINATE, 1)] + [(IDLE, 1)] * rng.randint(4, 12)
    lanes += [(IDLE, 1)] * (-len(lanes) % 8 + 8)
    words = []
    for w in range(0, len(lanes), 8):
        chunk = lanes[w:w + 8]
        words.append((sum(b << 8 * i for i, (b, _) in enumerate(chunk)),
                      sum(c << i for i, (_, c) in enumerate(chunk))))
    return words


def gmii_decode(samples):
    """Frames (preamble checked, FCS included) and the gaps before each, from (txd, tx_en)."""
    frames, gaps, current, idle = [], [], None, 0
    for txd, en in samples:
        if en:
            if current is None:
                current = bytearray()
                gaps.append(idle)
            current.append(txd)
            idle = 0
        else:
            if current is not None:
                frames.append(bytes(current))
                current = None
            idle += 1
    return frames, gaps


def xgmii_decode(samples):
    """Frames and gaps (in bytes, /T/ included) from (txd, txc) words; starts must be lane 0."""
    frames, gaps, current, idle = [], [], None, 0
    for txd, txc in samples:
        for j in range(8):
            byte, ctrl = (txd >> 8 * j) & 0xFF, (txc >> j) & 1
            if current is None:
                if ctrl and byte == START:
                    assert j == 0, "TX starts in lane 0"
                    current = bytearray([0x55])
                    gaps.append(idle)
                else:
                    assert ctrl and byte == IDLE or (ctrl and byte == TERMINATE), (byte, ctrl)
                    idle += 1
            elif ctrl:
                assert byte == TERMINATE, f"frame ended by {byte:#x}"
                frames.append(bytes(current))
                current, idle = None, 1
            else:
                current.append(byte)
    return frames, gaps


def check_wire(frame, sent):
    """A TX frame as decoded from the pins: preamble, padded payload, good FCS."""
    assert frame[:8] == PREAMBLE
    body = frame[8:]
    assert len(body) >= 64 and zlib.crc32(body[:-4]).to_bytes(4, "little") == body[-4:]
    assert body[:-4] == bytes(sent) + bytes(max(0, 60 - len(sent)))


def rx_sim(mac, words, expected, *, stall=0.0, seed=0):
    """Play PHY words into RX; collect ``expected`` packets from ``o``; return them and the
    counters."""
    got, counters = [], {}
    n = mac.data_bytes

    async def phy(ctx):
        for word in words:
            if n == 1:
                ctx.set(mac.gmii_rxd, word[0])
                ctx.set(mac.gmii_rx_dv, word[1])
                ctx.set(mac.gmii_rx_er, word[2])
            else:
                ctx.set(mac.xgmii_rxd, word[0])
                ctx.set(mac.xgmii_rxc, word[1])
            await ctx.tick()
        await ctx.tick().repeat(40)
        for name in ("rx_frames_ok", "rx_bad_fcs", "rx_runts", "rx_oversize", "rx_phy_errors",
                     "rx_overflows"):
            counters[name[3:]] = ctx.get(getattr(mac, name))

    async def sink(ctx):
        rng = random.Random(seed) if stall else None
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(mac.o), expected,
                                      n, rng=rng, stall=stall, timeout=len(words) + 100))

    run(mac, phy, sink) if expected else run(mac, phy)
    return got, counters


def tx_sim(mac, packets, *, idle_between=0, underrun_at=None):
    """Send ``packets`` into TX; return the PHY samples until the line has been idle a while.
    ``underrun_at``: (packet index, beat index) where the source pauses mid-frame."""
    n = mac.data_bytes
    samples = []
    done = []

    async def source(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(mac.i)
        for j, packet in enumerate(packets):
            if underrun_at and underrun_at[0] == j:
                beats = to_beats(packet, n)
                cut = underrun_at[1]
                head = [b._asdict() for b in beats[:cut]]
                await send(bus, port, head)
                await ctx.tick().repeat(3)
                await send(bus, port, [b._asdict() for b in beats[cut:]])
            else:
                await send_packets(bus, port, [packet], n)
            if idle_between:
                await ctx.tick().repeat(idle_between)
        done.append(1)

    async def phy(ctx):
        quiet = 0
        while not done or quiet < 64:
            if n == 1:
                *_, txd, en = await ctx.tick().sample(mac.gmii_txd, mac.gmii_tx_en)
                samples.append((txd, en))
                quiet = 0 if en else quiet + 1
            else:
                *_, txd, txc = await ctx.tick().sample(mac.xgmii_txd, mac.xgmii_txc)
                samples.append((txd, txc))
                quiet = 0 if txc != 0xFF else quiet + 1
        counters.update(frames=ctx.get(mac.tx_frames), underruns=ctx.get(mac.tx_underruns))

    counters = {}
    run(mac, source, phy)
    return samples, counters


def decode(mac, samples):
    return (gmii_decode if mac.data_bytes == 1 else xgmii_decode)(samples)


def random_lengths(rng, count):
    return [rng.choice([rng.randint(1, 59), 60, rng.randint(61, 200), rng.randint(14, 80)])
            for _ in range(count)]


# RX

@pytest.mark.parametrize("phy", PHY)
def test_rx_random_frames(phy):
    """Good, bad-FCS, runt, oversize and PHY-error frames; good ones byte-exact, the rest err."""
    rng = random.Random(phy)
    mac = PHY[phy](max_frame=300)
    cases = []
    for _ in range(40):
        kind = rng.choice(["ok"] * 4 + ["fcs", "runt", "big", "phy"])
        length = {"runt": rng.randint(1, 59), "big": rng.randint(297, 340)}.get(
            kind, rng.randint(60, 296))
        cases.append(Case(random_frame(rng, length), bad_fcs=kind == "fcs",
                          phy_err=kind == "phy", max_frame=300))
    # Lengths around the limits: 63/64 bytes and max_frame/max_frame + 1 with the FCS.
    cases += [Case(random_frame(rng, n), max_frame=300) for n in (59, 60, 296, 297)]
    words = (gmii_words if phy == "gmii" else xgmii_words)(cases, rng)
    got, counters = rx_sim(mac, words, len(cases))
    assert got == [c.expect for c in cases]
    assert [p.err for p in got] == [c.expect.err for c in cases]
    for kind in ("frames_ok", "bad_fcs", "runts", "oversize", "phy_errors"):
        assert counters[kind] == sum(c.kind == kind for c in cases), kind
    assert counters["overflows"] == 0


@pytest.mark.parametrize("start", [0, 4])
def test_xgmii_rx_every_lane(start):
    """Lengths 64..79 with the FCS put /T/ in every lane, after a start in lane 0 or 4."""
    rng = random.Random(start)
    cases = [Case(random_frame(rng, n)) for n in range(60, 76)]
    cases += [Case(random_frame(rng, n), bad_fcs=True) for n in range(60, 68)]
    words = xgmii_words(cases, rng, starts=[start])
    got, counters = rx_sim(XgmiiMac(), words, len(cases))
    assert got == [c.expect for c in cases]
    assert counters["frames_ok"] == 16 and counters["bad_fcs"] == 8


@pytest.mark.parametrize("phy", PHY)
def test_rx_tiny_frames(phy):
    """Frames of 0..4 bytes after the SFD deliver nothing and count as runts; 5..8 bytes come
    out flagged."""
    rng = random.Random(2)
    cases = [Case(b"")] + [Case(rng.randbytes(n)) for n in range(1, 5)]
    wire_only = []
    for n in range(0, 5):
        case = Case(b"")
        case.wire = rng.randbytes(n)
        wire_only.append(case)
    words = (gmii_words if phy == "gmii" else xgmii_words)(wire_only + cases[1:], rng)
    got, counters = rx_sim(PHY[phy](), words, 4)
    assert got == [c.expect for c in cases[1:]] and all(p.err for p in got)
    assert counters["runts"] == 9


@pytest.mark.parametrize("phy", PHY)
def test_rx_overflow(phy):
    """``o`` stalled at random: whatever is delivered is well formed, frames delivered without
    err are exact, and every damaged frame is counted."""
    rng = random.Random(7)
    cases = [Case(random_frame(rng, rng.randint(60, 150))) for _ in range(30)]
    words = (gmii_words if phy == "gmii" else xgmii_words)(cases, rng)
    mac = PHY[phy]()
    got = []
    counters = {}
    n = mac.data_bytes

    async def phy_tb(ctx):
        for word in words:
            for port, value in zip(_rx_pins(mac), word, strict=False):
                ctx.set(port, value)
            await ctx.tick()
        await ctx.tick().repeat(40)
        counters["ok"] = ctx.get(mac.rx_frames_ok)
        counters["overflows"] = ctx.get(mac.rx_overflows)

    async def sink(ctx):
        beats = []
        window = 200 // n  # about one GMII frame, or a few XGMII ones
        for cycle in range(len(words) + 40):
            ready = cycle // window % 3 != 1
            ctx.set(mac.o.ready, ready)
            *_, valid, payload = await ctx.tick().sample(mac.o.valid, mac.o.payload)
            if valid and ready:
                beats.append(tuple(payload[f] for f in ("data", "keep", "last", "err")))
        got.extend(from_beats(beats, n))

    run(mac, phy_tb, sink)
    assert counters["ok"] == len(cases) and counters["overflows"] > 0
    wires = {c.expect for c in cases}
    good = [p for p in got if not p.err]
    assert good and all(p in wires for p in good)
    assert len(got) - len(good) == counters["overflows"] - (len(cases) - len(got))


def _rx_pins(mac):
    if mac.data_bytes == 1:
        return mac.gmii_rxd, mac.gmii_rx_dv, mac.gmii_rx_er
    return mac.xgmii_rxd, mac.xgmii_rxc


# TX

@pytest.mark.parametrize("phy", PHY)
def test_tx_random_frames(phy):
    """Frames of every size class leave with preamble, padding to 60, a good FCS and a gap of
    at least 12 bytes; frames with err leave with a bad FCS."""
    rng = random.Random(phy)
    mac = PHY[phy]()
    lengths = random_lengths(rng, 30) + list(range(52, 69))
    packets = [Packet(random_frame(rng, k), rng.random() < 0.15) for k in lengths]
    samples, counters = tx_sim(mac, packets, idle_between=rng.choice([0, 5]))
    frames, gaps = decode(mac, samples)
    assert len(frames) == len(packets) == counters["frames"]
    for frame, packet in zip(frames, packets, strict=True):
        if packet.err:
            assert frame[:8] == PREAMBLE and len(frame) >= 72
            assert zlib.crc32(frame[8:-4]).to_bytes(4, "little") != frame[-4:]
        else:
            check_wire(frame, packet)
    assert min(gaps[1:]) >= IFG


@pytest.mark.parametrize("phy", PHY)
def test_tx_full_rate(phy):
    """Back-to-back frames: each takes exactly its line time (preamble, frame, FCS, gap)."""
    rng = random.Random(3)
    mac = PHY[phy]()
    n = mac.data_bytes
    packets = [random_frame(rng, k) for k in (60, 61, 64, 65, 66, 67, 100, 131, 60)]
    samples, _ = tx_sim(mac, packets)
    frames, gaps = decode(mac, samples)
    assert [f[8:-4] for f in frames] == packets
    for frame, gap in zip(frames[:-1], gaps[1:], strict=True):  # the gap after frame
        assert gap == (IFG if n == 1 else IFG + (-(len(frame) + IFG) % 8))


@pytest.mark.parametrize("phy", PHY)
def test_tx_underrun(phy):
    """A source that pauses mid-frame: that frame leaves with a bad FCS, the next is intact."""
    rng = random.Random(5)
    mac = PHY[phy]()
    packets = [random_frame(rng, 120), random_frame(rng, 90), random_frame(rng, 70)]
    samples, counters = tx_sim(mac, packets, underrun_at=(0, 3 if phy == "xgmii" else 30))
    frames, _ = decode(mac, samples)
    assert counters["underruns"] == 1 and len(frames) == 3
    assert zlib.crc32(frames[0][8:-4]).to_bytes(4, "little") != frames[0][-4:]
    check_wire(frames[1], packets[1])
    check_wire(frames[2], packets[2])


@pytest.mark.parametrize("phy", PHY)
def test_loopback(phy):
    """TX pins wired to RX pins: every frame comes back byte-exact (runts padded to 60)."""
    rng = random.Random(11)
    mac = PHY[phy]()
    n = mac.data_bytes
    packets = [random_frame(rng, k) for k in random_lengths(rng, 20)]
    got = []

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(mac.i), packets, n)

    async def wire(ctx):
        tx = (mac.gmii_txd, mac.gmii_tx_en) if n == 1 else (mac.xgmii_txd, mac.xgmii_txc)
        rx = _rx_pins(mac)
        while len(got) < len(packets):
            *_, a, b = await ctx.tick().sample(*tx)
            ctx.set(rx[0], a)
            ctx.set(rx[1], b)

    async def sink(ctx):
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(mac.o),
                                      len(packets), n))

    run(mac, source, wire, sink)
    assert got == [p + bytes(max(0, 60 - len(p))) for p in packets]
    assert not any(p.err for p in got)


# Parameters

def test_bad_parameters():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="max_frame"):
            GmiiMac(max_frame=20)
        with pytest.raises(ValueError, match="1, 2, 4 or 8"):
            TxFramer(16)
        with pytest.raises(ValueError, match="data_bytes"):
            RxChecker(3)
        gc.collect()


def test_gap_table():
    """The gap after a final beat of k bytes: FCS spill plus idle words, >= 12 bytes of gap."""
    assert [TxFramer.gap_slots(1, 1)] == [16]
    assert [TxFramer.gap_slots(8, k) for k in range(1, 9)] == [2] * 8


@pytest.mark.parametrize("phy", PHY)
def test_latency(phy):
    """TX: first beat accepted on ``i`` to the first frame byte on the pins; RX: the last FCS
    byte on the pins to the last beat on ``o``. Fixed by the CRC engine's latency."""
    mac = PHY[phy]()
    n = mac.data_bytes
    crc_latency = 3 + n.bit_length() - 1
    packet = random_frame(random.Random(1), 64)
    seen = {}

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(mac.i), [packet], n)

    async def watch(ctx):
        tx = (mac.gmii_txd, mac.gmii_tx_en) if n == 1 else (mac.xgmii_txd, mac.xgmii_txc)
        rx = _rx_pins(mac)
        pins, cycle = [], 0
        ctx.set(mac.o.ready, 1)
        while "rx" not in seen:
            assert cycle < 10_000, f"no last beat on o after {cycle} cycles"
            *_, a, b, iv, ir, ov, olast = await ctx.tick().sample(
                *tx, mac.i.valid, mac.i.ready, mac.o.valid, mac.o.payload.last)
            if iv and ir and "accept" not in seen:
                seen["accept"] = cycle
            pins.append((a, b))
            ctx.set(rx[0], a)
            ctx.set(rx[1], b)
            frames, _ = decode(mac, pins)
            if frames and "wire_end" not in seen:
                seen["wire_end"] = cycle - (1 if n == 1 else 0)  # the cycle after the FCS
            if ov and olast:
                seen["rx"] = cycle
            cycle += 1
        seen["pins"] = pins

    run(mac, source, watch)
    first_byte = next(j for j, (a, b) in enumerate(seen["pins"])
                      if (b if n == 1 else b != 0xFF)) + 8 // n
    tx_latency = first_byte - seen["accept"]
    rx_latency = seen["rx"] - seen["wire_end"] - 1  # less the test's wire register
    print(f"\n{phy}: TX latency {tx_latency} cycles, RX latency {rx_latency} cycles")
    assert tx_latency == crc_latency + 2
    assert rx_latency == crc_latency + {1: 3, 8: 2}[n]

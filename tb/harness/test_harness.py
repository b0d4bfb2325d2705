"""The native harness (iwarp_tb.harness) against blocks whose behaviour is known.

* Stream glue: SkidBuffer passes every packet (widths 1, 8, 64: tdata up to 512 bits) and every
  struct transfer (100 bits: a VlWide tdata) unchanged through random idle and stall cycles,
  and ``run(until_output=True)`` stops at the first output.
* Plain ports of any width: a 100-bit register ``set`` in, ``get`` out a cycle later.
* The PHY models: frames into the GMII and XGMII MACs (verified against cocotbext-eth in
  tb/eth) come out of ``m_axis`` exactly, padded to 60 bytes; a corrupted FCS is counted in
  ``rx_bad_fcs`` and flagged with ``err``; frames into ``s_axis`` come out of ``frames()`` with
  a good FCS, and one sent with ``err`` is reported bad.
* A waveform is written when asked.
"""

import random

import pytest
from amaranth import Module, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from iwarp_nic.eth import GmiiMac, XgmiiMac
from iwarp_nic.node import forward
from iwarp_nic.stream import BeatLayout, SkidBuffer
from iwarp_tb import toolchain
from iwarp_tb.beats import Packet
from iwarp_tb.harness import PHY_PINS, Harness

WIDTHS = (1, 8, 64)


def random_packets(rng, count, max_len):
    return [Packet(rng.randbytes(rng.randint(1, max_len)), rng.random() < 0.2)
            for _ in range(count)]


def drain(h, outputs, want, cycles=1_000_000):
    """Run until ``want`` items came out of each output stream; return them by stream."""
    got = {s: [] for s in outputs}
    while any(len(got[s]) < want for s in outputs):
        assert h.run(cycles, until_output=True) < cycles, f"no output for {cycles} cycles"
        for s in outputs:
            got[s] += h.pull(s)
    return got


@pytest.mark.parametrize("width", WIDTHS)
def test_beat_stream(width):
    rng = random.Random(width)
    with Harness(f"iwarp_skid_w{width}", SkidBuffer(BeatLayout(width, err=True)),
                 seed=width) as h:
        one = Packet(b"\x5a" * (2 * width + 1), True)
        h.push("s_axis", [one])
        ran = h.run(1000, until_output=True)
        assert ran == 3 + 1, "the last beat of a 3-beat packet leaves on cycle 4"
        assert h.pull("m_axis") == [one] and h.pull("m_axis") == []

        h.set_idle("s_axis", 0.3, seed=1)
        h.set_ready("m_axis", 0.6, seed=2)
        packets = random_packets(rng, 300, 300)
        h.push("s_axis", packets)
        got = drain(h, ["m_axis"], len(packets))["m_axis"]
        assert got == packets and [p.err for p in got] == [p.err for p in packets]
        assert h.pending("s_axis") == 0


def test_struct_stream():
    rng = random.Random(100)
    with Harness("harness_skid_u100", SkidBuffer(unsigned(100)), seed=3) as h:
        h.set_idle("s_axis", 0.3, seed=4)
        h.set_ready("m_axis", 0.5, seed=5)
        words = [rng.getrandbits(100) for _ in range(2000)] + [(1 << 100) - 1, 0]
        h.push("s_axis", words)
        assert drain(h, ["m_axis"], len(words))["m_axis"] == words
        with pytest.raises(ValueError):
            h.push("s_axis", [1 << 100])
        with pytest.raises(KeyError):
            h.pull("m_axis_nothing")


class WideRegister(wiring.Component):
    """``value`` is ``key + 1`` (100 bits, wrapping), registered."""

    key: In(100)
    value: Out(100)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.value.eq(self.key + 1)
        return m


def test_plain_ports():
    with Harness("harness_wide_register", WideRegister()) as h:
        for key in (0, 1 << 64, (1 << 100) - 2, 0x123456789ABCDEF0123456789):
            h.set("key", key)
            h.run(1)
            assert h.get("value") == key + 1
        assert h.cycle == 4
        with pytest.raises(ValueError):
            h.set("value", 1)
        with pytest.raises(ValueError):
            h.set("key", 1 << 100)


def udp_frame(rng, length):
    """A UDP/IPv4 frame without FCS, ``length`` >= 42 bytes."""
    head = Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") / IP(
        src="10.0.0.1", dst="10.0.0.2") / UDP(sport=rng.randrange(65536), dport=4791)
    return bytes(head / rng.randbytes(length - 42))


def padded(frame):
    return frame + bytes(max(0, 60 - len(frame)))


@pytest.mark.parametrize("phy", ["gmii", "xgmii"])
def test_phy(phy):
    rng = random.Random(phy)
    mac = {"gmii": GmiiMac, "xgmii": XgmiiMac}[phy]
    with Harness(f"iwarp_mac_{phy}", mac(), phy=phy) as h:
        # RX: frames on the pins, out of m_axis; some with a bad FCS.
        frames = [udp_frame(rng, rng.choice([42, 59, 60, 61, rng.randint(62, 1514)]))
                  for _ in range(40)]
        bad = [rng.random() < 0.25 for _ in frames]
        for frame, is_bad in zip(frames, bad):
            h.send_frame(frame, bad_fcs=is_bad)
        got = drain(h, ["m_axis"], len(frames), cycles=100_000)["m_axis"]
        assert got == [padded(f) for f in frames]
        assert [p.err for p in got] == bad
        assert h.get("rx_bad_fcs") == sum(bad)
        assert h.get("rx_frames_ok") == len(frames) - sum(bad)
        assert h.get("rx_runts") == 0

        # TX: frames into s_axis, decoded off the pins with their FCS checked.
        sent = [udp_frame(rng, rng.randint(42, 1514)) for _ in range(40)] + [Packet(
            udp_frame(rng, 100), True)]
        h.push("s_axis", sent)
        out = []
        while len(out) < len(sent):
            assert h.run(100_000, until_output=True) < 100_000, "no frame left the MAC"
            out += h.frames()
        assert out == [padded(f) for f in sent]
        assert [p.err for p in out] == [False] * (len(sent) - 1) + [True]
        assert out[-1].reasons == ["bad FCS"]
        assert h.get("tx_frames") == len(sent)
        cycles = [f.cycle for f in out]
        assert cycles == sorted(cycles) and cycles[-1] < h.cycle


class TappedMac(wiring.Component):
    """A MAC whose TX pins leave the module as tap ``tap_0``'s outputs, not as a PHY's."""

    def __init__(self, phy):
        self.mac = {"gmii": GmiiMac, "xgmii": XgmiiMac}[phy]()
        self.tx = [pin for pin, way in PHY_PINS[phy].items() if way == "out"]
        self.ports = {name: member for name, member in self.mac.signature.members.items()
                      if name not in self.tx}
        super().__init__({**self.ports, **{f"tap_0_{pin}": Out(len(getattr(self.mac, pin)))
                                           for pin in self.tx}})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = self.mac
        for name, member in self.ports.items():
            forward(m, member, getattr(self, name), getattr(self.mac, name))
        m.d.comb += [getattr(self, f"tap_0_{pin}").eq(getattr(self.mac, pin)) for pin in self.tx]
        return m


@pytest.mark.parametrize("phy", ["gmii", "xgmii"])
def test_taps(phy):
    """A tap decodes TX pins inside a module as the PHY does the MAC's."""
    rng = random.Random(phy + "tap")
    with Harness(f"iwarp_tapped_mac_{phy}", TappedMac(phy), taps=["tap_0"]) as h:
        assert h.taps == {"tap_0": phy}
        sent = [udp_frame(rng, rng.randint(42, 1514)) for _ in range(20)]
        h.push("s_axis", sent)
        out = []
        while len(out) < len(sent):
            assert h.run(100_000, until_output=True) < 100_000, "no frame left the MAC"
            out += h.tap_frames("tap_0")
        assert out == [padded(f) for f in sent] and not any(f.err for f in out)
        assert h.get("tx_frames") == len(sent)
        with pytest.raises(KeyError):
            h.tap_frames("tap_1")


def test_trace():
    path = toolchain.BUILD / "harness" / "trace-test.fst"
    with Harness("iwarp_skid_w8", SkidBuffer(BeatLayout(8, err=True)), trace=path) as h:
        h.push("s_axis", [b"traced"])
        h.run(50)
        trace = h.trace
    assert trace.suffix == (".fst" if toolchain.have_fst() else ".vcd")
    assert trace.stat().st_size > 100
    if trace.suffix == ".vcd":
        assert b"s_axis_tvalid" in trace.read_bytes()


def test_trace_pause():
    """The cycles run while tracing is off are not in the waveform: a VCD traced for 50
    cycles, paused for 200 000 (frames through the buffer meanwhile), then traced for 50 more
    has the time steps of those 100 cycles (two per cycle) and none in the gap."""
    path = toolchain.BUILD / "harness" / "trace-pause.vcd"
    with Harness("iwarp_skid_w8", SkidBuffer(BeatLayout(8, err=True)), trace=path) as h:
        h.run(50)
        paused = h.cycle
        h.tracing(False)
        for k in range(100):
            h.push("s_axis", [bytes([k]) * 64])
            h.run(2000)
        resumed = h.cycle
        h.tracing(True)
        h.run(50)
        assert len(h.pull("m_axis")) == 100
        period = round(1e6 / h.clock_mhz)
        trace = h.trace
    assert trace.suffix == ".vcd"
    times = [int(line[1:]) for line in trace.read_text().splitlines() if line[:1] == "#"]
    reset = 4   # the cycles in reset before cycle 0, traced too
    last, first = (reset + paused) * period - period // 2, (reset + resumed) * period
    assert last in times and first in times
    assert not [t for t in times if last < t < first], "time steps while paused"
    assert len(times) == 2 * (reset + 100)

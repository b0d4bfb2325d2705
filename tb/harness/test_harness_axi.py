"""The native harness's AXI ports (iwarp_tb.harness): host memory on AXI4 manager ports and a
register master on AXI4-Lite subordinate ports, against oracles written here.

* ``DmaMaster`` (widths 8 and 64: a 512-bit VlWide bus) with its client streams as harness
  streams and its ``m_axi`` on the host memory, with random latency, stalls, idle and
  back-pressure: random writes (any alignment and length, 0 included, across 4 KiB) and
  concurrent reads, checked against a Python copy of the whole memory (so a stray byte anywhere
  fails), and the memory's counters against the burst count the DMA's documented split rule
  gives. Then the shadow check (a write outside writable memory is reported exactly and leaves
  the memory as it was), and accesses beyond the memory (DECERR: a write ``done`` with
  ``error``, a read packet with ``err`` and zeros, a fault each).
* A pass-through AXI4 bridge whose subordinate side Python drives cycle by cycle: the latency
  from AR to the first R beat and from the last W beat to B, the outstanding limit, strobes
  against the shadow check, and each protocol fault (FIXED, narrow, 4 KiB, beyond the memory,
  wlast early and missing, a strobe below the start address, a valid withdrawn) with its
  response. Two bridges of 64 and 512 bits in one module: two memories, each on its own.
* ``RegisterBank`` over the example map behind ``h.registers()``: random reads and writes of
  every access kind against :class:`~iwarp_tb.axil.RegisterModel` (responses, values, RW
  outputs, doorbell transfers, ``irq``), and a write held by a stalled doorbell times out and
  then completes.

The NIC itself on these ports: ``tb/nic/test_nic_pair.py``.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from iwarp_nic.axi import Axi4, Burst, Resp
from iwarp_nic.dma import DmaCommand, DmaMaster
from iwarp_nic.host import RegisterBank
from iwarp_tb.axil import OKAY, RegisterModel, example_map
from iwarp_tb.beats import Packet
from iwarp_tb.harness import Harness, RegisterError, pack

SIZE = 1 << 20          # host memory of the DMA and bridge tests
MAX_BURST = 16          # DmaMaster's default


def dma_harness(width, **kw):
    return Harness(f"harness_dma_w{width}", DmaMaster(width, write_clients=1, read_clients=1),
                   params=("DmaMaster", width, 1, 1), memory_bytes=SIZE, **kw)


def bursts(addr, length, n):
    """The beats of each burst of a DMA command: cut at every multiple of
    ``min(MAX_BURST * n, 4096)`` bytes (the rule of iwarp_nic.dma.split)."""
    chunk = min(MAX_BURST * n, 4096)
    out, end = [], addr + length
    while addr < end:
        cut = min(end, (addr // chunk + 1) * chunk)
        out.append(-(-cut // n) - addr // n)
        addr = cut
    return out


def ranges(rng, count, start, stop):
    """``count`` disjoint ``(addr, length)`` in ``[start, stop)``, many near 4 KiB."""
    out, at = [], start
    for _ in range(count):
        at += rng.randint(0, 100)
        if rng.random() < 0.3:
            at = max(at, (at | 0xFFF) + 1 - rng.randint(1, 200))
        length = rng.choice([0, rng.randint(1, 130), rng.randint(1, 3000)])
        if at + length > stop:
            break
        out.append((at, length))
        at += length
    return out


def run_dma(h, n, writes, reads, cycles=2_000_000):
    """Issue ``writes`` (``(addr, data)``) and ``reads`` (``(addr, length)``, lengths 1 or
    more) at once; return the ``done`` errors and the read packets."""
    h.push("s_axis_write0_command", [pack(DmaCommand, addr=a, length=len(d)) for a, d in writes])
    h.push("s_axis_write0_data", [d for _, d in writes if d])
    h.push("s_axis_read0_command", [pack(DmaCommand, addr=a, length=k) for a, k in reads])
    done, data = [], []
    while len(done) < len(writes) or len(data) < len(reads):
        assert h.run(cycles, until_output=True) < cycles, "the DMA stopped"
        done += h.pull("m_axis_write0_done")
        data += h.pull("m_axis_read0_data")
    assert len(done) == len(writes) and len(data) == len(reads)
    return done, data


@pytest.mark.parametrize("width", [8, 64])
def test_dma_random(width):
    rng = random.Random(width)
    with dma_harness(width, seed=width) as h:
        mem = h.memory()
        assert mem.data_bytes == width and mem.size == SIZE
        shadow = bytearray(rng.randbytes(SIZE))
        mem.write(0, shadow)
        mem.allow(0, SIZE // 2)
        mem.configure(latency=rng.choice([0, 7, 60]), stall=0.3, seed=width)
        for i, stream in enumerate(("s_axis_write0_command", "s_axis_write0_data",
                                    "s_axis_read0_command")):
            h.set_idle(stream, 0.2, seed=10 + i)
        h.set_ready("m_axis_write0_done", 0.7, seed=20)
        h.set_ready("m_axis_read0_data", 0.7, seed=21)

        # Writes to the lower half and reads of the upper half (never written) at once.
        writes = [(a, rng.randbytes(k)) for a, k in ranges(rng, 300, 0, SIZE // 2)]
        reads = [(a, k) for a, k in ranges(rng, 300, SIZE // 2, SIZE) if k]
        done, data = run_dma(h, width, writes, reads)
        assert done == [0] * len(writes)
        assert data == [shadow[a:a + k] for a, k in reads]
        assert not any(p.err for p in data)
        for a, d in writes:
            shadow[a:a + len(d)] = d
        assert mem.read(0, SIZE) == shadow

        # Then everything written, read back.
        back = [(a, len(d)) for a, d in writes if d]
        _, data = run_dma(h, width, [], back)
        assert data == [shadow[a:a + k] for a, k in back]

        assert mem.violations() == [] and mem.faults() == []
        write_beats = [b for a, d in writes for b in bursts(a, len(d), width)]
        read_beats = [b for a, k in reads + back for b in bursts(a, k, width)]
        assert mem.stats() == {
            "read_bursts": len(read_beats), "write_bursts": len(write_beats),
            "read_bytes": width * sum(read_beats), "write_bytes": sum(len(d) for _, d in writes),
            "violations": 0, "faults": 0}


def test_dma_shadow_and_errors():
    rng = random.Random(1)
    with dma_harness(8, seed=1) as h:
        mem = h.memory()
        shadow = bytearray(rng.randbytes(SIZE))
        mem.write(0, shadow)
        mem.allow(0, 0x10000)
        mem.allow(SIZE - 4096, 4096)
        mem.configure(latency=3, stall=0.2, seed=2)

        # Not writable at all; half writable (two bursts, cut at 0x10000); beyond the memory.
        stray, straddle, beyond = (rng.randbytes(300), rng.randbytes(32), rng.randbytes(16))
        start = h.cycle
        done, _ = run_dma(h, 8, [(0x20000, stray), (0xFFF0, straddle), (SIZE - 8, beyond)], [])
        assert done == [0, 0, 1]
        shadow[0xFFF0:0x10000] = straddle[:16]
        shadow[SIZE - 8:SIZE] = beyond[:8]
        assert mem.read(0, SIZE) == shadow

        # One violation per burst with stray bytes: together exactly the stray ranges.
        found = mem.violations()
        assert all(start <= cycle < h.cycle for _, _, cycle in found)
        cycles = [cycle for _, _, cycle in found]
        assert cycles == sorted(cycles)
        covered = sorted((a, a + k) for a, k, _ in found)
        assert covered[0][0] == 0x10000 and covered[0][1] == 0x10010
        assert covered[1][0] == 0x20000 and covered[-1][1] == 0x20000 + len(stray)
        assert all(a == b for (_, b), (a, _) in zip(covered[1:], covered[2:]))
        assert len(found) == 1 + len(bursts(0x20000, len(stray), 8))

        # Reads beyond the memory: err, zeros where nothing is; the good burst's bytes stand.
        _, data = run_dma(h, 8, [], [(SIZE - 4, 12), (1 << 40, 5)])
        assert data == [Packet(shadow[SIZE - 4:] + bytes(8), True), Packet(bytes(5), True)]
        faults = mem.faults()
        assert len(faults) == 3 and all("beyond the memory" in f for f in faults)
        assert "write burst at 0x100000" in faults[0] and "read burst at 0x10000000000" in faults[2]
        stats = mem.stats()
        assert stats["faults"] == 3 and stats["violations"] == len(found)
        assert stats["write_bytes"] == 16 + 8


class AxiBridge(wiring.Component):
    """For each ``side`` of ``sides`` (``{side: data_bytes}``), an AXI4 subordinate port
    ``<side>s_axi`` wired straight to the manager port ``<side>m_axi``: Python drives the
    manager side through plain ports. ``<side>w_beats`` counts the W transfers."""

    def __init__(self, sides):
        self.sides = sides
        members = {}
        for side, n in sides.items():
            members[f"{side}s_axi"] = In(Axi4(addr_width=32, data_bytes=n))
            members[f"{side}m_axi"] = Out(Axi4(addr_width=32, data_bytes=n))
            members[f"{side}w_beats"] = Out(32)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for side in self.sides:
            sub, man = getattr(self, f"{side}s_axi"), getattr(self, f"{side}m_axi")
            for name, member in man.signature.members.items():
                src, dst = (sub, man) if member.flow == Out else (man, sub)
                m.d.comb += getattr(dst, name).eq(getattr(src, name))
            beats = getattr(self, f"{side}w_beats")
            with m.If(man.wvalid & man.wready):
                m.d.sync += beats.eq(beats + 1)
        return m


class Manager:
    """A bridge's subordinate side ``prefix`` (``data_bytes`` wide), one cycle at a time."""

    def __init__(self, h, prefix="s_axi", data_bytes=8):
        self.h, self.prefix, self.full = h, prefix, (1 << data_bytes) - 1
        self.size = data_bytes.bit_length() - 1  # axsize of a full-width beat
        self.last_beat = None  # the cycle the last W beat was taken
        self.beats = 0         # W beats taken

    def set(self, name, value):
        self.h.set(f"{self.prefix}_{name}", value)

    def cycle(self, **drive):
        """Drive ``<prefix>_<name>`` = value for the next cycle, run it, and return what the
        memory drove during it (``awready``, ``rvalid``, ``rdata``, ...)."""
        for name, value in drive.items():
            self.set(name, value)
        self.h.run(1)
        return {name: self.h.get(f"{self.prefix}_{name}")
                for name in ("awready", "wready", "arready", "bvalid", "bresp", "bid", "rvalid",
                             "rdata", "rresp", "rlast", "rid")}

    def address(self, channel, addr, beats, *, size=None, burst=Burst.INCR, axi_id=0):
        """Offer an AW or AR (full width by default) until it is taken; return the cycle it was
        taken."""
        fields = {"addr": addr, "len": beats - 1, "size": self.size if size is None else size,
                  "burst": burst, "id": axi_id, "valid": 1}
        drive = {f"{channel}{k}": v for k, v in fields.items()}
        while not self.cycle(**drive)[f"{channel}ready"]:
            drive = {}
        self.set(f"{channel}valid", 0)
        return self.h.cycle - 1

    def beat(self, data, strb=None, last=1):
        """Offer one W beat (every strobe set by default) until it is taken; return the cycle
        it was taken."""
        drive = {"wdata": data, "wstrb": self.full if strb is None else strb, "wlast": last,
                 "wvalid": 1}
        while not self.cycle(**drive)["wready"]:
            drive = {}
        self.set("wvalid", 0)
        self.last_beat = self.h.cycle - 1
        self.beats += 1
        return self.last_beat

    def response(self):
        """Take the next B; return ``(cycle offered, bresp, bid)``."""
        while not (got := self.cycle(bready=1))["bvalid"]:
            pass
        self.set("bready", 0)
        return self.h.cycle - 1, got["bresp"], got["bid"]

    def read_data(self, beats):
        """Take ``beats`` R beats; return the cycle of the first and ``(rdata, rresp, rlast,
        rid)`` of each."""
        out, first = [], None
        while len(out) < beats:
            got = self.cycle(rready=1)
            if got["rvalid"]:
                first = self.h.cycle - 1 if first is None else first
                out.append((got["rdata"], got["rresp"], got["rlast"], got["rid"]))
        self.set("rready", 0)
        return first, out

    def write(self, addr, words, strbs=None, lasts=None):
        """One write burst of ``words``; its ``bresp``."""
        self.address("aw", addr, len(words))
        for k, word in enumerate(words):
            self.beat(word, None if strbs is None else strbs[k],
                      int(k == len(words) - 1) if lasts is None else lasts[k])
        return self.response()[1]


def test_bridge_timing_and_faults():
    rng = random.Random(3)
    with Harness("harness_axi_bridge", AxiBridge({"": 8}), memory_bytes=SIZE) as h:
        assert "s_axi_awvalid" in h._ports and "m_axi_awvalid" not in h._ports
        mem, bus = h.memory(), Manager(h)
        image = bytearray(rng.randbytes(SIZE))
        mem.write(0, image)

        # Latency: AR to the first R beat, the last W beat to B; then back to back; IDs echoed.
        # The writes are to memory not writable: violations, the memory unchanged.
        lasts = []
        for latency in (0, 1, 9):
            mem.configure(latency=latency)
            taken = bus.address("ar", 0x40, 4, axi_id=latency + 1)
            first, beats = bus.read_data(4)
            assert first == taken + 1 + latency
            words = [int.from_bytes(image[0x40 + 8 * k:0x48 + 8 * k], "little") for k in range(4)]
            assert beats == [(w, Resp.OKAY, int(k == 3), latency + 1) for k, w in enumerate(words)]
            bus.address("aw", 0x80, 1, axi_id=latency + 2)
            lasts.append(bus.beat(0x1122334455667788))
            assert bus.response() == (lasts[-1] + 1 + latency, Resp.OKAY, latency + 2)
        assert mem.violations() == [(0x80, 8, last) for last in lasts]
        assert mem.read(0x80, 8) == image[0x80:0x88]
        mem.configure()

        # Strobes, with the shadow check: lanes 0-3 of beat 0 writable, lanes 4-7 of beat 1 not.
        mem.allow(0x100, 4)
        assert bus.write(0x100, [0xAAAAAAAA_11223344, 0x55667788_BBBBBBBB], [0x0F, 0xF0]) == 0
        image[0x100:0x104] = (0x11223344).to_bytes(4, "little")
        assert mem.read(0x100, 16) == image[0x100:0x110]
        assert mem.violations()[-1] == (0x10C, 4, bus.last_beat)
        # An unaligned start: lanes 3-7 of the first beat; a strobe below is a fault.
        mem.allow(0x200, 16)
        assert bus.write(0x203, [0x0102030405060708, 0x1111111111111111], [0xF8, 0x01]) == 0
        image[0x203:0x208] = (0x0102030405060708).to_bytes(8, "little")[3:]
        image[0x208] = 0x11
        assert bus.write(0x213, [0xFFFF_FFFF_FFFF_FFFF], [0x0C]) == Resp.SLVERR
        assert mem.read(0x200, 0x20) == image[0x200:0x220]
        assert mem.faults()[-1].endswith("write burst at 0x213, 1 beats: wstrb set below the "
                                         "start address")

        # Each protocol fault: its response, nothing written, zeros read, a line of text.
        mem.allow(0, SIZE)
        cases = [
            (dict(addr=0x300, beats=2, burst=Burst.FIXED), Resp.SLVERR, "axburst 0, not INCR"),
            (dict(addr=0x300, beats=2, burst=Burst.WRAP), Resp.SLVERR, "axburst 2, not INCR"),
            (dict(addr=0x300, beats=2, size=2), Resp.SLVERR, "axsize 2, not the full width 3"),
            (dict(addr=0xFF8, beats=2), Resp.SLVERR, "crosses a 4 KiB boundary"),
            (dict(addr=SIZE - 8, beats=2), Resp.DECERR, "beyond the memory (DECERR)"),
        ]
        for fields, resp, why in cases:
            before = len(mem.faults())
            addr, beats = fields.pop("addr"), fields.pop("beats")
            bus.address("ar", addr, beats, **fields)
            _, got = bus.read_data(beats)
            assert got == [(0, resp, int(k == beats - 1), 0) for k in range(beats)]
            bus.address("aw", addr, beats, **fields)
            bus.beat(rng.getrandbits(64), last=0)
            bus.beat(rng.getrandbits(64))
            assert bus.response()[1] == resp
            faults = mem.faults()[before:]
            assert len(faults) == 2 and all(f.endswith(why) for f in faults), faults
            assert faults[0].startswith("cycle ") and "read burst" in faults[0]
        assert bus.write(0x400, [1, 2, 3], lasts=[0, 1, 1]) == Resp.SLVERR
        assert "wlast on beat 2" in mem.faults()[-1]
        assert bus.write(0x400, [1, 2], lasts=[0, 0]) == Resp.SLVERR
        assert "no wlast on the last beat" in mem.faults()[-1]
        assert mem.read(0, SIZE) == image

        # Many reads outstanding, then ready stays low until R beats are taken.
        taken = bus.cycle(araddr=0x1000, arlen=0, arsize=3, arburst=Burst.INCR,
                          arvalid=1)["arready"]
        taken += sum(bus.cycle()["arready"] for _ in range(199))
        assert 32 <= taken < 200
        bus.set("arvalid", 0)
        _, got = bus.read_data(taken)
        assert got == [(int.from_bytes(image[0x1000:0x1008], "little"), 0, 1, 0)] * taken

        # A valid withdrawn before its ready (every ready low).
        mem.configure(stall=1.0)
        before = len(mem.faults())
        assert not bus.cycle(awaddr=0x500, awlen=0, awvalid=1)["awready"]
        bus.cycle(awvalid=0)
        assert mem.faults()[before:] == [f"cycle {h.cycle - 1}: AW valid dropped before ready"]
        stats = mem.stats()
        assert stats["faults"] == len(mem.faults()) and stats["violations"] == 4
        assert h.get("w_beats") == bus.beats


def test_two_memories():
    """Two manager ports of different widths (64 and 512 bits) in one module: each its own
    memory, latency and counters."""
    rng = random.Random(5)
    widths = {"a_": 8, "b_": 64}
    with Harness("harness_axi_bridge_pair", AxiBridge(widths), memory_bytes=1 << 16) as h:
        assert set(h._ports) == {"a_w_beats", "b_w_beats"} | {
            f"{side}s_axi_{name}" for side in widths for name in Axi4().members}
        mems = {side: h.memory(f"{side}m_axi") for side in widths}
        buses = {side: Manager(h, f"{side}s_axi", n) for side, n in widths.items()}
        with pytest.raises(KeyError):
            h.memory()
        images = {side: bytearray(1 << 16) for side in widths}
        for side, n in widths.items():
            mems[side].allow(0, 1 << 16)
            assert mems[side].data_bytes == n
        mems["b_"].configure(latency=4)
        for side, n in [*widths.items(), *widths.items()]:
            addr = rng.randrange(0, 1 << 16, 4096) + rng.randrange(0, 4096 - 4 * n, n)
            words = [rng.getrandbits(8 * n) for _ in range(3)]
            strbs = [rng.getrandbits(n) for _ in words]
            assert buses[side].write(addr, words, strbs) == Resp.OKAY
            for k, (word, strb) in enumerate(zip(words, strbs)):
                for lane in range(n):
                    if strb >> lane & 1:
                        images[side][addr + k * n + lane] = word >> 8 * lane & 0xFF
            taken = buses[side].address("ar", addr, 3)
            first, got = buses[side].read_data(3)
            assert first == taken + 1 + (4 if side == "b_" else 0)
            image = images[side]
            assert [g[0] for g in got] == [int.from_bytes(image[addr + k * n:addr + (k + 1) * n],
                                                          "little") for k in range(3)]
        for side in widths:
            assert mems[side].read(0, 1 << 16) == images[side]
            assert mems[side].stats()["write_bursts"] == 2
            assert h.get(f"{side}w_beats") == 6


def test_registers():
    rng = random.Random(4)
    regmap = example_map()
    model = RegisterModel(regmap)
    with Harness("harness_csr_example", RegisterBank(regmap), seed=4) as h:
        regs = h.registers()
        assert regs.data_bytes == 4 and "s_axil_awvalid" not in h._ports
        for name in ("doorbell", "kick"):
            h.set_ready(f"m_axis_{name}", 0.6, seed=len(name))
        got = {"doorbell": [], "kick": []}

        def check_outputs():
            for (name, _), value in model.rw.items():
                assert h.get(name) == value, name
            assert h.get("irq") == model.irq
            for name in got:
                got[name] += h.pull(f"m_axis_{name}")
                width = regmap[name].width
                want = [p["value"] | p.get("index", 0) << width for p in model.pulses[name]]
                assert got[name] == want, name

        def access(kind, addr, value=0):
            want = model.write(addr, value, 0xF) if kind == "write" else model.read(addr)
            want_resp = want if kind == "write" else want[1]
            try:
                answer = regs.write(addr, value) if kind == "write" else regs.read(addr)
            except RegisterError as e:
                assert (e.kind, e.addr, e.resp) == (kind, addr, want_resp)
                return want_resp
            assert want_resp == OKAY
            if kind == "read":
                assert answer == want[0], hex(addr)
            return OKAY

        for word in regmap.words():
            access("read", word.offset)
        counts = {"read": [0, 0], "write": [0, 0]}
        for _ in range(800):
            if rng.random() < 0.1:
                for key in model.inputs:
                    model.inputs[key] = rng.getrandbits(regmap[key[0]].width)
                for name in ("id", "link", "rx_packets"):
                    h.set(name, model.inputs[(name, 0)])
                h.set("qp_state", sum(model.inputs[("qp_state", k)] << 4 * k for k in range(4)))
            if rng.random() < 0.15:
                events = rng.getrandbits(3)
                h.set("int_status", events)
                h.run(1)
                h.set("int_status", 0)
                model.status["int_status"] |= events
            addr = (rng.choice(regmap.words()).offset if rng.random() < 0.8
                    else rng.randrange(0x400) & ~3)
            kind = rng.choice(["read", "write"])
            resp = access(kind, addr, rng.getrandbits(32))
            counts[kind][resp != OKAY] += 1
            check_outputs()
        assert min(min(c) for c in counts.values()) > 15, counts

        # A doorbell that cannot leave holds its write's response: a timeout; once it leaves,
        # the next access waits for that response first, then goes on.
        h.set_ready("m_axis_doorbell", 0.0)
        model.write(0x108, 0x1234, 0xF)
        before = h.cycle
        with pytest.raises(TimeoutError):
            regs.write(0x108, 0x1234, timeout=300)
        assert h.cycle == before + 300
        h.set_ready("m_axis_doorbell", 1.0)
        assert access("read", 0x04) == OKAY
        check_outputs()
        with pytest.raises(ValueError):
            regs.write(0x04, 1 << 32)


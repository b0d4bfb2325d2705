"""An AXI4-Lite manager model (ARM IHI 0022, part B) for either simulator, with random timing,
that checks the subordinate's side of the handshake rules as it goes.

It drives the channels through the bus adapters of :mod:`iwarp_tb.streams` (``AmaranthBus`` or
``CocotbBus``). Writes can be pipelined (several outstanding), and each write offers its AW and
W transfers in a random order: AW first, W first, or both in one cycle. ``bready`` and
``rready`` are dropped at random. Checked on the subordinate: a response never comes before its
request (B before both AW and W were taken, R before AR), and a response offered but not taken
holds its value. While a channel is idle its payload lines carry random values, so a
subordinate that samples them without ``valid`` is found out.

:class:`RegisterModel` is a reference model of a register map's behaviour on the bus, and
:func:`example_map` the small map with every access kind that the register tests use.
"""

import random
from dataclasses import dataclass

from iwarp_nic.host.regmap import PULSE, RO, RW, W1C, Field, Register, RegisterMap

from .streams import StreamTimeout

__all__ = ["SIGNALS", "OKAY", "EXOKAY", "SLVERR", "DECERR", "AxiLitePort", "AxiLiteManager",
           "AxiLiteProtocolError", "RegisterModel", "example_map"]

OKAY, EXOKAY, SLVERR, DECERR = 0, 1, 2, 3
M32 = 0xFFFF_FFFF

SIGNALS = ("awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
           "bresp", "bvalid", "bready", "araddr", "arprot", "arvalid", "arready", "rdata",
           "rresp", "rvalid", "rready")

#: How a write offers its AW and W transfers.
ORDERS = ("aw_first", "w_first", "together")


class AxiLiteProtocolError(AssertionError):
    """The subordinate broke an AXI4-Lite handshake rule."""


@dataclass
class AxiLitePort:
    """The channel signals of one AXI4-Lite port, by AXI name, and its widths."""

    signals: dict
    addr_width: int
    data_bytes: int

    @classmethod
    def amaranth(cls, iface):
        """An ``AxiLite`` interface object (e.g. ``dut.s_axil``) in the Amaranth simulator."""
        sig = iface.signature
        return cls({n: getattr(iface, n) for n in SIGNALS}, sig.addr_width, sig.data_bytes)

    @classmethod
    def prefixed(cls, dut, prefix="s_axil"):
        """Ports ``<prefix>_awaddr``, ... of a generated module under cocotb."""
        signals = {n: getattr(dut, f"{prefix}_{n}") for n in SIGNALS}
        return cls(signals, len(signals["awaddr"]), len(signals["wdata"]) // 8)

    def __getattr__(self, name):
        try:
            return self.signals[name]
        except KeyError:
            raise AttributeError(name) from None


class AxiLiteManager:
    """Issue AXI4-Lite writes and reads on ``port`` through ``bus``.

    ``idle`` is the chance per cycle that a channel with something to send waits a cycle
    first, ``stall`` the chance per cycle that ``bready``/``rready`` is low; ``outstanding``
    bounds the writes (reads) issued and not yet answered. Without ``rng`` every channel goes
    at once and ready is always high. The write side and the read side may run at the same time
    from two coroutines (:meth:`writes` and :meth:`reads`, even of two managers on one port),
    never one side from two: each drives only its own side's signals.
    """

    def __init__(self, bus, port, *, rng=None, idle=0.0, stall=0.0, outstanding=4,
                 timeout=10_000):
        if outstanding < 1:
            raise ValueError("outstanding must be 1 or more")
        self.bus, self.port, self.rng = bus, port, rng
        self.idle, self.stall, self.outstanding, self.timeout = idle, stall, outstanding, timeout

    def _go(self):
        return self.rng is None or self.rng.random() >= self.idle

    def _ready(self):
        return int(self.rng is None or self.rng.random() >= self.stall)

    def _noise(self, *names):
        """Random values on idle payload lines."""
        rng = self.rng or random.Random(0)
        widths = {"awaddr": self.port.addr_width, "araddr": self.port.addr_width,
                  "wdata": 8 * self.port.data_bytes, "wstrb": self.port.data_bytes}
        for name in names:
            self.bus.set(self.port.signals[name], rng.getrandbits(widths[name]))

    async def writes(self, ops):
        """Write each ``(addr, data, strb)`` (``strb`` None: all bytes); return the ``bresp``
        of each, in order."""
        bus, port = self.bus, self.port
        full = (1 << port.data_bytes) - 1
        ops = [(a, d, full if s is None else s) for a, d, s in ops]
        n = len(ops)
        orders = [self.rng.choice(ORDERS) if self.rng else "together" for _ in ops]
        aw = w = b = 0              # AW and W transfers taken, B responses taken
        aw_on = w_on = False
        held = None                 # a B response offered and not taken at the last edge
        resps, quiet = [], 0
        self._noise("awaddr", "wdata", "wstrb")
        while b < n:
            room_aw, room_w = aw < n and aw - b < self.outstanding, w < n and w - b < \
                self.outstanding
            if not aw_on and not w_on and aw == w and room_aw and orders[aw] == "together":
                aw_on = w_on = self._go()
            if not aw_on and room_aw and (orders[aw] == "aw_first" or
                                          orders[aw] == "w_first" and w > aw):
                aw_on = self._go()
            if not w_on and room_w and (orders[w] == "w_first" or
                                        orders[w] == "aw_first" and aw > w):
                w_on = self._go()
            if aw_on:
                bus.set(port.awaddr, ops[aw][0])
                bus.set(port.awprot, 0)
            if w_on:
                bus.set(port.wdata, ops[w][1])
                bus.set(port.wstrb, ops[w][2])
            bus.set(port.awvalid, int(aw_on))
            bus.set(port.wvalid, int(w_on))
            bready = self._ready()
            bus.set(port.bready, bready)
            awready, wready, bvalid, bresp = await bus.edge(port.awready, port.wready,
                                                            port.bvalid, port.bresp)
            if held is not None and (not bvalid or bresp != held):
                raise AxiLiteProtocolError(f"write {b}: B response {held} withdrawn or changed "
                                           f"before it was taken (now valid={bvalid}, "
                                           f"bresp={bresp})")
            if bvalid and not (aw > b and w > b):
                raise AxiLiteProtocolError(f"write {b}: bvalid before its AW and W were taken")
            progress = False
            if bvalid and bready:
                resps.append(bresp)
                b += 1
                progress = True
            held = bresp if bvalid and not bready else None
            if aw_on and awready:
                aw, aw_on, progress = aw + 1, False, True
                self._noise("awaddr")
            if w_on and wready:
                w, w_on, progress = w + 1, False, True
                self._noise("wdata", "wstrb")
            quiet = 0 if progress else quiet + 1
            if quiet > self.timeout:
                raise StreamTimeout(f"AXI-Lite writes: no progress for {self.timeout} cycles "
                                    f"(AW {aw}, W {w}, B {b} of {n})")
        bus.set(port.awvalid, 0)
        bus.set(port.wvalid, 0)
        bus.set(port.bready, 0)
        return resps

    async def reads(self, addrs):
        """Read each address; return ``(rdata, rresp)`` of each, in order."""
        bus, port = self.bus, self.port
        addrs = list(addrs)
        n = len(addrs)
        ar = r = 0
        ar_on = False
        held = None
        out, quiet = [], 0
        self._noise("araddr")
        while r < n:
            if not ar_on and ar < n and ar - r < self.outstanding:
                ar_on = self._go()
            if ar_on:
                bus.set(port.araddr, addrs[ar])
                bus.set(port.arprot, 0)
            bus.set(port.arvalid, int(ar_on))
            rready = self._ready()
            bus.set(port.rready, rready)
            arready, rvalid, rdata, rresp = await bus.edge(port.arready, port.rvalid,
                                                           port.rdata, port.rresp)
            if held is not None and (not rvalid or (rdata, rresp) != held):
                raise AxiLiteProtocolError(f"read {r}: R {held} withdrawn or changed before it "
                                           f"was taken (now valid={rvalid}, {rdata, rresp})")
            if rvalid and not ar > r:
                raise AxiLiteProtocolError(f"read {r}: rvalid before its AR was taken")
            progress = False
            if rvalid and rready:
                out.append((rdata, rresp))
                r += 1
                progress = True
            held = (rdata, rresp) if rvalid and not rready else None
            if ar_on and arready:
                ar, ar_on, progress = ar + 1, False, True
                self._noise("araddr")
            quiet = 0 if progress else quiet + 1
            if quiet > self.timeout:
                raise StreamTimeout(f"AXI-Lite reads: no progress for {self.timeout} cycles "
                                    f"(AR {ar}, R {r} of {n})")
        bus.set(port.arvalid, 0)
        bus.set(port.rready, 0)
        return out

    async def write(self, addr, data, strb=None):
        """One write; its ``bresp``."""
        return (await self.writes([(addr, data, strb)]))[0]

    async def read(self, addr):
        """One read; ``(rdata, rresp)``."""
        return (await self.reads([addr]))[0]


def example_map():
    """A small map with every access kind, for the register tests (Amaranth and cocotb)."""
    return RegisterMap("iwarp_nic", [
        Register("id", 0x00, RO, [Field("version", 0, 8, "format version"),
                                  Field("magic", 16, 16, "0x1a4b")], "identity"),
        Register("scratch", 0x04, RW, doc="free for the driver", reset=0x1234_5678),
        Register("ctrl", None, RW, [Field("enable", 0), Field("mode", 4, 3)], width=7,
                 reset=0x30),
        Register("rx_packets", 0x10, RO, width=64, doc="a 64-bit counter"),
        Register("ring_base", 0x18, RW, [Field("page", 12, 52)], width=64),
        Register("int_status", 0x20, W1C, [Field("rx", 0), Field("tx", 1), Field("err", 2)],
                 width=3, enable="int_enable"),
        Register("int_enable", 0x24, RW, width=3),
        Register("link", 0x28, RO, [Field("up", 0), Field("speed", 1, 4)], width=5),
        Register("kick", 0x2C, PULSE, width=16),
        Register("qp_state", 0x40, RO, width=4, count=4),
        Register("doorbell", 0x100, PULSE, [Field("tail", 0, 16), Field("arm", 31)], count=16,
                 stride=8),
    ])


class RegisterModel:
    """What the registers of a :class:`~iwarp_nic.host.regmap.RegisterMap` answer, written from
    the description of the access kinds in :mod:`iwarp_nic.host.regmap` (not from the bank).

    ``inputs`` are the RO inputs and ``status`` the W1C bits (set them as the gateware would:
    ``status[name] |= events``); ``rw`` the stored values, ``pulses`` the stream transfers
    each write to a PULSE register makes (``{"value", "index"}``), ``irq`` the interrupt."""

    def __init__(self, regmap):
        self.map = regmap
        self.rw = {(r.name, i): r.reset for r in regmap if r.access == RW for i in range(r.count)}
        self.status = {r.name: 0 for r in regmap if r.access == W1C}
        self.inputs = {(r.name, i): 0 for r in regmap if r.access == RO for i in range(r.count)}
        self.latch = dict.fromkeys(self.inputs, 0)
        self.pulses = {r.name: [] for r in regmap if r.access == PULSE}

    def read(self, addr):
        word = self.map.word_at(addr)
        if word is None:
            return 0, SLVERR
        reg, key, shift = word.register, (word.register.name, word.index), 32 * word.half
        if reg.access == RO:
            if word.half == 0:
                self.latch[key] = self.inputs[key] >> 32
                return self.inputs[key] & M32, OKAY
            return self.latch[key], OKAY
        if reg.access == RW:
            return self.rw[key] >> shift & M32, OKAY
        if reg.access == W1C:
            return self.status[reg.name] >> shift & M32, OKAY
        return 0, OKAY

    def write(self, addr, data, strb):
        word = self.map.word_at(addr)
        if word is None or word.register.access == RO:
            return SLVERR
        reg, key, shift = word.register, (word.register.name, word.index), 32 * word.half
        strobed = sum(0xFF << 8 * k for k in range(4) if strb >> k & 1)
        bits = ((1 << reg.width) - 1) >> shift & M32
        if reg.access == RW:
            old = self.rw[key] >> shift & bits
            new = (old & ~strobed | data & strobed) & bits
            self.rw[key] = self.rw[key] & ~(bits << shift) | new << shift
        elif reg.access == W1C:
            self.status[reg.name] &= ~((data & strobed & bits) << shift)
        else:
            pulse = {"value": data & strobed & bits}
            if reg.count > 1:
                pulse["index"] = word.index
            self.pulses[reg.name].append(pulse)
        return OKAY

    @property
    def irq(self):
        return int(any(self.status[r.name] & self.rw[(r.enable, 0)]
                       for r in self.map if r.enable))

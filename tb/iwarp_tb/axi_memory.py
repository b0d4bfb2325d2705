"""An AXI4 subordinate memory for testbenches, with the protocol rules of ARM IHI 0022 checked.

:class:`AxiMemory` answers a manager's AXI4 port (the members of :class:`iwarp_nic.axi.Axi4`)
from a sparse byte memory, with random stalls on every channel, random write-response and
read-data latency and any number of reads outstanding, and fails the test (``AssertionError``
from the testbench, naming the cycle) when the manager breaks a rule:

* a handshake channel (AW, W, AR) withdraws ``VALID`` or changes its payload before ``READY``
  (A3.2.1);
* a burst is not INCR, not full width (``axsize`` must be log2 of the bus width, as this
  design always uses it), or crosses a 4 KiB boundary (A3.4.1), or is longer than
  ``max_burst`` when one is given;
* ``wlast`` is not exactly on a burst's last beat, or ``wstrb`` has a lane outside the burst's
  addresses (below an unaligned start address, A3.4.3);
* a write strobes a byte outside the ranges registered with :meth:`allow_write` (the shadow
  check: a DMA engine must never touch memory it was not told to);
* responses: ``bid``/``rid`` echo the request's ID; everything answers in request order.

The writes and reads seen are recorded (``bursts``, the cycle of every data beat in
``w_cycles`` and ``r_cycles``) with counters (``max_reads``, the most read bursts in flight),
so tests can measure throughput. :meth:`inject_error` makes bursts that touch a range answer
SLVERR (such a write changes nothing).

It works through a bus adapter of :mod:`iwarp_tb.streams` (``set`` and ``edge``), so in both
simulators: :meth:`AxiMemory.bench` gives an Amaranth-simulator testbench (run it as a monitor,
on the DUT's ``m_axi`` member); under cocotb, ``cocotb.start_soon(AxiMemory.from_prefix(dut,
"m_axi", n).run(CocotbBus(dut.clk)))`` serves a generated module's ports.
"""

import random
from dataclasses import dataclass, field

from .streams import AmaranthBus

__all__ = ["AxiMemory", "BurstRecord", "OKAY", "SLVERR"]

OKAY, SLVERR = 0, 2
_INCR = 1
_PAGE = 4096

# What the manager drives, per channel, and what the subordinate drives.
_AW = ("awid", "awaddr", "awlen", "awsize", "awburst")
_W = ("wdata", "wstrb", "wlast")
_AR = ("arid", "araddr", "arlen", "arsize", "arburst")
_SAMPLED = (("awvalid",) + _AW + ("wvalid",) + _W + ("bready", "arvalid") + _AR + ("rready",))


@dataclass
class BurstRecord:
    """A burst as the manager asked for it: ``kind`` "write" or "read", first-byte ``addr``,
    ``beats``, the ``cycle`` its address was taken, its response ``resp``."""
    kind: str
    addr: int
    beats: int
    cycle: int
    id: int = 0
    resp: int = OKAY
    b_cycle: int = None                                     # write: its response taken
    data: list = field(default_factory=list, repr=False)   # write: (data, strb) per beat


class AxiMemory:
    """A sparse memory behind an AXI4 subordinate port.

    Parameters
    ----------
    port : object
        Anything with the AXI4 signals as attributes named as in
        :class:`iwarp_nic.axi.Axi4` (``awvalid``, ``wdata``, ...): the DUT's ``m_axi`` member
        under the Amaranth simulator; see :meth:`from_prefix` for a generated module.
    data_bytes : int
        The data bus width in bytes.
    rng : random.Random
        For stalls, latencies and the garbage in lanes a read burst does not cover.
    stall : float
        Probability per cycle that each of ``awready``, ``wready``, ``arready`` is low, and that
        a B or R transfer not yet offered is held back a cycle.
    b_latency, r_latency : (int, int)
        Cycles (inclusive range, drawn per burst) from a write burst's last data beat (and its
        address) to its response being offered, and from a read address to the first data beat.
    max_burst : int or None
        Fail on bursts longer than this.
    read_limit : int or None
        Hold ``arready`` low while this many read bursts are in flight.

    Write data may come before its address (A3.3.1 allows it); the beats wait for it.
    ``max_reads`` and ``max_writes`` are the most bursts seen in flight (address taken, last
    data beat or response not yet transferred).
    """

    def __init__(self, port, data_bytes, *, rng=None, stall=0.0, b_latency=(1, 1),
                 r_latency=(1, 1), max_burst=None, read_limit=None):
        self.port, self.n = port, data_bytes
        self.size = data_bytes.bit_length() - 1
        if 1 << self.size != data_bytes:
            raise ValueError(f"data_bytes must be a power of two, not {data_bytes}")
        self.rng = rng or random.Random(0)
        self.stall, self.b_latency, self.r_latency = stall, b_latency, r_latency
        self.max_burst, self.read_limit = max_burst, read_limit
        self.pages = {}
        self.writable = []                      # [start, end) ranges; None: no shadow check
        self.errors = []                        # (start, end, kinds)
        self.cycle = 0
        self.bursts = []
        self.w_cycles, self.r_cycles = [], []
        self.reads_in_flight = self.max_reads = 0
        self.writes_in_flight = self.max_writes = 0
        self._held = {}                         # channel -> payload seen with VALID, not READY
        self._aw, self._w = [], []              # write addresses and data beats not yet matched
        self._b = []                            # [ready_cycle, record]
        self._r = []                            # [record, next beat, ready_cycle]
        self._b_on = self._r_on = False         # a B / R transfer is being offered
        self._beat = 0                          # beat of the write burst at the head of _aw

    @classmethod
    def from_prefix(cls, dut, prefix, data_bytes, **kw):
        """For a generated module: the signals ``<prefix>_awvalid`` and so on of ``dut``."""
        class Port:
            def __getattr__(self, name):
                return getattr(dut, f"{prefix}_{name}")
        return cls(Port(), data_bytes, **kw)

    # -- memory -----------------------------------------------------------------------------

    def write(self, addr, data):
        """Backdoor: store ``data`` at ``addr`` (no shadow check)."""
        for k, byte in enumerate(data):
            a = addr + k
            self.pages.setdefault(a // _PAGE, bytearray(_PAGE))[a % _PAGE] = byte

    def read(self, addr, length):
        """Backdoor: ``length`` bytes at ``addr`` (0 where never written)."""
        out = bytearray()
        for a in range(addr, addr + length):
            page = self.pages.get(a // _PAGE)
            out.append(page[a % _PAGE] if page else 0)
        return bytes(out)

    def allow_write(self, addr, length):
        """Register ``[addr, addr + length)`` as writable. Until the first call every address
        is; after it, a strobe on any other byte fails the test."""
        self.writable.append((addr, addr + length))

    def inject_error(self, addr, length, kinds=("write", "read")):
        """Answer SLVERR to every burst of ``kinds`` that touches ``[addr, addr + length)``."""
        self.errors.append((addr, addr + length, tuple(kinds)))

    def _resp(self, kind, start, end):
        for lo, hi, kinds in self.errors:
            if kind in kinds and lo < end and start < hi:
                return SLVERR
        return OKAY

    def _may_write(self, addr):
        return not self.writable or any(lo <= addr < hi for lo, hi in self.writable)

    # -- the subordinate -------------------------------------------------------------------

    def bench(self):
        """An Amaranth-simulator testbench that serves the port for ever (add it as a
        monitor: ``iwarp_tb.amsim.run(..., monitors=[memory.bench()])``)."""
        async def bench(ctx):
            await self.run(AmaranthBus(ctx))
        return bench

    def idle(self):
        """True when every burst has been answered in full."""
        return not (self._aw or self._w or self._b or self._r)

    def _fail(self, message):
        raise AssertionError(f"AXI4 rule broken at cycle {self.cycle}: {message}")

    async def run(self, bus):
        """Serve the port through ``bus`` for ever."""
        p, rng = self.port, self.rng
        signals = [getattr(p, name) for name in _SAMPLED]
        for name in ("awready", "wready", "arready", "bvalid", "rvalid"):
            bus.set(getattr(p, name), 0)
        while True:
            # What this side offers in the coming cycle.
            ready = {ch: int(rng.random() >= self.stall) for ch in ("aw", "w", "ar")}
            if self.read_limit is not None and self.reads_in_flight >= self.read_limit:
                ready["ar"] = 0
            for ch in ready:
                bus.set(getattr(p, f"{ch}ready"), ready[ch])
            self._offer_b(bus, rng)
            self._offer_r(bus, rng)
            values = dict(zip(_SAMPLED, await bus.edge(*signals)))
            self.cycle += 1
            self._check_stable(values, ready)
            if values["awvalid"] and ready["aw"]:
                self._take_address("write", values)
            if values["wvalid"] and ready["w"]:
                self._w.append((values["wdata"], values["wstrb"], values["wlast"]))
                self.w_cycles.append(self.cycle)
            self._match_writes()
            if self._b_on and values["bready"]:
                self._b.pop(0)[1].b_cycle = self.cycle
                self._b_on = False
                self.writes_in_flight -= 1
            if self._r_on and values["rready"]:
                self._r_taken()
            if values["arvalid"] and ready["ar"]:
                self._take_address("read", values)

    def _check_stable(self, values, ready):
        for ch, names in (("aw", _AW), ("w", _W), ("ar", _AR)):
            payload = tuple(values[n] for n in names)
            held = self._held.pop(ch, None)
            if held is not None and (not values[f"{ch}valid"] or payload != held):
                self._fail(f"{ch.upper()} VALID withdrawn or payload changed before READY "
                           f"({held} -> valid {values[f'{ch}valid']}, {payload})")
            if values[f"{ch}valid"] and not ready[ch]:
                self._held[ch] = payload

    def _take_address(self, kind, v):
        ch = "aw" if kind == "write" else "ar"
        addr, beats = v[f"{ch}addr"], v[f"{ch}len"] + 1
        if v[f"{ch}burst"] != _INCR:
            self._fail(f"{kind} burst type {v[f'{ch}burst']} is not INCR")
        if v[f"{ch}size"] != self.size:
            self._fail(f"{kind} {ch}size {v[f'{ch}size']} is not the bus width ({self.size})")
        if beats > 256 or (self.max_burst is not None and beats > self.max_burst):
            self._fail(f"{kind} burst of {beats} beats")
        base = addr & ~(self.n - 1)
        if base // _PAGE != (base + beats * self.n - 1) // _PAGE:
            self._fail(f"{kind} burst at {addr:#x} of {beats} beats crosses 4 KiB")
        record = BurstRecord(kind, addr, beats, self.cycle, v[f"{ch}id"])
        record.resp = self._resp(kind, addr, base + beats * self.n)
        self.bursts.append(record)
        if kind == "write":
            self._aw.append(record)
            self.writes_in_flight += 1
            self.max_writes = max(self.max_writes, self.writes_in_flight)
        else:
            self._r.append([record, 0, self.cycle + self.rng.randint(*self.r_latency)])
            self.reads_in_flight += 1
            self.max_reads = max(self.max_reads, self.reads_in_flight)

    def _match_writes(self):
        """Apply the data beats that have their burst's address (data may lead it)."""
        while self._aw and self._w:
            record = self._aw[0]
            data, strb, last = self._w.pop(0)
            k = self._beat
            if bool(last) != (k == record.beats - 1):
                self._fail(f"wlast {last} on beat {k} of a {record.beats}-beat burst at "
                           f"{record.addr:#x}")
            base = (record.addr & ~(self.n - 1)) + k * self.n
            for lane in range(self.n):
                if not strb >> lane & 1:
                    continue
                a = base + lane
                if a < record.addr:
                    self._fail(f"wstrb lane {lane} below the burst's address {record.addr:#x}")
                if not self._may_write(a):
                    self._fail(f"write to {a:#x}, outside every registered range")
                if record.resp == OKAY:
                    self.write(a, [data >> (8 * lane) & 0xFF])
            record.data.append((data, strb))
            self._beat += 1
            if last:
                self._aw.pop(0)
                self._beat = 0
                self._b.append([self.cycle + self.rng.randint(*self.b_latency), record])

    def _offer_b(self, bus, rng):
        p = self.port
        if not self._b_on and self._b and self._b[0][0] <= self.cycle and \
                rng.random() >= self.stall:
            record = self._b[0][1]
            bus.set(p.bid, record.id)
            bus.set(p.bresp, record.resp)
            self._b_on = True
        bus.set(p.bvalid, int(self._b_on))

    def _offer_r(self, bus, rng):
        p = self.port
        if not self._r_on and self._r and self._r[0][2] <= self.cycle and \
                rng.random() >= self.stall:
            record, k, _ = self._r[0]
            base = (record.addr & ~(self.n - 1)) + k * self.n
            data = 0
            for lane in range(self.n):
                a = base + lane
                if a < record.addr or record.resp != OKAY:
                    byte = rng.randrange(256)   # not the burst's: garbage
                else:
                    byte = self.read(a, 1)[0]
                data |= byte << (8 * lane)
            bus.set(p.rdata, data)
            bus.set(p.rresp, record.resp)
            bus.set(p.rid, record.id)
            bus.set(p.rlast, int(k == record.beats - 1))
            self._r_on = True
        bus.set(p.rvalid, int(self._r_on))

    def _r_taken(self):
        entry = self._r[0]
        self._r_on = False
        self.r_cycles.append(self.cycle)
        entry[1] += 1
        if entry[1] == entry[0].beats:
            self._r.pop(0)
            self.reads_in_flight -= 1

"""The STag table in block RAM and the checks of a tagged access: RFC 5040 sections 2.1, 5.1
and 6 (STags, their protection domain, local and remote invalidation), RFC 5041 sections 3 and
7.2 (tagged buffer errors), RFC 5042 sections 5 and 6 (what must be checked before an access).

An STag is a 24-bit index and an 8-bit key (``index << 8 | key``, as the model's
``make_stag``). The table keeps one :data:`Entry` per index. :class:`StagTable` answers, for an
access of ``length`` octets at ``to`` with some rights, the first check it fails in the model's
``MrTable.check`` order (:class:`Fault`), else the host address of ``to``; and carries out
invalidations as ``MrTable.invalidate`` does.
"""

from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import enum, stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import is_zero, widened, wire, wrap_add, wrap_sub

__all__ = ["Access", "Fault", "Entry", "StagWrite", "LookupRequest", "LookupResult",
           "InvalidateRequest", "StagTable", "LookupArbiter"]


class Access(enum.Flag, shape=4):
    """Access rights, the values of the model's (and rdma-core's) flags."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class Fault(enum.Enum, shape=3):
    """The first check an access or invalidation fails, in the model's order; ``NONE``: all
    passed."""

    NONE = 0
    INVALID_STAG = 1        # no region at the index, or another key
    INVALIDATED = 2         # the region is not valid (never fast-registered, or invalidated)
    NOT_ASSOCIATED = 3      # the region's PD is not the stream's
    TO_WRAP = 4             # to + length passes 2**64
    BASE_BOUNDS = 5         # [to, to + length) leaves [iova, iova + length of the region)
    ACCESS_RIGHTS = 6       # a right asked for is not granted; invalidation: not invalidatable


def Entry(pd_bits):
    """One table entry. ``present``: a region is registered at this index; ``valid``: it may
    be used (fast-registrable regions start invalid); ``invalidatable``: it was allocated for
    fast registration (``alloc_mr``), so it may be invalidated. ``host_addr``: the host
    address of the region's first octet, whose tagged offset is ``iova``."""
    return StructLayout({"present": 1, "key": 8, "valid": 1, "invalidatable": 1,
                         "pd": unsigned(pd_bits), "access": Access, "iova": 64, "length": 64,
                         "host_addr": 64})


def StagWrite(pd_bits, index_bits):
    """A write of the host's: ``entry`` at ``index`` (registration, fast registration,
    deregistration with ``present`` 0)."""
    return StructLayout({"index": unsigned(index_bits), "entry": Entry(pd_bits)})


def LookupRequest(pd_bits):
    """One tagged access to check: ``length`` octets at ``to`` under ``stag``, with rights
    ``access``, for a stream of protection domain ``pd``."""
    return StructLayout({"stag": 32, "to": 64, "length": 32, "access": Access,
                         "pd": unsigned(pd_bits)})


#: The answer to a :func:`LookupRequest`: the fault, and when there is none ``addr``, the host
#: address of octet ``to``.
LookupResult = StructLayout({"fault": Fault, "addr": 64})


def InvalidateRequest(pd_bits):
    """Invalidate ``stag`` for a stream of protection domain ``pd``."""
    return StructLayout({"stag": 32, "pd": unsigned(pd_bits)})


class StagTable(wiring.Component):
    """The STag table: host writes, tagged-access checks and invalidations.

    Ports
    -----
    i_write : In(stream.Signature(StagWrite(pd_bits, log2(entries))))
        Entries from the host. Taken at once unless an invalidation is under way.
    i_check : In(stream.Signature(LookupRequest(pd_bits)))
    o_check : Out(stream.Signature(LookupResult))
        One result per request, in order. The checks, first failing one reported: the STag's
        index is below ``entries``, an entry is present there with the STag's key (else
        INVALID_STAG), it is valid (INVALIDATED), its PD is ``pd`` (NOT_ASSOCIATED),
        ``to + length`` does not pass 2**64 (TO_WRAP), the access lies within the region
        (BASE_BOUNDS), it grants every right of ``access`` (ACCESS_RIGHTS). ``addr`` is
        ``host_addr + to - iova``.
    i_invalidate : In(stream.Signature(InvalidateRequest(pd_bits)))
    o_invalidate : Out(stream.Signature(LookupResult))
        One result per request, in order (``addr`` is 0): INVALID_STAG or INVALIDATED as for a
        check, NOT_ASSOCIATED for another PD, ACCESS_RIGHTS for a region that cannot be
        invalidated (registered with ``reg_mr``); otherwise the entry is made invalid.

    Ordering: requests take effect in the order they are taken. A write is seen by every
    request taken after it, and by a check taken in the same cycle. An invalidation holds every
    input until it has written its entry, so what follows it sees it.

    Latency: a result is offered five cycles after its request is taken. Throughput: one check
    per cycle; an invalidation takes six cycles. Back-pressure: the pipeline stops while the
    result ahead of it waits; its inputs are then not taken.
    """

    def __init__(self, entries, *, pd_bits=16):
        if not isinstance(entries, int) or entries < 2 or entries & (entries - 1) or \
                entries > 1 << 24:
            raise ValueError(f"entries must be a power of two from 2 to 2**24, not {entries!r}")
        self.entries = entries
        self.pd_bits = pd_bits
        self.index_bits = entries.bit_length() - 1
        super().__init__({
            "i_write": In(stream.Signature(StagWrite(pd_bits, self.index_bits))),
            "i_check": In(stream.Signature(LookupRequest(pd_bits))),
            "o_check": Out(stream.Signature(LookupResult)),
            "i_invalidate": In(stream.Signature(InvalidateRequest(pd_bits))),
            "o_invalidate": Out(stream.Signature(LookupResult)),
        })

    def elaborate(self, platform):
        m = Module()
        entry = Entry(self.pd_bits)
        m.submodules.memory = memory = Memory(shape=entry, depth=self.entries, init=[])
        wr = memory.write_port()
        rd = memory.read_port(transparent_for=(wr,))
        request = LookupRequest(self.pd_bits)
        index_bits = self.index_bits

        def index_of(stag):
            return stag[8:8 + index_bits]

        # Stage k holds one request: `valid`, `inv` (an invalidation), and what is left of the
        # request: all of it in stages 1 and 2, which check it; only its index in 3 and 4.
        def stage(name, layout):
            return (Signal(name=f"{name}_valid"), Signal(name=f"{name}_inv"),
                    Signal(layout, name=f"{name}_req"))

        s1, s2 = stage("s1", request), stage("s2", request)
        s3, s4 = stage("s3", index_bits), stage("s4", index_bits)
        e2 = Signal(entry)
        outs = (self.o_check, self.o_invalidate)
        advance = wire(m, Cat(~o.valid | o.ready for o in outs).all(), "advance")
        pending = Signal()          # an invalidation's write, the cycle after its result
        busy = wire(m, Cat(s[0] & s[1] for s in (s1, s2, s3, s4)).any() | pending, "busy")

        # Stage 0: take an invalidation first, else a check; read the entry. Nothing is read
        # while an invalidation is under way, so the read port holds its entry until the
        # invalidation writes it back.
        take_inv = wire(m, advance & ~busy & self.i_invalidate.valid, "take_inv")
        take_check = wire(m, advance & ~busy & ~self.i_invalidate.valid & self.i_check.valid,
                          "take_check")
        m.d.comb += [self.i_invalidate.ready.eq(take_inv), self.i_check.ready.eq(take_check)]
        # Which request stage 1 holds does not wait on `busy`: nothing is taken while it is set.
        inv_first = self.i_invalidate.valid
        stag = Mux(inv_first, self.i_invalidate.payload.stag, self.i_check.payload.stag)
        m.d.comb += [rd.addr.eq(index_of(stag)), rd.en.eq(advance & ~busy)]

        with m.If(advance):
            m.d.sync += [s1[0].eq(take_inv | take_check), s1[1].eq(take_inv)]
            with m.If(inv_first):
                m.d.sync += [s1[2].stag.eq(self.i_invalidate.payload.stag),
                             s1[2].pd.eq(self.i_invalidate.payload.pd)]
            with m.Else():
                m.d.sync += s1[2].eq(self.i_check.payload)
            # Stage 1 -> 2: the entry read, registered.
            m.d.sync += [s2[0].eq(s1[0]), s2[1].eq(s1[1]), s2[2].eq(s1[2]), e2.eq(rd.data)]
            m.d.sync += [s3[0].eq(s2[0]), s3[1].eq(s2[1]), s3[2].eq(index_of(s2[2].stag))]

        # Stage 2: identity checks, the ends of both ranges, the offset in the region.
        req2 = s2[2]
        found = (is_zero(req2.stag[8 + index_bits:]) & e2.present
                 & (e2.key == req2.stag[:8]))
        end = Signal(65)            # to + length
        region_end = Signal(65)     # iova + length of the region
        below = Signal()            # to < iova
        offset = Signal(64)         # to - iova
        host_addr3 = Signal(64)
        found3, valid3, pd_ok3, rights3, invalidatable3 = (
            Signal(name=f"{k}3") for k in ("found", "valid", "pd_ok", "rights", "invalidatable"))
        with m.If(advance):
            m.d.sync += [
                end.eq(wrap_add(m, widened(m, req2.to, 65, "to_wide"), req2.length, 65, "end_sum")),
                region_end.eq(wrap_add(m, widened(m, e2.iova, 65, "iova_wide"), e2.length, 65,
                                        "region_sum")),
                below.eq(req2.to < e2.iova),
                offset.eq(wrap_sub(m, req2.to, e2.iova, 64, "offset_sum")),
                found3.eq(found), valid3.eq(e2.valid), pd_ok3.eq(e2.pd == req2.pd),
                rights3.eq(is_zero(req2.access.as_value() & ~e2.access.as_value())),
                invalidatable3.eq(e2.invalidatable), host_addr3.eq(e2.host_addr),
            ]

        # Stage 3: wrap, bounds, the address, registered.
        found4, valid4, pd_ok4, rights4, below4, invalidatable4 = (
            Signal(name=f"{k}4") for k in ("found", "valid", "pd_ok", "rights", "below",
                                           "invalidatable"))
        wraps4, beyond4, addr4 = Signal(), Signal(), Signal(64)
        with m.If(advance):
            m.d.sync += [
                s4[0].eq(s3[0]), s4[1].eq(s3[1]), s4[2].eq(s3[2]),
                found4.eq(found3), valid4.eq(valid3), pd_ok4.eq(pd_ok3), rights4.eq(rights3),
                invalidatable4.eq(invalidatable3),
                below4.eq(below), wraps4.eq(end[64] & ~is_zero(end[:64])),
                beyond4.eq(end > region_end),
                addr4.eq(wrap_add(m, host_addr3, offset, 64, "addr_sum")),
            ]

        # Stage 4: the first failing check.
        inv4 = s4[1]
        fault = Signal(Fault)
        with m.If(~found4):
            m.d.comb += fault.eq(Fault.INVALID_STAG)
        with m.Elif(~valid4):
            m.d.comb += fault.eq(Fault.INVALIDATED)
        with m.Elif(~pd_ok4):
            m.d.comb += fault.eq(Fault.NOT_ASSOCIATED)
        with m.Elif(inv4):
            with m.If(~invalidatable4):
                m.d.comb += fault.eq(Fault.ACCESS_RIGHTS)
        with m.Elif(wraps4):
            m.d.comb += fault.eq(Fault.TO_WRAP)
        with m.Elif(below4 | beyond4):
            m.d.comb += fault.eq(Fault.BASE_BOUNDS)
        with m.Elif(~rights4):
            m.d.comb += fault.eq(Fault.ACCESS_RIGHTS)

        for out in outs:
            with m.If(out.ready):
                m.d.sync += out.valid.eq(0)
        with m.If(advance & s4[0]):
            with m.If(inv4):
                m.d.sync += [self.o_invalidate.valid.eq(1),
                             self.o_invalidate.payload.fault.eq(fault),
                             self.o_invalidate.payload.addr.eq(0)]
            with m.Else():
                m.d.sync += [self.o_check.valid.eq(1), self.o_check.payload.fault.eq(fault),
                             self.o_check.payload.addr.eq(addr4)]

        # The one write port: an invalidation's entry (still on the read port) made invalid,
        # the cycle after its result; else the host's.
        pending_index = Signal(index_bits)
        m.d.sync += [pending.eq(advance & s4[0] & inv4 & is_zero(fault.as_value())),
                     pending_index.eq(s4[2])]
        invalidated = Signal(entry)
        m.d.comb += [invalidated.eq(rd.data), invalidated.valid.eq(0)]
        m.d.comb += self.i_write.ready.eq(~busy)
        with m.If(pending):
            m.d.comb += [wr.addr.eq(pending_index), wr.en.eq(1), wr.data.eq(invalidated)]
        with m.Else():
            m.d.comb += [wr.addr.eq(self.i_write.payload.index),
                         wr.data.eq(self.i_write.payload.entry),
                         wr.en.eq(self.i_write.valid & ~busy)]
        return m


class LookupArbiter(wiring.Component):
    """Share the table's check port between two clients of one stream.

    Ports
    -----
    i_a, i_b : In(stream.Signature(LookupRequest(pd_bits)))
        The clients' checks (the placer's, the request responder's).
    o_a, o_b : Out(stream.Signature(LookupResult))
        Each client's results, in the order of its requests.
    o_check, i_check : Out(stream.Signature(LookupRequest(pd_bits))),
                       In(stream.Signature(LookupResult))
        To and from :class:`StagTable`, which answers in order.

    When both clients offer a check, they take turns. Each check forwarded leaves a note of
    its client in a queue of ``depth``; a result goes to the client at the head of it.
    Latency: none either way (the request and the result pass combinationally). At most
    ``depth`` checks are in the table at once.
    """

    def __init__(self, *, pd_bits=16, depth=8):
        self.pd_bits = pd_bits
        self.depth = depth
        super().__init__({
            "i_a": In(stream.Signature(LookupRequest(pd_bits))),
            "i_b": In(stream.Signature(LookupRequest(pd_bits))),
            "o_a": Out(stream.Signature(LookupResult)),
            "o_b": Out(stream.Signature(LookupResult)),
            "o_check": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_check": In(stream.Signature(LookupResult)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.clients = clients = SyncFIFOBuffered(width=1, depth=self.depth)
        out = self.o_check
        last_b = Signal()               # the last check forwarded was b's
        pick_b = self.i_b.valid & (~self.i_a.valid | ~last_b)
        forward = out.valid & out.ready
        m.d.comb += [out.valid.eq((self.i_a.valid | self.i_b.valid) & clients.w_rdy),
                     out.payload.eq(Mux(pick_b, self.i_b.payload, self.i_a.payload)),
                     self.i_a.ready.eq(out.ready & clients.w_rdy & ~pick_b),
                     self.i_b.ready.eq(out.ready & clients.w_rdy & pick_b),
                     clients.w_en.eq(forward), clients.w_data.eq(pick_b)]
        with m.If(forward):
            m.d.sync += last_b.eq(pick_b)
        to_b = clients.r_data[0]
        result = self.i_check
        m.d.comb += [self.o_a.payload.eq(result.payload), self.o_b.payload.eq(result.payload),
                     self.o_a.valid.eq(result.valid & clients.r_rdy & ~to_b),
                     self.o_b.valid.eq(result.valid & clients.r_rdy & to_b),
                     result.ready.eq(clients.r_rdy & Mux(to_b, self.o_b.ready, self.o_a.ready)),
                     clients.r_en.eq(result.valid & result.ready)]
        return m

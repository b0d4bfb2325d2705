"""The host of a memory target in gateware: :class:`~.target.TargetPlan` run by a state
machine, for a board whose NicCore has block RAM for host memory and no CPU (RFC 5040 sections
5 and 6 as the host's side; RFC 5044 section 7 and RFC 6581: the MPA Reply it decides).

It does what :class:`iwarp_tb.target.ScriptedTarget` does in Python, access for access: the
plan's constant register programs from a ROM, the event queue drained, the peer's MPA Request
read and answered with the program of its case, the completion queue read by its owner bits,
and rping's pings served by patching the send entries.
"""

import enum

from amaranth import Cat, Const, Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..axi import AxiLite
from ..exact import Machine, add, eq, is_zero, lt, ne, one_of, same, select, widened
from ..host.axil import AxiLiteManager, ReadDone, ReadRequest, WriteDone, WriteRequest
from ..host.formats import CQE_BYTES, SQ_INLINE_OFFSET, SqFlags
from ..host.nicmap import NicEventKind
from ..mpa.startup import KEY_REQUEST
from .target import CQ, CQ_LOG2, DATA, DATA_STAG, RECV, RECV_BYTES, RQ_LOG2, Slot, TargetPlan

__all__ = ["TargetHost", "MemoryTarget"]

_RTRS = ("none", "write", "read", "send")


class _Program(enum.IntEnum):
    BOOT, ARM, CLOSE, ABORT = range(4)


def _request(revision, *, enhanced=False, peer_ird=1, rtr="none"):
    """An MPA Request of one of the cases the target tells apart."""
    flags = 0x10 if enhanced else 0
    data = b""
    if enhanced:
        ird = peer_ird | (0x8000 if rtr != "none" else 0) | (0x4000 if rtr == "send" else 0)
        ord_ = {"write": 0x8000, "read": 0x4000}.get(rtr, 0)
        data = ird.to_bytes(2, "big") + ord_.to_bytes(2, "big")
    return KEY_REQUEST + bytes([flags, revision]) + len(data).to_bytes(2, "big") + data


class TargetHost(wiring.Component):
    """The memory target's host for ``plan`` (a :class:`~.target.TargetPlan`) on connection
    ``conn`` of the NIC, with Ethernet address ``mac``, IPv4 address ``ip`` (integers) and
    the 160 bits of TCP ``keys`` (RFC 6528: secret per board).

    Ports
    -----
    m_axil : Out(AxiLite(addr_width=16, data_bytes=4))
        NicCore's registers (``s_axil``).
    o_ram_write, i_ram_write_done, o_ram_read, i_ram_read
        The RAM's word port (:class:`~iwarp_nic.axi_ram.AxiRam`, 8-octet words).
    listening : Out(1)
        The connection slot listens: armed, and no peer's MPA Request taken since.
    connected : Out(1)
        A connection has been accepted and not ended.
    pings : Out(16)
        rping's pings served (a count that wraps).
    refused : Out(1)
        A one-cycle pulse when a connection is given up: a Request the plan does not take,
        a Terminate either way, or a completion in error. Each is reset but for a Terminate
        this end sent: the peer closes after it (a reset would drop it from the send ring).

    A peer that completes TCP's handshake and sends no MPA Request within ``startup_cycles``
    (2^27 by default: 2.1 s at 62.5 MHz) is reset, and the slot listens again: one silent
    client must not hold the target.

    It starts as soon as reset ends. One register or RAM access at a time; an event or a
    completion takes a few tens of accesses (a ping about 40), each a few cycles.
    """

    def __init__(self, plan=None, *, mac, ip, keys, conn=0, startup_cycles=1 << 27):
        if startup_cycles < 1:
            raise ValueError(f"startup_cycles must be positive, not {startup_cycles}")
        self.plan = TargetPlan() if plan is None else plan
        self.mac, self.ip, self.keys, self.conn = mac, ip, keys, conn
        self.startup_cycles = startup_cycles
        offset_bits = self.plan.ram_bytes.bit_length() - 1
        super().__init__({
            "m_axil": Out(AxiLite(addr_width=16, data_bytes=4)),
            "o_ram_write": Out(stream.Signature(WriteRequest(offset_bits, 8))),
            "i_ram_write_done": In(stream.Signature(WriteDone)),
            "o_ram_read": Out(stream.Signature(ReadRequest(offset_bits))),
            "i_ram_read": In(stream.Signature(ReadDone(8))),
            "listening": Out(1),
            "connected": Out(1),
            "pings": Out(16),
            "refused": Out(1),
        })

    def _programs(self):
        """The ROM's entries ``(offset, word, last)`` and the first entry of each program:
        :class:`_Program`'s, then ``accept`` for revision 1, for revision 2 without RFC
        6581's data, and for each ORD (0, 1) and RTR (none, Write, Read, Send) with it."""
        plan, conn = self.plan, self.conn
        start = plan.start(mac=self.mac, ip=self.ip, keys=self.keys)
        arm = plan.arm(conn)
        programs = [start + arm, plan.end(conn, abort=False), plan.end(conn, abort=True),
                    plan.accept(conn, _request(1)), plan.accept(conn, _request(2))]
        for ord_ in (0, 1):
            for rtr in _RTRS:
                programs.append(plan.accept(conn, _request(2, enhanced=True, peer_ird=ord_,
                                                           rtr=rtr)))
        entries, firsts = [], []
        for program in programs:
            firsts.append(len(entries))
            entries += [(offset, word, k == len(program) - 1)
                        for k, (offset, word) in enumerate(program)]
        firsts.insert(_Program.ARM, len(start))     # ARM is BOOT's tail
        return entries, firsts

    def elaborate(self, platform):
        m = Module()
        plan, conn = self.plan, self.conn
        regmap = plan.map
        entries, firsts = self._programs()
        m.submodules.regs = regs = AxiLiteManager(16, 4)
        wiring.connect(m, wiring.flipped(self.m_axil), regs.m_axil)
        rom_shape = unsigned(16 + 32 + 1)
        m.submodules.rom = rom = Memory(shape=rom_shape, depth=len(entries), init=[
            offset | word << 16 | last << 48 for offset, word, last in entries])
        rom_read = rom.read_port(domain="comb")
        pc = Signal(range(len(entries)))
        m.d.comb += rom_read.addr.eq(pc)

        # What the machine keeps.
        ev_kind, ev_conn, ev_code = Signal(4), Signal(12), Signal(16)
        length = Signal(16)                 # the startup frame's octets
        words = Signal(14)                  # startup words read so far
        key_ok = Signal()
        w4, w5 = Signal(32), Signal(32)
        cq_head, sq_tail = Signal(16), Signal(16)
        rq_tail = Signal(16, init=1 << RQ_LOG2)       # arm posts the four receives
        cqe0, byte_len = Signal(64), Signal(32)
        i0, i1 = Signal(64), Signal(64)
        size = Signal(32)
        phase = Signal()
        patch = Signal(3)
        issued = Signal()                   # the current state's request is out
        awaiting = Signal()                 # a peer connected and its Request not yet in
        startup_left = Signal(range(self.startup_cycles + 1))
        with m.If(awaiting & ~is_zero(startup_left)):
            m.d.sync += startup_left.eq(startup_left - 1)

        def access(request, answer, fields, then):
            """Within a state: offer ``request`` (``fields`` of its payload) once, then take
            ``answer`` and call ``then(its payload)``."""
            m.d.comb += [request.valid.eq(~issued), answer.ready.eq(issued),
                         *(getattr(request.payload, k).eq(v) for k, v in fields.items())]
            with m.If(request.valid & request.ready):
                m.d.sync += issued.eq(1)
            with m.If(answer.valid & answer.ready):
                m.d.sync += issued.eq(0)
                then(answer.payload)

        def reg_write(offset, value, then):
            access(regs.i_write, regs.o_write_done,
                   {"addr": offset, "data": value, "strb": 0xF}, lambda _: then())

        def reg_read(offset, then):
            access(regs.i_read, regs.o_read, {"addr": offset}, lambda answer: then(answer.data))

        def ram_write(offset, value, then):
            access(self.o_ram_write, self.i_ram_write_done,
                   {"addr": offset, "data": value, "strb": 0xFF}, lambda _: then())

        def ram_read(offset, then):
            access(self.o_ram_read, self.i_ram_read, {"addr": offset},
                   lambda answer: then(answer.data))

        arming = Signal()                   # the program running ends in a listen

        def run(program):
            m.d.sync += [pc.eq(firsts[program]),
                         arming.eq(program in (_Program.BOOT, _Program.ARM))]
            fsm.goto("RUN")

        def give_up():
            m.d.comb += self.refused.eq(1)
            m.d.sync += [self.connected.eq(0), awaiting.eq(0)]
            run(_Program.ABORT)

        fsm = Machine(m, ["BOOT", "RUN", "EVENT_LO", "EVENT_HI", "STARTUP", "STARTUP_POP",
                          "EVENT_POP", "DISPATCH", "CQE_OWNER", "CQE_WORD0", "CQE_WORD1",
                          "CQ_HEAD", "COMPLETED", "INFO0", "INFO1", "RQ_DOORBELL", "PATCH",
                          "SQ_DOORBELL"], "target_host_state")
        with fsm.state("BOOT"):
            run(_Program.BOOT)
        with fsm.state("RUN"):
            def next_entry():
                m.d.sync += pc.eq(add(pc, 1))
                with m.If(rom_read.data[48]):
                    m.d.sync += self.listening.eq(arming)
                    fsm.goto("EVENT_LO")
            reg_write(rom_read.data[:16], rom_read.data[16:48], next_entry)

        # -- the event queue: kind, connection and code, then the data's first word ------
        def took_lo(data):
            m.d.sync += [ev_kind.eq(data[:4]), ev_conn.eq(data[4:16]), ev_code.eq(data[16:32])]
            with m.If(is_zero(data[:4])):
                fsm.goto("CQE_OWNER")
            with m.Else():
                fsm.goto("EVENT_HI")
        with fsm.state("EVENT_LO"):
            with m.If(awaiting & is_zero(startup_left) & ~issued):   # the Request is late
                m.d.sync += self.listening.eq(0)
                give_up()
            with m.Else():
                reg_read(regmap.offset("event0"), took_lo)

        def took_hi(data):
            m.d.sync += [length.eq(data[:16]), words.eq(0), key_ok.eq(1)]
            with m.If(eq(ev_kind, NicEventKind.STARTUP)):
                fsm.goto("STARTUP")
            with m.Else():
                fsm.goto("EVENT_POP")
        with fsm.state("EVENT_HI"):
            reg_read(regmap.offset("event0") + 4, took_hi)

        # -- the startup frame, a word at a time: the key checked, words 4 and 5 kept --------
        key = [int.from_bytes(KEY_REQUEST[k:k + 4], "little") for k in range(0, 16, 4)]

        def took_word(data):
            for k, word in enumerate(key):
                with m.If(eq(words, k) & ne(data, word)):
                    m.d.sync += key_ok.eq(0)
            with m.If(eq(words, 4)):
                m.d.sync += w4.eq(data)
            with m.If(eq(words, 5)):
                m.d.sync += w5.eq(data)
            fsm.goto("STARTUP_POP")
        with fsm.state("STARTUP"):
            with m.If(Cat(Const(0, 2), words) >= length):
                fsm.goto("EVENT_POP")
            with m.Else():
                reg_read(regmap.offset("startup_data"), took_word)
        with fsm.state("STARTUP_POP"):
            def popped():
                m.d.sync += words.eq(add(words, 1))
                fsm.goto("STARTUP")
            reg_write(regmap.offset("startup_pop"), 0, popped)
        with fsm.state("EVENT_POP"):
            reg_write(regmap.offset("event_pop"), 0, lambda: fsm.goto("DISPATCH"))

        # -- what the event asks for --------------------------------------------------------
        flags, revision = w4[:8], w4[8:16]
        pd_length = Cat(w4[24:32], w4[16:24])
        ird_word, ord_word = Cat(w5[8:16], w5[:8]), Cat(w5[24:32], w5[16:24])
        enhanced = eq(revision, 2) & flags[4]
        p2p = enhanced & ird_word[15]
        rtr = Signal(2)            # the program's RTR: none, Write, Read, Send
        with m.If(~p2p):
            m.d.comb += rtr.eq(0)
        with m.Elif(ord_word[15]):
            m.d.comb += rtr.eq(1)
        with m.Elif(ord_word[14]):
            m.d.comb += rtr.eq(2)
        with m.Else():
            m.d.comb += rtr.eq(3)
        good = Signal()
        m.d.comb += good.eq(key_ok & (eq(revision, 1) | eq(revision, 2)) & ~flags[7]
                            & lt(pd_length, 513) & same(length, add(pd_length, 20))
                            & (~enhanced | ~lt(pd_length, 4))
                            & (~p2p | ord_word[15] | ord_word[14] | ird_word[14])
                            & is_zero(ev_code[:2]))
        # The accept programs, after _Program's: revision 1, revision 2 plain, then by ORD
        # (the peer's IRD is 0 or not) and RTR.
        case = Signal(4)
        with m.If(eq(revision, 1)):
            m.d.comb += case.eq(0)
        with m.Elif(~enhanced):
            m.d.comb += case.eq(1)
        with m.Else():
            by_ord = widened(m, Cat(rtr, ird_word[:14].any()), 4, "accept_by_ord")
            m.d.comb += case.eq(add(by_ord, 2))
        accept_first = select(m, case, firsts[len(_Program):], len(pc), "accept_first")
        with fsm.state("DISPATCH"):
            fsm.goto("EVENT_LO")
            with m.If(eq(ev_conn, conn)):
                with m.If(eq(ev_kind, NicEventKind.STARTUP)):
                    m.d.sync += [self.listening.eq(0), awaiting.eq(0)]
                    with m.If(good):
                        m.d.sync += [pc.eq(accept_first), arming.eq(0), self.connected.eq(1)]
                        fsm.goto("RUN")
                    with m.Else():
                        give_up()
                with m.Elif(eq(ev_kind, NicEventKind.TCP)):
                    with m.If(is_zero(ev_code[:3])):                # ESTABLISHED
                        m.d.sync += [awaiting.eq(1), startup_left.eq(self.startup_cycles)]
                    with m.Elif(eq(ev_code[:3], 1)):                # PEER_FIN
                        m.d.sync += self.connected.eq(0)
                        run(_Program.CLOSE)
                    with m.Elif(one_of(ev_code[:3], (2, 3, 4, 5))):    # the slot is free
                        m.d.sync += [self.connected.eq(0), awaiting.eq(0),
                                     rq_tail.eq(1 << RQ_LOG2), sq_tail.eq(0), phase.eq(0)]
                        run(_Program.ARM)
                with m.Elif(eq(ev_kind, NicEventKind.FAULT)):
                    # Our Terminate must reach the peer (a reset would drop it from the send
                    # ring), which then closes the stream: its FIN is answered.
                    m.d.comb += self.refused.eq(1)
                    m.d.sync += self.connected.eq(0)
                with m.Elif(eq(ev_kind, NicEventKind.TERMINATE)):
                    give_up()

        # -- the completion queue, by its owner bits ---------------------------------------
        assert CQ % (CQE_BYTES << CQ_LOG2) == 0 and CQE_BYTES == 32
        offset_bits = plan.ram_bytes.bit_length() - 1
        slot = cq_head[:CQ_LOG2]

        def cqe(word):
            """The offset of word ``word`` of the entry at the head."""
            high = offset_bits - 5 - CQ_LOG2
            return Cat(Const(8 * word, 5), slot, Const(CQ >> 5 + CQ_LOG2, high))
        with fsm.state("CQE_OWNER"):
            def took_owner(data):
                with m.If(data[63] ^ cq_head[CQ_LOG2]):            # new on this pass
                    fsm.goto("CQE_WORD0")
                with m.Else():
                    fsm.goto("EVENT_LO")
            ram_read(cqe(3), took_owner)
        with fsm.state("CQE_WORD0"):
            def took_word0(data):
                m.d.sync += cqe0.eq(data)
                fsm.goto("CQE_WORD1")
            ram_read(cqe(0), took_word0)
        with fsm.state("CQE_WORD1"):
            def took_word1(data):
                m.d.sync += [byte_len.eq(data[:32]), cq_head.eq(add(cq_head, 1))]
                fsm.goto("CQ_HEAD")
            ram_read(cqe(1), took_word1)
        with fsm.state("CQ_HEAD"):
            reg_write(regmap.offset("cq_head", 0), cq_head, lambda: fsm.goto("COMPLETED"))
        wqe, qp, kind, status = cqe0[:16], cqe0[16:32], cqe0[32:40], cqe0[40:48]
        with fsm.state("COMPLETED"):
            fsm.goto("EVENT_LO")
            with m.If(eq(qp, conn)):
                with m.If(ne(status, 0)):
                    give_up()
                with m.Elif(eq(kind, 1)):                           # a receive
                    fsm.goto("INFO0")
        buffers = [RECV + RECV_BYTES * k for k in range(1 << RQ_LOG2)]
        buffer = select(m, wqe[:RQ_LOG2], buffers, offset_bits, "buffer")
        buffer_second = select(m, wqe[:RQ_LOG2], [b + 8 for b in buffers], offset_bits,
                               "buffer_second")
        with fsm.state("INFO0"):
            def took_i0(data):
                m.d.sync += i0.eq(data)
                fsm.goto("INFO1")
            ram_read(buffer, took_i0)
        with fsm.state("INFO1"):
            def took_i1(data):
                m.d.sync += [i1.eq(data), rq_tail.eq(add(rq_tail, 1)), patch.eq(0)]
                fsm.goto("RQ_DOORBELL")
            ram_read(buffer_second, took_i1)
        with fsm.state("RQ_DOORBELL"):
            def posted():
                with m.If(eq(byte_len, 16)):
                    fsm.goto("PATCH")
                with m.Else():
                    fsm.goto("EVENT_LO")
            reg_write(regmap.offset("rq_doorbell", conn), rq_tail, posted)

        # -- a ping's patches (plan.read_patch, plan.write_patch) ----------------------------
        def bswap(value):
            return Cat(*[value[8 * k:8 * k + 8] for k in reversed(range(len(value) // 8))])
        read_entry, write_entry = plan.slot(Slot.READ), plan.slot(Slot.WRITE)
        inline = read_entry + SQ_INLINE_OFFSET
        data_low = int.from_bytes(DATA.to_bytes(8, "big")[4:], "little")
        asked = bswap(i1[32:64])
        read_words = [(read_entry + 32, Cat(Const(DATA_STAG, 32), asked)),
                      (inline + 8, Cat(Const(data_low, 32), i1[32:64])),
                      (inline + 16, Cat(i1[:32], i0[:32])),
                      (inline + 24, Cat(i0[32:64], Const(0, 32)))]
        write_words = [(write_entry, Cat(Const(SqFlags.SIGNALED << 8, 32), size)),
                       (write_entry + 8, Cat(bswap(i1[:32]), Const(0, 32))),
                       (write_entry + 16, bswap(i0))]
        with fsm.state("PATCH"):
            def patched():
                last = len(read_words) - 1
                with m.If(eq(patch, last) | (phase & eq(patch, len(write_words) - 1))):
                    fsm.goto("SQ_DOORBELL")
                    m.d.sync += sq_tail.eq(add(sq_tail, 2))
                    with m.If(~phase):
                        m.d.sync += size.eq(asked)
                m.d.sync += patch.eq(add(patch, 1))
            offset = Signal(offset_bits)
            value = Signal(64)
            for k, (at, word) in enumerate(read_words):
                with m.If(~phase & eq(patch, k)):
                    m.d.comb += [offset.eq(at), value.eq(word)]
            for k, (at, word) in enumerate(write_words):
                with m.If(phase & eq(patch, k)):
                    m.d.comb += [offset.eq(at), value.eq(word)]
            ram_write(offset, value, patched)
        with fsm.state("SQ_DOORBELL"):
            def rung():
                m.d.sync += phase.eq(~phase)
                with m.If(phase):
                    m.d.sync += self.pings.eq(add(self.pings, 1))
                fsm.goto("EVENT_LO")
            reg_write(regmap.offset("sq_doorbell", conn), sq_tail, rung)
        return m


class MemoryTarget(wiring.Component):
    """A memory target, board-free: a :class:`~iwarp_nic.core.NicCore` of ``data_bytes``
    with an :class:`~iwarp_nic.axi_ram.AxiRam` of ``plan.ram_bytes`` as its host memory (at
    address 0) and a :class:`TargetHost` on its registers. ``core``: further NicCore
    parameters (its sizes must be the plan's); ``event_counters`` is off unless they say
    otherwise, as the host reads no counter.

    Ports: NicCore's PHY pins, and :class:`TargetHost`'s ``listening``, ``connected``,
    ``pings`` and ``refused`` (for LEDs).
    """

    def __init__(self, data_bytes, plan=None, *, mac, ip, keys, **core):
        from ..axi_ram import AxiRam
        from ..core import NicCore
        self.plan = TargetPlan() if plan is None else plan
        sizes = {"conns": self.plan.conns, "cqs": self.plan.cqs, "srqs": self.plan.srqs,
                 "stag_entries": self.plan.stag_entries}
        self._core = NicCore(data_bytes, **sizes, **{"event_counters": False, **core})
        self._ram = AxiRam(self._core.dma_bytes, self.plan.ram_bytes,
                           init=self.plan.image())
        self._host = TargetHost(self.plan, mac=mac, ip=ip, keys=keys)
        self._pins = dict(self._core._pins)
        super().__init__({**self._pins, "listening": Out(1), "connected": Out(1),
                          "pings": Out(16), "refused": Out(1)})

    def elaborate(self, platform):
        from ..node import forward
        m = Module()
        m.submodules.core, m.submodules.ram = core, ram = self._core, self._ram
        m.submodules.host = host = self._host
        for name, member in self._pins.items():
            forward(m, member, getattr(self, name), getattr(core, name))
        wiring.connect(m, core.m_axi, ram.s_axi)
        wiring.connect(m, host.m_axil, core.s_axil)
        wiring.connect(m, host.o_ram_write, ram.i_write)
        wiring.connect(m, ram.o_write_done, host.i_ram_write_done)
        wiring.connect(m, host.o_ram_read, ram.i_read)
        wiring.connect(m, ram.o_read, host.i_ram_read)
        m.d.comb += [getattr(self, name).eq(getattr(host, name))
                     for name in ("listening", "connected", "pings", "refused")]
        return m

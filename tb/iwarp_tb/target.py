"""A memory target's host in Python: :class:`~iwarp_nic.apps.target.TargetPlan` run against a
simulated NicCore with nothing but 32-bit register accesses and 8-octet memory accesses
in the plan's RAM, as the board's gateware will run it (issue 8). It is the executable form
of that gateware's behaviour, tried against Linux ``rping`` (``tb/siw/test_nic_vs_siw.py``).

:class:`ScriptedTarget` stands where the driver's :class:`~iwarp_tb.driver.NicDevice` stands
for :class:`~iwarp_tb.siw.nicpeer.NicPeer`: its :meth:`~ScriptedTarget.service` is called
between slices of the clock. It writes the RAM's image and runs ``start`` and ``arm`` when
made; then each service drains the event queue (a startup frame is answered with
``accept``, or the connection aborted if the plan refuses it; the peer's FIN is answered with
a close; the end of a connection re-arms it) and reads every new completion from the
completion queue, by its owner bit, as rping's server acts on it.
"""

from iwarp_nic.apps.target import (
    CQ,
    CQ_LOG2,
    DATA,
    RECV,
    RECV_BYTES,
    RQ_LOG2,
    SQ_LOG2,
    BadRequest,
)
from iwarp_nic.host.formats import CQE_BYTES, Cqe, CqeKind
from iwarp_nic.host.nicmap import NicEvent, NicEventKind
from iwarp_nic.mpa.gather import ReleaseKind
from iwarp_nic.tcp.layouts import EventKind

from .harness import unpack

__all__ = ["ScriptedTarget"]

_ENDED = (EventKind.CLOSED, EventKind.RESET, EventKind.TIMEOUT, EventKind.ABORTED)


class ScriptedTarget:
    """``plan`` on the NIC of harness ``h`` (registers ``s_axil``, host memory ``m_axi``),
    serving rping on connection ``conn``. ``mac``, ``ip``: integers; ``keys``: the TCP keys.
    :attr:`pings` counts the pings served, :attr:`connections` the connections that ended;
    :attr:`log` says what happened."""

    def __init__(self, h, plan, *, mac, ip, keys, conn=0):
        self.plan, self.conn = plan, conn
        self.regs, self.memory = h.registers("s_axil"), h.memory("m_axi")
        self.memory.write(0, plan.image())
        for addr, length in ((CQ, CQE_BYTES << CQ_LOG2), (RECV, RECV_BYTES << RQ_LOG2),
                             (DATA, plan.ram_bytes - DATA)):
            self.memory.allow(addr, length)
        self.pings = self.connections = 0
        self.log = []
        self.cq_head = 0
        self._run(plan.start(mac=mac, ip=ip, keys=keys))
        self._arm()

    def _run(self, writes):
        for offset, word in writes:
            self.regs.write(offset, word)

    def _arm(self):
        self.sq_tail, self.rq_tail, self.phase, self.size = 0, 1 << RQ_LOG2, 0, 0
        self._run(self.plan.arm(self.conn))

    def _read64(self, name):
        offset = self.plan.map.offset(name)
        return self.regs.read(offset) | self.regs.read(offset + 4) << 32

    def service(self):
        """Act on every event queued and every new completion."""
        while True:
            event = unpack(NicEvent, self._read64("event0"))
            kind = NicEventKind(event["kind"])
            if kind == NicEventKind.NONE:
                break
            octets = self._startup(event["data"] & 0xFFFF) \
                if kind == NicEventKind.STARTUP else b""
            self._run(self.plan.write("event_pop", 0))
            if event["conn"] == self.conn:
                self._event(kind, event["code"], octets)
        while self._completion():
            pass

    def _startup(self, length):
        octets = b""
        for _ in range(-(-length // 4)):
            octets += self.regs.read(self.plan.map.offset("startup_data")).to_bytes(4, "little")
            self._run(self.plan.write("startup_pop", 0))
        return octets[:length]

    def _event(self, kind, code, octets):
        if kind == NicEventKind.STARTUP:
            try:
                if ReleaseKind(code) != ReleaseKind.STARTUP:
                    raise BadRequest(f"startup event {ReleaseKind(code).name}")
                self._run(self.plan.accept(self.conn, octets))
                self.log.append("accepted")
            except BadRequest as error:
                self.log.append(f"refused: {error}")
                self._run(self.plan.end(self.conn, abort=True))
        elif kind == NicEventKind.TCP and EventKind(code) == EventKind.PEER_FIN:
            self._run(self.plan.end(self.conn, abort=False))
        elif kind == NicEventKind.TCP and EventKind(code) in _ENDED:
            self.log.append(f"ended: {EventKind(code).name}")
            self.connections += 1
            self._arm()
        elif kind in (NicEventKind.FAULT, NicEventKind.TERMINATE):
            # Our Terminate must reach the peer (a reset would drop it from the send ring),
            # which then closes: its FIN is answered. The peer's Terminate is in: reset.
            self.log.append(f"{kind.name} {code:#06x}")
            if kind == NicEventKind.TERMINATE:
                self._run(self.plan.end(self.conn, abort=True))

    def _completion(self):
        """Act on the completion at the head of the queue, if the NIC has written it."""
        entries = 1 << CQ_LOG2
        raw = self.memory.read(CQ + (self.cq_head % entries) * CQE_BYTES, CQE_BYTES)
        cqe = unpack(Cqe, int.from_bytes(raw, "little"))
        if cqe["owner"] != 1 - (self.cq_head >> CQ_LOG2) % 2:
            return False
        self.cq_head += 1
        self._run(self.plan.write("cq_head", self.cq_head & 0xFFFF, 0))
        if cqe["qp"] != self.conn:
            return True
        if cqe["status"]:
            self.log.append(f"completion error {cqe}")
            self._run(self.plan.end(self.conn, abort=True))
        elif cqe["kind"] == CqeKind.RECV:
            self._received(cqe)
        return True

    def _received(self, cqe):
        """A receive completed: post it again, and if it is rping's 16 octets, go on with the
        ping (the Read and its fenced Send, or the Write and its Send)."""
        info = self.memory.read(RECV + RECV_BYTES * (cqe["wqe"] % (1 << RQ_LOG2)), 16)
        self.rq_tail += 1
        self._run(self.plan.write("rq_doorbell", self.rq_tail & 0xFFFF, self.conn))
        if cqe["byte_len"] != 16:
            return
        if self.phase == 0:
            self.size = int.from_bytes(info[12:16], "big")
            patch = self.plan.read_patch(info)
        else:
            patch = self.plan.write_patch(info, self.size)
            self.pings += 1
        for offset, octets in patch:
            self.memory.write(offset, octets)
        self.sq_tail += 2
        self._run(self.plan.write("sq_doorbell", self.sq_tail & 0xFFFF, self.conn))
        self.phase ^= 1
        assert self.sq_tail % (1 << SQ_LOG2) == 2 * self.phase

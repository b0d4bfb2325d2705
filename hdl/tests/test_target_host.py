# amaranth: UnusedElaboratable=no
"""The memory target's host in gateware (``iwarp_nic.apps.target_host.TargetHost``) under the
Amaranth simulator, against its plan (``iwarp_nic.apps.target.TargetPlan``): a Python stand-in
for NicCore answers its register accesses (through the project's AXI4-Lite target) with a
queue of events and a startup frame, and a Python RAM answers its word port, with random
stalls on both. Every register write and every RAM write the host makes must be the plan's,
in order:

* at reset, ``start`` then ``arm``;
* siw's MPA Request (each build's: revision 2, with CRCs, revision 1, peer-to-peer) answered
  with ``accept``'s writes for it; a Request the plan refuses (markers) with ``end(abort)``;
* a ping from the completion queue: the receive's CQE read by its owner bit, ``cq_head`` and
  the receive posted again, ``read_patch`` of the client's 16 octets and the doorbell of two
  send entries; the second receive: ``write_patch`` with the first one's size, and the ping
  counted;
* the peer's FIN answered with ``end(close)``, the end of the connection with ``arm``.

The whole target against Linux rping runs in ``tb/siw/test_nic_vs_siw.py``.
"""

import random

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from iwarp_model.wire import mpa
from iwarp_nic.apps.target import CQ, RECV, RECV_BYTES, TargetPlan
from iwarp_nic.apps.target_host import TargetHost
from iwarp_nic.host.axil import AxiLiteTarget
from iwarp_nic.host.formats import Cqe
from iwarp_nic.host.nicmap import NicEventKind
from iwarp_tb.amsim import run
from iwarp_tb.harness import pack
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

PLAN = TargetPlan()
MAC, IP, KEYS = 0x0200_0000_0005, 0xC0A8_0132, 0x1234_5678_9ABC_DEF0_1122_3344_5566_7788_99AA


class _HostOnBus(Elaboratable):
    def __init__(self, **host):
        self.host = TargetHost(PLAN, mac=MAC, ip=IP, keys=KEYS, **host)
        self.target = AxiLiteTarget(16, 4)

    def elaborate(self, platform):
        m = Module()
        m.submodules.host, m.submodules.target = self.host, self.target
        wiring.connect(m, self.host.m_axil, self.target.s_axil)
        return m


class FakeNic:
    """NicCore's registers as the host sees them: ``events`` (``(kind, code, data)``, conn
    0) to be read from ``event0`` and popped, the current startup frame's words, and every
    write recorded (pops too)."""

    def __init__(self):
        self.events, self.startup, self.writes = [], [], []

    def read(self, offset):
        m = PLAN.map
        kind, code, data = self.events[0] if self.events else (0, 0, 0)
        if offset == m.offset("event0"):
            return kind | code << 16
        if offset == m.offset("event0") + 4:
            return data
        if offset == m.offset("startup_data"):
            return self.startup[0]
        raise AssertionError(f"the host read register {offset:#x}")

    def write(self, offset, value):
        self.writes.append((offset, value))
        if offset == PLAN.map.offset("event_pop"):
            self.events.pop(0)
        elif offset == PLAN.map.offset("startup_pop"):
            self.startup.pop(0)

    def startup_frame(self, octets):
        self.startup = [int.from_bytes(octets[k:k + 4].ljust(4, b"\0"), "little")
                        for k in range(0, len(octets), 4)]
        self.events.append((NicEventKind.STARTUP, 0, len(octets)))


def served(steps, rng, **host):
    """Run the host through ``steps``, each ``(action, until)``: ``action(nic, ram)`` at once,
    then wait until ``until(nic, ram)``. Returns the fake NIC, the RAM, and a dict of the
    ping count and ``(listening, connected)`` after each step (``lights``)."""
    dut = _HostOnBus(**host)
    nic, ram = FakeNic(), bytearray(PLAN.ram_bytes)
    ram[:len(PLAN.image())] = PLAN.image()
    ram_writes, result = [], {"lights": []}
    host, target = dut.host, dut.target

    async def registers(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [request] = await recv(bus, StreamPort.amaranth(target.o_write), 1, rng=rng,
                                   stall=0.3, timeout=100_000)
            nic.write(request["addr"], request["data"])
            await send(bus, StreamPort.amaranth(target.i_write_done), [{"error": 0}], rng=rng,
                       idle=0.3)

    async def register_reads(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [request] = await recv(bus, StreamPort.amaranth(target.o_read), 1, rng=rng,
                                   stall=0.3, timeout=100_000)
            await send(bus, StreamPort.amaranth(target.i_read),
                       [{"data": nic.read(request["addr"]), "error": 0}], rng=rng, idle=0.3)

    async def ram_writes_bench(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [request] = await recv(bus, StreamPort.amaranth(host.o_ram_write), 1, rng=rng,
                                   stall=0.3, timeout=100_000)
            assert request["strb"] == 0xFF
            ram[request["addr"]:request["addr"] + 8] = request["data"].to_bytes(8, "little")
            ram_writes.append((request["addr"], request["data"].to_bytes(8, "little")))
            await send(bus, StreamPort.amaranth(host.i_ram_write_done), [{"error": 0}],
                       rng=rng, idle=0.3)

    async def ram_reads(ctx):
        bus = AmaranthBus(ctx)
        while True:
            [request] = await recv(bus, StreamPort.amaranth(host.o_ram_read), 1, rng=rng,
                                   stall=0.3, timeout=100_000)
            at = request["addr"]
            assert at % 8 == 0
            await send(bus, StreamPort.amaranth(host.i_ram_read),
                       [{"data": int.from_bytes(ram[at:at + 8], "little"), "error": 0}],
                       rng=rng, idle=0.3)

    async def driver(ctx):
        for action, until in steps:
            action(nic, ram)
            for _ in range(200_000):
                await ctx.tick()
                if until(nic, ram_writes):
                    break
            else:
                raise AssertionError(f"stuck: {until.__doc__}; writes {nic.writes[-5:]}")
            await ctx.tick().repeat(200)            # the rest of the step's program
            result["lights"].append((ctx.get(host.listening), ctx.get(host.connected)))
        result["pings"] = ctx.get(host.pings)

    run(dut, driver, monitors=[registers, register_reads, ram_writes_bench, ram_reads],
        name="target_host")
    return nic, ram_writes, result


def without_pops(writes):
    pops = {PLAN.map.offset("event_pop"), PLAN.map.offset("startup_pop")}
    return [w for w in writes if w[0] not in pops]


def nothing(nic, ram):
    pass


REQUESTS = {
    "stock": mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(1, 1)),
    "crc": mpa.MpaFrame(reply=False, crc=True, revision=2, enhanced=mpa.EnhancedData(1, 1)),
    "rev1": mpa.MpaFrame(reply=False, crc=False, revision=1),
    "p2p": mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        1, 1, peer_to_peer=True, rtr_write=True, rtr_read=True)),
    "p2p-send": mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        0, 1, peer_to_peer=True, rtr_send=True)),
    "private-data": mpa.MpaFrame(reply=False, crc=False, revision=2,
                                 enhanced=mpa.EnhancedData(2, 2), private_data=bytes(range(9))),
}


def cqe(index, wqe, kind, byte_len):
    value = pack(Cqe, wqe=wqe, qp=0, kind=kind, status=0, byte_len=byte_len,
                 owner=1 - (index >> 4) % 2)
    return value.to_bytes(32, "little")


@pytest.mark.parametrize("name", REQUESTS)
def test_accept_and_ping(name):
    """Boot, a Request answered, one ping served, the peer's FIN, the end, re-armed."""
    rng = random.Random(name)
    request = REQUESTS[name].encode()
    boot = PLAN.start(mac=MAC, ip=IP, keys=KEYS) + PLAN.arm(0)
    accept = PLAN.accept(0, request)
    info_a = (0x7F00_1234_5678).to_bytes(8, "big") + (0xABCD).to_bytes(4, "big") + \
        (64).to_bytes(4, "big")
    info_b = (0x7F00_9999_0000).to_bytes(8, "big") + (0xBEEF).to_bytes(4, "big") + \
        (64).to_bytes(4, "big")
    def first_receive(nic, ram):
        ram[RECV:RECV + 16] = info_a
        ram[CQ:CQ + 32] = cqe(0, 0, 1, 16)

    def second_receive(nic, ram):
        ram[RECV + RECV_BYTES:RECV + RECV_BYTES + 16] = info_b
        for k, (wqe, kind) in enumerate([(0, 0), (1, 0)], start=1):   # the Read, the Send
            ram[CQ + 32 * k:CQ + 32 * k + 32] = cqe(k, wqe, kind, 0)
        ram[CQ + 96:CQ + 128] = cqe(3, 1, 1, 16)

    def writes_reach(count):
        def until(nic, ram_writes):
            """the register writes to reach a count"""
            return len(without_pops(nic.writes)) >= count
        return until

    n_boot, n_accept = len(boot), len(boot) + len(accept)
    first = n_accept + 3            # cq_head, rq_doorbell, sq_doorbell
    second = first + 5              # three cq_heads, rq_doorbell, sq_doorbell
    close = PLAN.end(0, abort=False)
    steps = [(nothing, writes_reach(n_boot)),
             (lambda nic, ram: nic.startup_frame(request), writes_reach(n_accept)),
             (first_receive, writes_reach(first)),
             (second_receive, writes_reach(second)),
             (lambda nic, ram: nic.events.append((NicEventKind.TCP, 1, 0)),
              writes_reach(second + len(close))),
             (lambda nic, ram: nic.events.append((NicEventKind.TCP, 2, 0)),
              writes_reach(second + len(close) + len(PLAN.arm(0))))]
    nic, ram_writes, result = served(steps, rng)
    writes = without_pops(nic.writes)
    m = PLAN.map
    assert writes[:n_boot] == boot
    assert writes[n_boot:n_accept] == accept
    assert writes[n_accept:first] == [(m.offset("cq_head", 0), 1), (m.offset("rq_doorbell", 0), 5),
                                      (m.offset("sq_doorbell", 0), 2)]
    assert writes[first:second] == [(m.offset("cq_head", 0), 2), (m.offset("cq_head", 0), 3),
                                    (m.offset("cq_head", 0), 4),
                                    (m.offset("rq_doorbell", 0), 6),
                                    (m.offset("sq_doorbell", 0), 4)]
    assert writes[second:] == close + PLAN.arm(0)
    assert ram_writes == PLAN.read_patch(info_a) + PLAN.write_patch(info_b, 64)
    assert result["pings"] == 1
    assert result["lights"] == [(1, 0), (0, 1), (0, 1), (0, 1), (0, 0), (1, 0)]
    pops = [w for w in nic.writes if w[0] == m.offset("startup_pop")]
    assert len(pops) == -(-len(request) // 4) and not nic.startup


def test_refused():
    """A Request with markers (the target sends none) is answered with an abort."""
    request = mpa.MpaFrame(reply=False, markers=True, crc=False, revision=2,
                           enhanced=mpa.EnhancedData(1, 1)).encode()
    boot = PLAN.start(mac=MAC, ip=IP, keys=KEYS) + PLAN.arm(0)
    abort = PLAN.end(0, abort=True)

    def until(nic, ram_writes):
        """the abort"""
        return len(without_pops(nic.writes)) >= len(boot) + len(abort)
    nic, ram_writes, _ = served([(nothing, lambda nic, rw: len(without_pops(nic.writes))
                                  >= len(boot)),
                                 (lambda nic, ram: nic.startup_frame(request), until)],
                                random.Random(5))
    assert without_pops(nic.writes)[len(boot):] == abort and ram_writes == []


def test_fault_waits_for_the_peer():
    """A Terminate this end sent (FAULT): no register touched, so that the Terminate is not
    dropped by a reset; the peer's FIN is answered with a close, the end re-arms."""
    request = REQUESTS["crc"].encode()
    boot = PLAN.start(mac=MAC, ip=IP, keys=KEYS) + PLAN.arm(0)
    accept = PLAN.accept(0, request)
    close = PLAN.end(0, abort=False)
    n_accept = len(boot) + len(accept)

    def writes_reach(count):
        def until(nic, ram_writes):
            """the register writes to reach a count"""
            return len(without_pops(nic.writes)) >= count
        return until

    def event_popped(nic, ram_writes):
        """the FAULT event popped"""
        return not nic.events

    steps = [(nothing, writes_reach(len(boot))),
             (lambda nic, ram: nic.startup_frame(request), writes_reach(n_accept)),
             (lambda nic, ram: nic.events.append((NicEventKind.FAULT, 0x1101, 0)),
              event_popped),
             (lambda nic, ram: nic.events.append((NicEventKind.TCP, 1, 0)),
              writes_reach(n_accept + len(close))),
             (lambda nic, ram: nic.events.append((NicEventKind.TCP, 3, 0)),
              writes_reach(n_accept + len(close) + len(PLAN.arm(0))))]
    nic, ram_writes, result = served(steps, random.Random(9))
    assert without_pops(nic.writes)[n_accept:] == close + PLAN.arm(0)
    assert result["lights"] == [(1, 0), (0, 1), (0, 0), (0, 0), (1, 0)]
    assert ram_writes == []


def test_silent_peer_is_reset():
    """A peer connects (TCP's ESTABLISHED) and sends no Request: reset after the host's
    ``startup_cycles``, and the slot armed again; a peer whose Request comes in time is
    accepted as usual."""
    boot = PLAN.start(mac=MAC, ip=IP, keys=KEYS) + PLAN.arm(0)
    abort = PLAN.end(0, abort=True)
    request = REQUESTS["stock"].encode()
    accept = PLAN.accept(0, request)
    clock = {"at": 0}

    def writes_reach(count):
        def until(nic, ram_writes):
            """the register writes to reach a count"""
            return len(without_pops(nic.writes)) >= count
        return until

    def connected(nic, ram):
        nic.events.append((NicEventKind.TCP, 0, 0))

    steps = [(nothing, writes_reach(len(boot))),
             (connected, writes_reach(len(boot) + len(abort))),
             (lambda nic, ram: nic.events.append((NicEventKind.TCP, 5, 0)),
              writes_reach(len(boot) + len(abort) + len(PLAN.arm(0)))),
             (connected, lambda nic, ram_writes: clock.update(at=clock["at"] + 1)
              or clock["at"] > 1000),
             (lambda nic, ram: nic.startup_frame(request),
              writes_reach(len(boot) + len(abort) + len(PLAN.arm(0)) + len(accept)))]
    nic, ram_writes, result = served(steps, random.Random(3), startup_cycles=3000)
    writes = without_pops(nic.writes)
    assert writes[len(boot):] == abort + PLAN.arm(0) + accept
    assert result["lights"] == [(1, 0), (0, 0), (1, 0), (1, 0), (0, 1)]

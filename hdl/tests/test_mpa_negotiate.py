# amaranth: UnusedElaboratable=no
"""MpaNegotiator against the model's ``Connection`` at 1, 8 and 64 bytes.

The oracle is a model ``Connection`` with the gateware's options (its "mirror"), set against a
model peer with random options of its own: revision 1 or 2, CRC, markers, IRD, ORD, the
peer-to-peer model with any RTR types offered and accepted, private data of any length, the
Responder accepting at once or after its host decided (accept or reject, with private data).
The peer's frame (and FPDU octets after it, in random TCP chunks) goes to the gateware and to
the mirror. The gateware must write the mirror's frame octet for octet, end as the mirror ends
(established, rejected either way, a bad frame, a Reply of a higher revision, no matching
RTR with its Terminate) with what the mirror settled (revision, CRC, markers of each
direction, peer-to-peer, RTR, IRD, ORD), give the peer's private data, and pass the octets
after the frame on only once established. Random stalls on every output. The timer is checked
against its contract: the outcome is TIMEOUT exactly when the frame does not complete within
``timeout`` ticks.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection, ConnState, Rtr
from iwarp_model.wire.errors import WireError
from iwarp_model.wire.mpa import EnhancedData, MpaFrame, MpaFrameReader
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.errors import TerminateCode
from iwarp_nic.mpa.negotiate import MpaNegotiator, Outcome
from iwarp_nic.mpa.negotiate import Rtr as HwRtr
from iwarp_nic.mpa.startup import StartupError
from iwarp_tb.amsim import run
from iwarp_tb.startup import ERROR_OF
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    send,
    send_packets,
    tcp_chunks,
    until_quiet,
)

STALL = IDLE = 0.25
RTRS = (Rtr.WRITE, Rtr.READ, Rtr.SEND)         # the gateware Responder's order of preference
HW_RTR = {None: HwRtr.NONE, Rtr.SEND: HwRtr.SEND, Rtr.WRITE: HwRtr.WRITE, Rtr.READ: HwRtr.READ}


def random_options(rng):
    """Options of one end, as ``Connection`` takes them (with its QP's IRD and ORD)."""
    revision = rng.choice([1, 2, 2])
    p2p = revision == 2 and rng.random() < 0.6
    rtr = tuple(k for k in RTRS if rng.random() < 0.5) or (rng.choice(RTRS),)
    room = 512 - (4 if revision == 2 else 0)
    return {"revision": revision, "crc": rng.random() < 0.5, "markers": rng.random() < 0.5,
            "p2p": p2p, "rtr": rtr, "private_data": rng.randbytes(
                rng.choice([0, 0, 1, room, rng.randrange(room + 1)])),
            "ird": rng.randrange(33), "ord": rng.randrange(33)}


def connection(options, *, active, auto_accept=True):
    dev = verbs.Device("n")
    pd = dev.alloc_pd()
    cq = dev.create_cq(16)
    qp = dev.create_qp(pd, cq, cq, max_rd_atomic=options["ord"],
                       max_dest_rd_atomic=options["ird"])
    kw = {k: v for k, v in options.items() if k not in ("ird", "ord")}
    return Connection(qp, active=active, auto_accept=auto_accept, **kw)


def config(options, *, initiator, hold=False):
    """The gateware's NegotiationConfig for ``options``."""
    rtr = options["rtr"]
    return {"initiator": initiator, "revision": options["revision"], "crc": options["crc"],
            "markers": options["markers"], "p2p": options["p2p"],
            "rtr_send": Rtr.SEND in rtr, "rtr_write": Rtr.WRITE in rtr,
            "rtr_read": Rtr.READ in rtr, "ird": options["ird"], "ord": options["ord"],
            "private_length": len(options["private_data"]), "hold": hold}


def exchange(mine, peer_octets, *, initiator, decision=None):
    """The mirror's run: its frame's octets, the result the gateware must give (the fields
    it names), the private data it must pass on."""
    mirror = connection(mine, active=initiator, auto_accept=decision is None)
    mirror.start()
    sent = mirror.transmit()
    reader = MpaFrameReader(reply=initiator)
    try:
        frame = reader.feed(peer_octets)
    except WireError as error:
        frame = error
    mirror.receive(peer_octets)
    if not initiator:
        if mirror.state == ConnState.MPA_REQUEST_RECEIVED:      # held for the host
            accept, private = decision
            (mirror.accept if accept else mirror.reject)(private)
        sent = mirror.transmit()
    assert not isinstance(frame, MpaFrame) or frame.private_data == mirror.peer_private_data
    if isinstance(frame, WireError):
        return sent, {"outcome": Outcome.BAD_FRAME, "error": ERROR_OF[type(frame)]}, b""
    result = {"outcome": _outcome(mirror, initiator), "error": StartupError.NONE}
    if result["outcome"] in (Outcome.ESTABLISHED, Outcome.NO_MATCHING_RTR):
        n = mirror.negotiated
        result.update(revision=mirror.revision, crc=int(n.crc),
                      tx_markers=int(n.tx_markers(initiator=initiator)),
                      rx_markers=int(n.rx_markers(initiator=initiator)),
                      p2p=int(n.peer_to_peer), ird=mirror.ird, ord=mirror.ord)
        if result["outcome"] == Outcome.ESTABLISHED:
            result["rtr"] = HW_RTR[mirror.rtr]
    return sent, result, frame.private_data


def _outcome(mirror, initiator):
    if mirror.terminate_sent is not None:
        assert mirror.terminate_sent.code == ErrorCode.MPA_NO_MATCHING_RTR
        return Outcome.NO_MATCHING_RTR
    if mirror.state in (ConnState.ESTABLISHED, ConnState.AWAIT_RTR):
        return Outcome.ESTABLISHED
    if mirror.reject_reason is not None:
        return Outcome.PEER_REJECTED if initiator else Outcome.REJECTED
    assert "revision" in mirror.reason, mirror.reason
    return Outcome.BAD_REVISION


def simulate(n, mine, peer_octets, *, initiator, seed, decision=None, after=b"",
             timeout=0, tick_every=1, delay=0):
    """The gateware with ``mine`` against ``peer_octets`` (then ``after``): its frame, result,
    fault, the peer's private data it gave and the octets it passed on."""
    rng = random.Random(seed)
    dut = MpaNegotiator(n)
    got = {}
    hold = decision is not None
    chunks = tcp_chunks(rng, peer_octets + after, sizes=(1, 5, 64, 600, 1460))
    outputs = [dut.o_tx, dut.o, dut.o_result, dut.o_fault, dut.o_private, dut.o_peer]

    async def host(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.timeout, timeout)
        await send(bus, StreamPort.amaranth(dut.i_config),
                   [config(mine, initiator=initiator, hold=hold)])
        if mine["private_data"] and (initiator or not hold):
            await send_packets(bus, StreamPort.amaranth(dut.i_private), [mine["private_data"]],
                               n, rng=random.Random(seed + 1), idle=IDLE)
        if hold:
            while not got["peer"]:
                await ctx.tick()
            frame = got["peer"][0]
            if frame["error"] == StartupError.NONE and not _auto_reject(mine, frame):
                accept, data = decision
                await send(bus, StreamPort.amaranth(dut.i_decision),
                           [{"accept": accept, "private_length": len(data)}])
                if data:
                    await send_packets(bus, StreamPort.amaranth(dut.i_private), [data], n,
                                       rng=random.Random(seed + 2), idle=IDLE)
        for _ in range(1 << 16):
            if got["result"]:
                break
            await ctx.tick()
        await until_quiet(ctx, outputs, 300)

    async def peer(ctx):
        for _ in range(delay):
            await ctx.tick()
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), chunks, n,
                           rng=random.Random(seed + 3), idle=IDLE, timeout=1 << 30)

    async def clock(ctx):
        while True:
            for _ in range(tick_every - 1):
                await ctx.tick()
            ctx.set(dut.tick, 1)
            await ctx.tick()
            ctx.set(dut.tick, 0)

    def monitor(key, port, offset, packets=False):
        return collector(got, key, port, data_bytes=n if packets else None,
                         rng=random.Random(seed + offset), stall=STALL)

    run(dut, host, monitors=[
        peer, clock, monitor("tx", dut.o_tx, 4, True), monitor("o", dut.o, 5, True),
        monitor("result", dut.o_result, 6), monitor("fault", dut.o_fault, 7),
        monitor("private", dut.o_private, 8, True), monitor("peer", dut.o_peer, 9)],
        name=f"mpa_negotiate_w{n}")
    return got


def _auto_reject(mine, frame):
    """The gateware Responder rejects on its own: peer-to-peer on both sides, no RTR common."""
    if not (mine["p2p"] and mine["revision"] == 2 and frame["enhanced"] and frame["p2p"]):
        return False
    offered = {Rtr.SEND: frame["rtr_send"], Rtr.WRITE: frame["rtr_write"],
               Rtr.READ: frame["rtr_read"]}
    return not any(offered[k] for k in mine["rtr"])


def check(n, mine, peer_octets, *, initiator, seed, decision=None):
    """The gateware ends as the mirror does."""
    after = random.Random(seed).randbytes(random.Random(seed).choice([0, 1, 700]))
    sent, result, private = exchange(mine, peer_octets, initiator=initiator,
                                        decision=decision)
    got = simulate(n, mine, peer_octets, initiator=initiator, seed=seed, decision=decision,
                   after=after)
    assert [bytes(p) for p in got["tx"]] == ([sent] if sent else [])
    (outcome,) = got["result"]
    assert {k: outcome[k] for k in result} == result, (outcome, result)
    assert [bytes(p) for p in got["private"]] == ([private] if private else [])
    if result["outcome"] == Outcome.NO_MATCHING_RTR:
        (fault,) = got["fault"]
        assert fault["code"] == TerminateCode.MPA_NO_MATCHING_RTR
        assert fault["offending_length"] == 0
    else:
        assert not got["fault"]
    passed = b"".join(bytes(p) for p in got["o"])
    assert passed == (after if result["outcome"] == Outcome.ESTABLISHED else b"")
    return result["outcome"]


def peer_request(options):
    """The octets of a model Initiator's Request."""
    conn = connection(options, active=True)
    conn.start()
    return conn.transmit()


def peer_reply(options, request_octets):
    """The octets of a model Responder's Reply (or Reject) to ``request_octets``."""
    conn = connection(options, active=False)
    conn.start()
    conn.receive(request_octets)
    return conn.transmit()


@pytest.mark.parametrize("n", [1, 8, 64])
def test_responder(n):
    """Requests of every kind answered as the model answers them, at once or after the host
    accepted or rejected them."""
    rng = random.Random(n)
    seen = set()
    for k in range(8 if n == 1 else 16):
        mine, theirs = random_options(rng), random_options(rng)
        decision = None
        if k % 3 == 1:
            room = 512 - (4 if mine["revision"] == 2 else 0)
            decision = (rng.random() < 0.5, rng.randbytes(rng.choice([0, 7, room])))
        seen.add(check(n, mine, peer_request(theirs), initiator=False, seed=k,
                       decision=decision))
    assert {Outcome.ESTABLISHED, Outcome.REJECTED} <= seen


@pytest.mark.parametrize("n", [1, 8, 64])
def test_initiator(n):
    """Replies of every kind (from a model Responder to the gateware's Request) read as the
    model reads them: established, rejected, no matching RTR."""
    rng = random.Random(100 + n)
    seen = set()
    for k in range(8 if n == 1 else 16):
        mine, theirs = random_options(rng), random_options(rng)
        if k % 4 == 0:
            mine.update(revision=2, p2p=True, private_data=mine["private_data"][:508])
        reply = peer_reply(theirs, peer_request(mine))
        seen.add(check(n, mine, reply, initiator=True, seed=k))
    assert {Outcome.ESTABLISHED, Outcome.NO_MATCHING_RTR} <= seen


@pytest.mark.parametrize("n", [1, 8, 64])
def test_bad_replies(n):
    """Replies the model refuses: malformed, of a higher revision, choosing several RTR types
    or one not offered, a Request where a Reply is due."""
    rng = random.Random(200 + n)
    p2p = {"revision": 2, "p2p": True, "rtr": (Rtr.WRITE, Rtr.READ)}
    cases = [
        ({"revision": 1, "p2p": False}, MpaFrame(reply=True, revision=2), Outcome.BAD_REVISION),
        (p2p, MpaFrame(reply=True, enhanced=EnhancedData(4, 4, True, rtr_write=True,
                                                         rtr_read=True)),
         Outcome.NO_MATCHING_RTR),
        (p2p, MpaFrame(reply=True, enhanced=EnhancedData(4, 4, True, rtr_send=True)),
         Outcome.NO_MATCHING_RTR),
        (p2p, MpaFrame(reply=False, enhanced=EnhancedData(4, 4)), Outcome.BAD_FRAME),
        ({}, MpaFrame(reply=True, reject=True, private_data=b"busy"), Outcome.PEER_REJECTED),
    ]
    for k, (changes, reply, expected) in enumerate(cases):
        mine = random_options(rng)
        mine.update(changes, private_data=mine["private_data"][:508])
        octets = bytearray(reply.encode())
        assert check(n, mine, bytes(octets), initiator=True, seed=k) == expected
    for k in range(3):
        octets = bytearray(MpaFrame(reply=True).encode())
        octets[rng.choice([*range(16), 17])] ^= 0xFF        # the key, or Rev
        assert check(n, random_options(rng), bytes(octets), initiator=True,
                     seed=10 + k) == Outcome.BAD_FRAME


@pytest.mark.parametrize("n", [1, 8])
def test_timeout(n):
    """TIMEOUT when the peer's frame comes long after ``timeout`` ticks; none when it completes
    well within them, or when there is no limit."""
    mine = random_options(random.Random(7))
    request = peer_request(random_options(random.Random(8)))
    for delay, timeout, expected in ((0, 0, None), (400, 20, Outcome.TIMEOUT),
                                     (0, 400, None), (2000, 0, None)):
        got = simulate(n, mine, request, initiator=False, seed=delay + timeout, delay=delay,
                       timeout=timeout, tick_every=4)
        (result,) = got["result"]
        if expected is None:
            assert result["outcome"] != Outcome.TIMEOUT
        else:
            assert result["outcome"] == Outcome.TIMEOUT and not got["tx"] and not got["o"]

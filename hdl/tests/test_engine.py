# amaranth: UnusedElaboratable=no
"""IwarpEngine, one connection's MPA, DDP and RDMAP in gateware, against a model peer over a
TCP byte stream, at 1, 8 and 64 bytes.

The gateware end and the model's peer set the connection up (either side the Initiator; CRC,
markers, revision, the peer-to-peer model with a Write RTR), then both post work at once:
RDMA Writes, Sends (with and without SE, Invalidate, Immediate Data) into the other's posted
receives, RDMA Reads and atomics of the other's memory, each kind on its own part of the
memory so the result does not depend on the interleaving. The oracle is the same work between
two model engines (the gateware's "mirror" and a copy of the peer): the gateware's host memory
must end as the mirror's, the peer's memory as the copy's, and the gateware's receive
completions and ends of Reads and atomics must be the mirror's, in order and in every field.
No Terminate may be sent by either end.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection, ConnState, Rtr
from iwarp_model.verbs import SGE, SendFlags, SendWR, WcOpcode, WrOpcode
from iwarp_model.wire.rdmap import ReadRequest
from iwarp_nic.ddp.placement import CompletionStatus
from iwarp_nic.engine import ConnectionsEngine, IwarpEngine
from iwarp_nic.mpa import GatherOp, Outcome
from iwarp_nic.mpa import Rtr as HwRtr
from iwarp_nic.rdmap import WorkRequest
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, from_beats
from iwarp_tb.receive import receive_answers
from iwarp_tb.stags import HostTable, load_table
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    recv,
    recv_packets,
    send,
    send_packets,
    tcp_chunks,
)
from iwarp_tb.traffic import KINDS, End, exchange, kinds, plan
from iwarp_tb.work import Headers, Requester, posted_receive, send_queue_engine, sent_ids

LIMIT = 400_000
SMALLEST_FPDU = 2 + 14        # ULPDU_Length and a tagged DDP header, no CRC


def options(rng, *, p2p, rtr=Rtr.WRITE):
    return {"crc": rng.random() < 0.5, "markers": rng.random() < 0.5,
            "revision": 2 if p2p else rng.choice([1, 2]), "p2p": p2p, "rtr": (rtr,)}


def bad_write(end, remote, wr_id):
    """An RDMA Write of ``end`` under a wrong key of ``remote``'s region: a Terminate."""
    return SendWR(wr_id, WrOpcode.RDMA_WRITE, [SGE(end.at(5), 16, end.region.lkey)],
                  SendFlags.SIGNALED, remote_addr=remote.at(0), rkey=remote.region.rkey ^ 1)


def model_run(gw_opts, peer_opts, *, initiator, seed, count, bad=None, dev=None, ord_=8):
    """The oracle: the same work between the gateware's mirror (on device ``dev`` if given)
    and a copy of the peer; the mirror's ORD and the peer's IRD are ``ord_``."""
    mirror, peer = End("g", seed, dev=dev, ord_=ord_), End("p", seed + 1, ird=ord_)
    rng = random.Random(seed + 2)
    mine, their_recvs = plan(rng, mirror, peer, count, kinds=KINDS)
    theirs, my_recvs = plan(rng, peer, mirror, count, kinds=KINDS)
    if bad == "peer":
        theirs.append(bad_write(peer, mirror, 99))
    elif bad == "ours":
        mine.append(bad_write(mirror, peer, 99))
    ours, others = ((mine, my_recvs), gw_opts), ((theirs, their_recvs), peer_opts)
    (first, first_work), (second, second_work) = (
        ((mirror, ours), (peer, others)) if initiator else ((peer, others), (mirror, ours)))
    ends = exchange(first, second, (first_work[0], second_work[0]), first_opts=first_work[1],
                    second_opts=second_work[1])
    a, b = ends if initiator else ends[::-1]
    assert bad or (a.terminate_sent is None and b.terminate_sent is None), (a.reason, b.reason)
    return a, mirror, peer, mine, theirs, my_recvs, their_recvs


def config(opts, *, initiator, qp):
    return {"initiator": initiator, "revision": opts["revision"], "crc": opts["crc"],
            "markers": opts["markers"], "p2p": opts["p2p"],
            **{f"rtr_{kind.name.lower()}": int(opts["p2p"] and kind in opts["rtr"])
               for kind in (Rtr.SEND, Rtr.WRITE, Rtr.READ)}, "ird": qp.max_dest_rd_atomic,
            "ord": qp.max_rd_atomic, "private_length": 0, "hold": 0}


_RECEIVES = (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM)
_ENDS = (WcOpcode.RDMA_READ, WcOpcode.FETCH_ADD, WcOpcode.COMP_SWAP, WcOpcode.MASKED_FETCH_ADD,
         WcOpcode.MASKED_COMP_SWAP)


def _wanted(wcs):
    """The receive completions and the ends of Reads and atomics among the model's ``wcs``."""
    return (sum(wc.opcode in _RECEIVES for wc in wcs), sum(wc.opcode in _ENDS for wc in wcs))


def compare_completions(wcs, completions, read_done):
    """The gateware's receive completions and ends of Reads and atomics are the model's
    ``wcs``, in order and in every field."""
    assert [(c["id"], c["status"], c["byte_len"]) for c in completions] == [
        (wc.wr_id, CompletionStatus(int(wc.status)), wc.byte_len)
        for wc in wcs if wc.opcode in _RECEIVES]
    assert [(d["id"], d["status"]) for d in read_done] == [
        (wc.wr_id, CompletionStatus(int(wc.status))) for wc in wcs if wc.opcode in _ENDS]


def host_memory(dut, n, span):
    """Testbenches playing the host memory of ``dut`` (an engine): its placements written,
    its payload reads and atomics' read-modify-writes answered, at the octets
    ``span(addr, length)`` gives (a buffer and an offset)."""
    async def places(ctx):
        bus = AmaranthBus(ctx)
        while True:
            (place,) = await recv(bus, StreamPort.amaranth(dut.o_place), 1, timeout=1 << 30)
            (data,) = await recv_packets(bus, StreamPort.amaranth(dut.o_data), 1, n,
                                         timeout=1 << 30)
            octets, at = span(place["addr"], place["length"])
            assert len(data) == place["length"]
            octets[at:at + len(data)] = bytes(data)

    async def reads(ctx):
        bus = AmaranthBus(ctx)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(dut.o_read), 1, timeout=1 << 30)
            octets, at = span(read["addr"], read["length"])
            await send_packets(bus, StreamPort.amaranth(dut.i_host),
                               [bytes(octets[at:at + read["length"]])], n, timeout=1 << 30)

    async def atomics(ctx):
        bus = AmaranthBus(ctx)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(dut.o_atomic_read), 1,
                                 timeout=1 << 30)
            octets, at = span(read["data"], 8)
            await send(bus, StreamPort.amaranth(dut.i_atomic_read),
                       [{"data": int.from_bytes(octets[at:at + 8], "little")}])
            (write,) = await recv(bus, StreamPort.amaranth(dut.o_atomic_write), 1,
                                  timeout=1 << 30)
            octets, at = span(write["addr"], 8)
            octets[at:at + 8] = write["data"].to_bytes(8, "little")

    return [places, reads, atomics]


def simulate(n, *, initiator, p2p, seed, count=12, bad=None, rtr=Rtr.WRITE, trailer=b""):
    """The run of :func:`model_run`'s work through the gateware end (``trailer``: octets
    sent right behind the peer's first FPDUs, which the model run does not see)."""
    rng = random.Random(seed)
    gw_opts, peer_opts = options(rng, p2p=p2p, rtr=rtr), options(rng, p2p=p2p, rtr=rtr)
    conn, mirror, copy, mine, theirs, my_recvs, their_recvs = model_run(
        gw_opts, peer_opts, initiator=initiator, seed=seed, count=count, bad=bad)
    wcs, copy_wcs, peer_wcs = mirror.cq.poll_cq(1024), copy.cq.poll_cq(1024), []

    # The gateware end: the mirror's table and memory as they were, the same work.
    gw, peer = End("g", seed), End("p", seed + 1)
    host = HostTable(random.Random(seed + 3), table=gw.dev.mr_table, pds=0)
    host.by_handle[gw.pd.handle] = gw.pd
    base = host.host_addr(gw.region.stag)
    headers = Headers()

    def source_of(sge):
        return host.check(sge.lkey, sge.addr, sge.length, 0, gw.pd.handle)[1]

    requester = Requester(source_of, headers)
    work = [w for wr in mine for w in requester.work_of(wr)]
    receives = [posted_receive(wr) for wr in my_recvs]
    remote = Connection(peer.qp, active=not initiator, **peer_opts)
    for wr in their_recvs:
        peer.qp.post_recv(wr)
    remote.start()
    dut = IwarpEngine(n, stag_entries=64)
    got = {}
    state = {"established": False}

    def span(addr, length):
        if addr in headers.octets:
            return headers.octets[addr], 0
        assert base <= addr and addr + length <= base + len(gw.memory), hex(addr)
        return gw.memory, addr - base

    async def setup(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.pd, gw.pd.handle)
        ctx.set(dut.max_ulpdu, conn._framer.max_ulpdu)
        ctx.set(dut.rtr_source, headers.put(bytes(ReadRequest.SIZE)))
        await load_table(ctx, dut.i_write, [host.write(gw.region)])
        await send(bus, StreamPort.amaranth(dut.i_config),
                   [config(gw_opts, initiator=initiator, qp=gw.qp)])
        (result,) = await recv(bus, StreamPort.amaranth(dut.o_result), 1, timeout=1 << 20)
        got["result"] = result
        assert result["outcome"] == Outcome.ESTABLISHED
        state["established"] = True
        for wr in theirs:
            peer.qp.post_send(wr)
        state["receives"] = True           # offered from now on, taken as Sends arrive
        port = dut.i_work
        whole = StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})
        await send(bus, whole, [{"bits": WorkRequest.const(w).as_bits()} for w in work],
                   rng=random.Random(seed), idle=0.2, timeout=1 << 20)
        wanted = _wanted(wcs)
        for _ in range(LIMIT):
            peer_wcs.extend(peer.cq.poll_cq(64))
            quiet = state.get("quiet", 0)
            terminated = not bad or got["faults"] or got["peer_terminate"]
            if (len(got["completions"]), len(got["read_done"])) == wanted and terminated and \
                    len(peer_wcs) == len(copy_wcs) and quiet > 500 or quiet > 20_000:
                break               # done, or stuck: the checks below say which
            await ctx.tick()

    async def offer_receives(ctx):
        while not state.get("receives"):
            await ctx.tick()
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_receive), receives,
                   timeout=1 << 30)

    async def wire_out(ctx):
        """The gateware's octets to the model peer."""
        bus = AmaranthBus(ctx)
        while True:
            (packet,) = await recv_packets(bus, StreamPort.amaranth(dut.o), 1, n,
                                           timeout=1 << 30)
            remote.receive(bytes(packet))
            state["quiet"] = 0

    async def wire_in(ctx):
        """The model peer's octets to the gateware, in TCP-sized pieces."""
        bus, r = AmaranthBus(ctx), random.Random(seed + 4)
        while True:
            data = remote.transmit()
            if not data:
                state["quiet"] = state.get("quiet", 0) + 1
                await ctx.tick()
                continue
            state["quiet"] = 0
            if state["established"] and not state.get("trailed"):
                data, state["trailed"] = data + trailer, True
            await send_packets(bus, StreamPort.amaranth(dut.i), tcp_chunks(r, data), n,
                               rng=r, idle=0.1)


    run(dut, setup, monitors=[
        offer_receives, wire_out, wire_in, *host_memory(dut, n, span),
        collector(got, "completions", dut.o_complete),
        collector(got, "read_done", dut.o_read_done),
        collector(got, "faults", dut.o_fault),
        collector(got, "peer_terminate", dut.o_peer_terminate),
        collector(got, "refused", dut.o_refused),
        collector(got, "sent", dut.o_sent)], name=f"engine_w{n}")

    assert not got["refused"]
    if not bad:
        assert sorted(e["id"] for e in got["sent"]) == sent_ids(work)
    if bad:
        # The Terminate: ours is the mirror's, the peer's reaches the gateware as sent.
        sent = conn.terminate_sent if bad == "peer" else remote.terminate_sent
        assert sent is not None and sent == (remote.terminate_received if bad == "peer"
                                             else conn.terminate_received)
        if bad == "peer":
            (fault,) = got["faults"]
            layer, etype, ecode = sent.code.value
            assert fault["code"].value == layer << 12 | etype << 8 | ecode
        else:
            (header,) = got["peer_terminate"]
            assert (header["layer"], header["etype"], header["ecode"]) == sent.code.value
            assert bytes(header["ddp_header"].to_bytes(18, "little")[:header["ddp_size"]]) \
                == sent.ddp_header and not header["bad"]
        return got
    assert not got["faults"] and not got["peer_terminate"]
    assert remote.terminate_sent is None, remote.reason
    assert gw.memory == mirror.memory, "the gateware's host memory differs from the mirror's"
    assert peer.memory == copy.memory, "the peer's memory differs from the model run's"
    compare_completions(wcs, got["completions"], got["read_done"])
    assert kinds(peer_wcs) == kinds(copy_wcs)
    return got


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("initiator", [True, False])
def test_traffic(n, initiator):
    """Both ends' work at once, the gateware the Initiator or the Responder."""
    simulate(n, initiator=initiator, p2p=False, seed=n + initiator, count=8 if n == 1 else 24)


@pytest.mark.parametrize("rtr", [Rtr.SEND, Rtr.WRITE, Rtr.READ])
@pytest.mark.parametrize("initiator", [True, False])
def test_peer_to_peer(initiator, rtr):
    """The peer-to-peer model with each RTR: the Initiator's RTR first (a Read RTR's header
    read from host memory, its zero-length Read Response placed and not reported), then the
    work."""
    simulate(8, initiator=initiator, p2p=True, seed=20 + initiator, rtr=rtr)


@pytest.mark.parametrize("bad", ["peer", "ours"])
def test_terminate(bad):
    """A Write under a wrong key: sent by the peer, the gateware's Terminate is the model's
    and reaches the peer; sent by the gateware, the peer's Terminate reaches the gateware's
    parser with its code and header copy."""
    # The sender of the bad Write is the Initiator: a Responder sends nothing first.
    simulate(8, initiator=bad == "ours", p2p=False, seed=30, count=0, bad=bad)


def test_terminate_in_stream_order():
    """The peer's Write under a wrong key, and right behind it an FPDU whose ULPDU_Length
    is above any the gateware takes: the deframer finds the length error while the placer
    is still looking the Write's STag up, yet the Terminate is the model's, the Write's
    (the first violation in the stream, RFC 5044 section 8 and RFC 5040 section 7)."""
    simulate(8, initiator=False, p2p=False, seed=30, count=0, bad="peer",
             trailer=b"\xff\xff" + bytes(30))


class Side:
    """One connection of the several-connection run: the model oracle's results, and the
    gateware end's model counterparts (its region on the shared device, the peer, the model
    engine that plays the host's part of the MPA exchange)."""

    def __init__(self, conn, spec, seed, count, mirror_dev, gw_dev):
        self.conn, self.initiator, self.bad = conn, spec["initiator"], spec.get("bad")
        rng = random.Random(seed)
        p2p, rtr = spec.get("p2p", False), spec.get("rtr", Rtr.WRITE)
        self.gw_opts, peer_opts = options(rng, p2p=p2p, rtr=rtr), options(rng, p2p=p2p, rtr=rtr)
        (self.model, self.mirror, self.copy, mine, theirs, my_recvs,
         their_recvs) = model_run(self.gw_opts, peer_opts, initiator=self.initiator,
                                  seed=seed, count=count, bad=self.bad, dev=mirror_dev,
                                  ord_=spec.get("ord", 8))
        self.wcs, self.copy_wcs, self.peer_wcs = (self.mirror.cq.poll_cq(1024),
                                                  self.copy.cq.poll_cq(1024), [])
        self.gw = End("g", seed, dev=gw_dev, ord_=spec.get("ord", 8))
        self.peer = End("p", seed + 1, ird=spec.get("ord", 8))
        assert self.gw.region.stag == self.mirror.region.stag
        self.mine, self.theirs = mine, theirs
        self.receives = [posted_receive(wr) for wr in my_recvs]
        self.remote = Connection(self.peer.qp, active=not self.initiator, **peer_opts)
        for wr in their_recvs:
            self.peer.qp.post_recv(wr)
        self.front = Connection(self.gw.qp, active=self.initiator, **self.gw_opts)
        self.front.start()
        self.remote.start()

    def peer_frame(self):
        """The peer's startup frame, as the gateware end's TCP stream brings it: the
        Responder's Reply to the front's Request, or the Initiator's Request."""
        if self.initiator:
            self.remote.receive(self.front.transmit())
        return self.remote.transmit()

    def settle(self, frame, zeros):
        """The host's part once the peer's frame came out of the gather: the front answers it
        (a Responder's Reply goes to the peer), and says what was negotiated (``zeros``: the
        host address of a Read RTR's header)."""
        self.front.receive(frame)
        if not self.initiator:
            self.remote.receive(self.front.transmit())
        front = self.front
        assert front.state in (ConnState.ESTABLISHED, ConnState.AWAIT_RTR), front.reason
        rtr = HwRtr[front.rtr.name] if front.p2p else HwRtr.NONE
        initiator = self.initiator
        opened = {"conn": self.conn, "pd": self.gw.pd.handle, "ird": front.ird,
                  "ord": front.ord, "initiator": int(initiator), "rtr": rtr.value,
                  "rtr_source": zeros,
                  "max_ulpdu": front._framer.max_ulpdu, "crc": int(front.negotiated.crc),
                  "markers": int(front.negotiated.tx_markers(initiator=initiator))}
        fpdus = {"op": GatherOp.FPDUS.value, "conn": self.conn,
                 "markers": int(front.negotiated.rx_markers(initiator=initiator)),
                 "crc": int(front.negotiated.crc)}
        return opened, fpdus


def simulate_connections(n, specs, *, seed, count):
    """The connections of ``specs`` (conn -> {initiator, p2p, bad, ord}) through one
    :class:`ConnectionsEngine`, each against its own model peer, at once: the host plays the
    MPA exchange (the peer's frame through the gather, this end's written to the peer), opens
    each connection with what was negotiated, then both ends of every connection post their
    work; the chunks of the connections' streams are interleaved, and so are their work
    requests (deferred ones offered again). Each connection is compared with its own pair of
    model engines (as :func:`simulate`)."""
    rng = random.Random(seed)
    mirror_dev, gw_dev = verbs.Device("g"), verbs.Device("g")
    sides = {conn: Side(conn, spec, seed + 10 * conn, count, mirror_dev, gw_dev)
             for conn, spec in specs.items()}
    host = HostTable(random.Random(seed + 3), table=gw_dev.mr_table, pds=0)
    headers = Headers()
    zeros = headers.put(bytes(ReadRequest.SIZE))
    for side in sides.values():
        host.by_handle[side.gw.pd.handle] = side.gw.pd
    bases = {conn: host.host_addr(side.gw.region.stag) for conn, side in sides.items()}

    def source_of(pd):
        return lambda sge: host.check(sge.lkey, sge.addr, sge.length, 0, pd)[1]

    work = {conn: [w for wr in side.mine
                   for w in Requester(source_of(side.gw.pd.handle), headers).work_of(wr)]
            for conn, side in sides.items()}
    dut = ConnectionsEngine(n, stag_entries=64, ring_bytes=8192)
    got = {"deferred": [], "fpdus": {conn: [] for conn in sides}, "chunks": [],
           "headers": []}
    state = {"quiet": 0, "open": {}, "delivered": dict.fromkeys(sides, 0), "cycle": 0}

    def span(addr, length):
        if addr in headers.octets:
            return headers.octets[addr], 0
        for conn, base in bases.items():
            memory = sides[conn].gw.memory
            if base <= addr and addr + length <= base + len(memory):
                return memory, addr - base
        raise AssertionError(f"{addr:#x}+{length} is in no region")

    async def chunk(bus, conn, octets):
        await send(bus, StreamPort.amaranth(dut.i_header), [{"conn": conn, "length": len(octets)}])
        await send_packets(bus, StreamPort.amaranth(dut.i), [octets], n, rng=rng, idle=0.1)

    async def tcp(ctx):
        """The TCP engine: each peer's startup frame, then its FPDUs once the connection is
        open (a Responder's peer's from 3000 cycles later), the connections' chunks
        interleaved; until every connection is done."""
        bus = AmaranthBus(ctx)
        await load_table(ctx, dut.i_write, [host.write(side.gw.region)
                                            for side in sides.values()])
        await send(bus, StreamPort.amaranth(dut.i_cmd),
                   [{"op": GatherOp.START.value, "conn": conn, "markers": 0, "crc": 0}
                    for conn in sides])
        for conn, side in sides.items():
            await chunk(bus, conn, side.peer_frame())
        plans = {conn: [] for conn in sides}
        for _ in range(LIMIT):
            for conn in state["open"]:
                if not plans[conn] and state["cycle"] >= state["open"][conn]:
                    plans[conn] = tcp_chunks(rng, sides[conn].remote.transmit())
            ready = sorted(c for c in plans if plans[c])
            if ready:
                conn = rng.choice(ready)
                octets = plans[conn].pop(0)
                await chunk(bus, conn, octets)
                state["quiet"], state["delivered"][conn] = 0, state["delivered"][conn] + \
                    len(octets)
                continue
            state["quiet"] += 1
            for side in sides.values():
                side.peer_wcs.extend(side.peer.cq.poll_cq(64))
            if state["quiet"] > 500 and all(done(side) for side in sides.values()) or \
                    state["quiet"] > 20_000:
                break           # done, or stuck: the checks below say which
            await ctx.tick()

    def done(side):
        mine = [e for e in got.get("completions", []) if e["conn"] == side.conn]
        ends = [e for e in got.get("read_done", []) if e["conn"] == side.conn]
        if side.bad:
            return side.remote.terminate_received is not None
        return (len(mine), len(ends)) == _wanted(side.wcs) and \
            len(side.peer_wcs) == len(side.copy_wcs)

    async def control(ctx):
        """The host: each startup frame answered and its connection opened; then the work
        of both ends of each connection posted."""
        bus = AmaranthBus(ctx)
        for _ in sides:
            [header] = await recv(bus, StreamPort.amaranth(dut.o_startup_header), 1,
                                  timeout=1 << 20)
            [frame] = await recv_packets(bus, StreamPort.amaranth(dut.o_startup), 1, n)
            side = sides[header["conn"]]
            opened, fpdus = side.settle(bytes(frame), zeros)
            await send(bus, StreamPort.amaranth(dut.i_open), [opened])
            await send(bus, StreamPort.amaranth(dut.i_cmd), [fpdus])
            for wr in side.theirs:
                side.peer.qp.post_send(wr)
            # A Responder's peer is slow to send its first FPDU: its work must wait for it.
            state["open"][side.conn] = state["cycle"] + (0 if side.initiator else 3000)
        await send_queue_engine(ctx, dut.i_work, dut.o_deferred, work, random.Random(seed),
                                idle=0.2, deferrals=got["deferred"])

    async def clock(ctx):
        while True:
            await ctx.tick()
            state["cycle"] += 1

    async def wire_out(ctx):
        """The gateware's FPDUs, each to its connection's peer. A Responder's first one comes
        after its peer's first FPDU (RFC 5044 section 7.1.2): at least as many octets as the
        smallest FPDU were delivered."""
        bus, r = AmaranthBus(ctx), random.Random(seed + 5)
        while True:
            beats = await recv(bus, StreamPort.amaranth(dut.o), 1, packets=True, rng=r,
                               stall=0.2, timeout=1 << 30)
            conns = {beat["conn"] for beat in beats}
            assert len(conns) == 1, f"an FPDU's beats name connections {conns}"
            (conn,) = conns
            assert sides[conn].initiator or state["delivered"][conn] >= SMALLEST_FPDU, \
                f"connection {conn}, a Responder, sent before its Initiator's first FPDU"
            [packet] = from_beats([Beat(b["data"], b["keep"], b["last"], 0) for b in beats], n)
            got["fpdus"][conn].append(bytes(packet))
            got["chunks"].append({"conn": conn, "length": len(packet)})
            sides[conn].remote.receive(bytes(packet))
            state["quiet"] = 0

    async def chunk_headers(ctx):
        bus, r = AmaranthBus(ctx), random.Random(seed + 7)
        while True:
            got["headers"] += await recv(bus, StreamPort.amaranth(dut.o_header), 1, rng=r,
                                         stall=0.2, timeout=1 << 30)


    run(dut, tcp, monitors=[
        clock, control, wire_out, chunk_headers, *host_memory(dut, n, span),
        receive_answers(dut, {conn: list(side.receives) for conn, side in sides.items()},
                        random.Random(seed + 6)),
        collector(got, "completions", dut.o_complete),
        collector(got, "read_done", dut.o_read_done),
        collector(got, "faults", dut.o_fault),
        collector(got, "peer_terminate", dut.o_peer_terminate),
        collector(got, "refused", dut.o_refused),
        collector(got, "sent", dut.o_sent)], name=f"engine_c16_w{n}")

    assert not got["refused"] and not got["peer_terminate"]
    assert got["headers"] == got["chunks"], "chunk headers differ from the FPDUs sent"
    for conn, side in sides.items():
        faults = [f for f in got["faults"] if f["conn"] == conn]
        if side.bad:
            # The gateware's Terminate is the model's, and reaches the peer as sent.
            sent = side.model.terminate_sent
            assert sent is not None and sent == side.remote.terminate_received, conn
            (fault,) = faults
            layer, etype, ecode = sent.code.value
            assert fault["code"].value == layer << 12 | etype << 8 | ecode
            continue
        assert not faults and side.remote.terminate_sent is None, (conn, side.remote.reason)
        assert sorted(e["id"] for e in got["sent"] if e["conn"] == conn) == \
            sent_ids(work[conn]), conn
        assert side.gw.memory == side.mirror.memory, f"connection {conn}: host memory"
        assert side.peer.memory == side.copy.memory, f"connection {conn}: peer memory"
        compare_completions(side.wcs, [e for e in got["completions"] if e["conn"] == conn],
                            [e for e in got["read_done"] if e["conn"] == conn])
        assert kinds(side.peer_wcs) == kinds(side.copy_wcs), conn
    return got


@pytest.mark.parametrize("n", [1, 8, 64])
def test_connections(n):
    """Four connections through one ConnectionsEngine at once, each against its own model
    peer. The engine is the Initiator of two (one peer-to-peer with a Read RTR, one with an
    ORD of 2 and a peer of IRD 2) and the Responder of two (one peer-to-peer with a Send RTR),
    with every kind of work both ways on three; the fourth's peer sends a Write under a wrong
    key, and its Terminate is the model's while the other connections run to the end."""
    count = 4 if n == 1 else 12
    specs = {2: {"initiator": True, "ord": 2},
             5: {"initiator": False, "p2p": True, "rtr": Rtr.SEND},
             9: {"initiator": True, "p2p": True, "rtr": Rtr.READ},
             14: {"initiator": False, "bad": "peer"}}
    got = simulate_connections(n, specs, seed=40 + n, count=count)
    assert {c for c, _ in got["deferred"]} & {5, 14}, "no Responder's work was held"

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
from iwarp_model.mr import Access
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import SGE, RecvWR, SendFlags, SendWR, WcOpcode, WrOpcode
from iwarp_nic.ddp.placement import CompletionStatus
from iwarp_nic.engine import IwarpEngine
from iwarp_nic.mpa import Outcome
from iwarp_nic.rdmap import WorkRequest
from iwarp_tb.amsim import run
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
from iwarp_tb.work import Headers, Requester

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
PART = 4096                     # octets of each part of a region
LIMIT = 400_000
PARTS = 8                       # writes, receives, read sources, read sinks, atomics, spare


class End:
    """One end's device: a region of PARTS parts, a QP, and its work (the same on both runs:
    the gateware end's mirror and the model end, or the peer and its copy)."""

    def __init__(self, name, seed, *, ird=8, ord_=8):
        rng = random.Random(seed)
        self.dev = verbs.Device(name)
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq(1024)
        self.qp = self.dev.create_qp(self.pd, self.cq, self.cq, max_send_wr=256,
                                     max_recv_wr=256, max_rd_atomic=ord_,
                                     max_dest_rd_atomic=ird)
        self.memory = bytearray(rng.randbytes(PARTS * PART))
        self.region = self.dev.reg_mr(self.pd, self.memory, ALL,
                                      iova=rng.getrandbits(40) & ~7)

    def at(self, part, offset=0):
        return self.region.iova + part * PART + offset


def plan(rng, local, remote, count):
    """``count`` work requests of ``local`` on ``remote``'s memory (part 0 written, part 2
    read into local part 3, part 4 atomics), and the receives ``remote`` posts for the Sends
    (into its part 1)."""
    wrs, recvs = [], []
    recv_at = 0
    for k in range(count):
        kind = rng.choice(["write", "send", "read", "atomic", "write_imm"])
        length = rng.choice([0, 1, 64, 1000, rng.randrange(PART // 2)])
        offset = rng.randrange(PART - length + 1)
        sge = [SGE(local.at(5, offset), length, local.region.lkey)] if length else []
        if kind in ("write", "write_imm"):
            op = WrOpcode.RDMA_WRITE_WITH_IMM if kind == "write_imm" else WrOpcode.RDMA_WRITE
            wrs.append(SendWR(k, op, sge, SendFlags.SIGNALED, imm_data=rng.getrandbits(32),
                              remote_addr=remote.at(0, offset), rkey=remote.region.rkey))
            if kind == "write_imm":
                recvs.append(RecvWR(1000 + len(recvs), []))
        elif kind == "send":
            room = length + rng.choice([0, 5])
            if recv_at + room > PART:
                recv_at = 0
            recvs.append(RecvWR(1000 + len(recvs), [SGE(remote.at(1, recv_at), room,
                                                         remote.region.lkey)]))
            recv_at += room
            flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if rng.random() < 0.5 else 0)
            wrs.append(SendWR(k, WrOpcode.SEND, sge, flags))
        elif kind == "read":
            sink = [SGE(local.at(3, offset), length, local.region.lkey)] if length else []
            wrs.append(SendWR(k, WrOpcode.RDMA_READ, sink, SendFlags.SIGNALED,
                              remote_addr=remote.at(2, offset), rkey=remote.region.rkey))
        else:
            op = rng.choice([WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP])
            word = rng.randrange(16)
            sink = SGE(local.at(3, PART - 8 * (word + 1)), 8, local.region.lkey)
            wrs.append(SendWR(k, op, [sink], SendFlags.SIGNALED,
                              remote_addr=remote.at(4, 8 * word), rkey=remote.region.rkey,
                              compare_add=rng.getrandbits(64), swap=rng.getrandbits(64)))
    return wrs, recvs


def options(rng, *, p2p):
    return {"crc": rng.random() < 0.5, "markers": rng.random() < 0.5,
            "revision": 2 if p2p else rng.choice([1, 2]), "p2p": p2p, "rtr": (Rtr.WRITE,)}


def bad_write(end, remote, wr_id):
    """An RDMA Write of ``end`` under a wrong key of ``remote``'s region: a Terminate."""
    return SendWR(wr_id, WrOpcode.RDMA_WRITE, [SGE(end.at(5), 16, end.region.lkey)],
                  SendFlags.SIGNALED, remote_addr=remote.at(0), rkey=remote.region.rkey ^ 1)


def model_run(gw_opts, peer_opts, *, initiator, seed, count, bad=None):
    """The oracle: the same work between the gateware's mirror and a copy of the peer."""
    mirror, peer = End("g", seed), End("p", seed + 1)
    rng = random.Random(seed + 2)
    mine, their_recvs = plan(rng, mirror, peer, count)
    theirs, my_recvs = plan(rng, peer, mirror, count)
    if bad == "peer":
        theirs.append(bad_write(peer, mirror, 99))
    elif bad == "ours":
        mine.append(bad_write(mirror, peer, 99))
    a = Connection(mirror.qp, active=initiator, **gw_opts)
    b = Connection(peer.qp, active=not initiator, **peer_opts)
    pair = MemoryPair(a, b) if initiator else MemoryPair(b, a)
    pair.start()
    assert a.state == ConnState.ESTABLISHED
    for wr in my_recvs:
        mirror.qp.post_recv(wr)
    for wr in their_recvs:
        peer.qp.post_recv(wr)
    for wr in mine:
        mirror.qp.post_send(wr)
    for wr in theirs:
        peer.qp.post_send(wr)
    pair.pump()
    assert bad or (a.terminate_sent is None and b.terminate_sent is None), (a.reason, b.reason)
    return a, mirror, peer, mine, theirs, my_recvs, their_recvs


def config(opts, *, initiator, qp):
    return {"initiator": initiator, "revision": opts["revision"], "crc": opts["crc"],
            "markers": opts["markers"], "p2p": opts["p2p"], "rtr_send": 0,
            "rtr_write": int(opts["p2p"]), "rtr_read": 0, "ird": qp.max_dest_rd_atomic,
            "ord": qp.max_rd_atomic, "private_length": 0, "hold": 0}


def simulate(n, *, initiator, p2p, seed, count=12, bad=None):
    rng = random.Random(seed)
    gw_opts, peer_opts = options(rng, p2p=p2p), options(rng, p2p=p2p)
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
    receives = [{"id": wr.wr_id, "sges": len(wr.sg_list),
                 "lkey": wr.sg_list[0].lkey if wr.sg_list else 0,
                 "addr": wr.sg_list[0].addr if wr.sg_list else 0,
                 "length": wr.sg_list[0].length if wr.sg_list else 0} for wr in my_recvs]
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
        wanted = (sum(1 for wc in wcs if wc.opcode in (WcOpcode.RECV,
                                                       WcOpcode.RECV_RDMA_WITH_IMM)),
                  sum(1 for wc in wcs if wc.opcode in (WcOpcode.RDMA_READ,
                                                       WcOpcode.FETCH_ADD,
                                                       WcOpcode.COMP_SWAP)))
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
            await send_packets(bus, StreamPort.amaranth(dut.i), tcp_chunks(r, data), n,
                               rng=r, idle=0.1)

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

    run(dut, setup, monitors=[
        offer_receives, wire_out, wire_in, places, reads, atomics,
        collector(got, "completions", dut.o_complete),
        collector(got, "read_done", dut.o_read_done),
        collector(got, "faults", dut.o_fault),
        collector(got, "peer_terminate", dut.o_peer_terminate),
        collector(got, "refused", dut.o_refused)], name=f"engine_w{n}")

    assert not got["refused"]
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
    receives_done = [wc for wc in wcs if wc.opcode in (WcOpcode.RECV,
                                                       WcOpcode.RECV_RDMA_WITH_IMM)]
    assert [(c["id"], c["status"], c["byte_len"]) for c in got["completions"]] == [
        (wc.wr_id, CompletionStatus(int(wc.status)), wc.byte_len) for wc in receives_done]
    ends = [wc for wc in wcs if wc.opcode in (WcOpcode.RDMA_READ, WcOpcode.FETCH_ADD,
                                              WcOpcode.COMP_SWAP)]
    assert [(d["id"], d["status"]) for d in got["read_done"]] == [
        (wc.wr_id, CompletionStatus(int(wc.status))) for wc in ends]

    def kinds(completions):
        return sorted((int(wc.opcode), wc.wr_id, int(wc.status), wc.byte_len)
                      for wc in completions)
    assert kinds(peer_wcs) == kinds(copy_wcs)
    return got


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("initiator", [True, False])
def test_traffic(n, initiator):
    """Both ends' work at once, the gateware the Initiator or the Responder."""
    simulate(n, initiator=initiator, p2p=False, seed=n + initiator, count=8 if n == 1 else 24)


@pytest.mark.parametrize("initiator", [True, False])
def test_peer_to_peer(initiator):
    """The peer-to-peer model with a Write RTR: the Initiator's RTR first, then the work."""
    simulate(8, initiator=initiator, p2p=True, seed=20 + initiator)


@pytest.mark.parametrize("bad", ["peer", "ours"])
def test_terminate(bad):
    """A Write under a wrong key: sent by the peer, the gateware's Terminate is the model's
    and reaches the peer; sent by the gateware, the peer's Terminate reaches the gateware's
    parser with its code and header copy."""
    # The sender of the bad Write is the Initiator: a Responder sends nothing first.
    simulate(8, initiator=bad == "ours", p2p=False, seed=30, count=0, bad=bad)

"""Work requests as the host's send queue engine gives them to the gateware
(:data:`~iwarp_nic.rdmap.WorkRequest`), made from the model's ``SendWR``: the tests play the
driver until one exists (issue 6). Payloads are named by host address; the RDMAP header of a
Read or Atomic Request and the 8 octets of Immediate Data are written beside the work request
(:class:`Headers`), Request Identifiers numbered from 1 as the model's engine numbers them.
"""

from iwarp_model.verbs import SGE, SendFlags, WrOpcode
from iwarp_model.wire.rdmap import AtomicRequest, ReadRequest
from iwarp_nic.rdmap import WorkRequest

__all__ = ["Headers", "Requester", "posted_receive", "send_queue_engine", "sent_ids"]


class Headers:
    """The octets the driver writes beside its work requests, by host address."""

    BASE = 0xF << 56

    def __init__(self):
        self.octets = {}

    def put(self, octets: bytes) -> int:
        addr = self.BASE + 64 * len(self.octets)
        self.octets[addr] = octets
        return addr


class Requester:
    """One send queue's work requests for the gateware. ``source_of(sge)`` is the host
    address of an SGE's first octet."""

    def __init__(self, source_of, headers: Headers):
        self.source_of, self.headers = source_of, headers
        self.request_id = 0

    def work_of(self, wr) -> list[dict]:
        """The work request(s) for ``wr`` (a Write with Immediate Data is two)."""
        op, solicited = wr.opcode, bool(wr.send_flags & SendFlags.SOLICITED)
        sge = wr.sg_list[0] if wr.sg_list else SGE(0, 0, 0)
        base = {"id": wr.wr_id & 0xFFFF, "sink_stag": 0, "sink_to": 0, "size": 0,
                "request_id": 0, "fence": int(bool(wr.send_flags & SendFlags.FENCE))}

        def message(opcode, length, stag=0, to=0, inv_stag=0):
            return {"opcode": opcode, "stag": stag, "to": to, "msn": 0, "inv_stag": inv_stag,
                    "length": length}

        def immediate():
            return dict(base, message=message(9 if solicited else 8, 8),
                        source=self.headers.put(wr.imm_data.to_bytes(8, "big")))

        if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_INV):
            inv = op == WrOpcode.SEND_WITH_INV
            opcode = {(0, 0): 3, (1, 0): 5, (0, 1): 4, (1, 1): 6}[(solicited, inv)]
            return [dict(base, message=message(opcode, sge.length,
                                               inv_stag=wr.invalidate_rkey if inv else 0),
                         source=self.source_of(sge))]
        if op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
            write = dict(base, message=message(0, sge.length, wr.rkey, wr.remote_addr),
                         source=self.source_of(sge))
            return [write, immediate()] if op == WrOpcode.RDMA_WRITE_WITH_IMM else [write]
        if op == WrOpcode.SEND_WITH_IMM:
            return [immediate()]
        if op == WrOpcode.RDMA_READ:
            header = ReadRequest(sge.lkey, sge.addr, sge.length, wr.rkey, wr.remote_addr)
            return [dict(base, message=message(1, ReadRequest.SIZE),
                         source=self.headers.put(header.encode()), sink_stag=sge.lkey,
                         sink_to=sge.addr, size=sge.length)]
        self.request_id += 1
        rid = self.request_id
        header = {
            WrOpcode.ATOMIC_FETCH_AND_ADD: lambda: AtomicRequest.fetch_add(
                rid, wr.rkey, wr.remote_addr, wr.compare_add),
            WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD: lambda: AtomicRequest.fetch_add(
                rid, wr.rkey, wr.remote_addr, wr.compare_add, wr.compare_add_mask),
            WrOpcode.ATOMIC_CMP_AND_SWP: lambda: AtomicRequest.cmp_swap(
                rid, wr.rkey, wr.remote_addr, wr.compare_add, wr.swap),
            WrOpcode.MASKED_ATOMIC_CMP_AND_SWP: lambda: AtomicRequest.cmp_swap(
                rid, wr.rkey, wr.remote_addr, wr.compare_add, wr.swap, wr.compare_add_mask,
                wr.swap_mask),
        }[op]()
        return [dict(base, message=message(10, AtomicRequest.SIZE),
                     source=self.headers.put(header.encode()), sink_stag=sge.lkey,
                     sink_to=sge.addr, size=8, request_id=rid)]


def posted_receive(wr) -> dict:
    """The receive the driver posts for the model's ``RecvWR`` ``wr`` (a
    :data:`~iwarp_nic.ddp.placement.PostedReceive`: its first SGE, and how many it has)."""
    sge = wr.sg_list[0] if wr.sg_list else SGE(0, 0, 0)
    return {"id": wr.wr_id, "sges": len(wr.sg_list), "lkey": sge.lkey, "addr": sge.addr,
            "length": sge.length}


def sent_ids(work, refused=()) -> list[int]:
    """The ids of the work requests ``work`` whose end the scheduler reports as they are done
    with host memory (``o_sent``): the Sends, Writes and Immediate Data, not the Read and
    Atomic Requests (the placer reports their ends), nor those ``refused``; sorted."""
    return sorted(w["id"] for w in work
                  if w["message"]["opcode"] not in (1, 10) and w["id"] not in refused)


async def send_queue_engine(ctx, port, deferred, work, rng, *, idle, deferrals):
    """Play the send queue engine of several connections on an issuer's ``port``
    (``i_work``) and ``deferred`` (``o_deferred``): ``work`` maps each connection to its work
    requests, offered in order, a random connection's next each cycle (idle with probability
    ``idle``). A work request given back is offered again, with the connection's later ones,
    after a random wait; each deferral, checked to be the work request taken at the edge
    before, is appended to ``deferrals`` as (conn, index). Runs for ever."""
    at = dict.fromkeys(work, 0)
    rest, last = dict.fromkeys(work, 0), None
    ctx.set(deferred.ready, 1)
    while True:
        live = [c for c in sorted(work) if at[c] < len(work[c]) and not rest[c]]
        offer = rng.choice(live) if live and rng.random() >= idle else None
        if offer is not None:
            bits = WorkRequest.const(work[offer][at[offer]]).as_bits()
            ctx.set(port.payload.as_value(), bits | offer << WorkRequest.size)
        ctx.set(port.valid, offer is not None)
        _, _, ready, back, back_conn, back_id = await ctx.tick().sample(
            port.ready, deferred.valid, deferred.payload.conn, deferred.payload.id)
        rest = {c: max(0, r - 1) for c, r in rest.items()}
        taken = (offer, at[offer]) if offer is not None and ready else None
        if taken:
            at[offer] += 1
        if back:        # the deferral of the work request taken at the last edge
            conn, index = last
            assert (back_conn, back_id) == (conn, work[conn][index]["id"])
            deferrals.append((conn, index))
            at[conn], rest[conn] = min(at[conn], index), rng.randrange(5, 60)
        last = taken

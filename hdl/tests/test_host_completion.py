# amaranth: UnusedElaboratable=no
"""CompletionWriter under the Amaranth simulator. Four queue pairs' completions of every kind
come at random times into completion queues in a Python host memory; a driver reads each
queue by its owner bits and gives back its head, but never reads one small queue, which must
overflow. Checked against the completions offered:

* every entry read is a completion offered to that queue, each once, each source's in its
  order, in the entry format of :mod:`iwarp_nic.host.formats` (a status per kind);
* the unread queue holds its first four entries, and each later completion to it is an
  overflow event;
* an event follows each entry's write, only once the write is done;
* a completion is written only after every placement issued before it is done (a model of
  the placement writes, done at random later).
"""

import random

import pytest

from iwarp_nic.host.completion import CompletionWriter
from iwarp_nic.host.formats import CQE_BYTES, Cqe, CqeFlags, CqeKind
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send

#: conn -> (send CQ, receive CQ); CQ 3 (4 entries) is never read.
QPS = {0: (0, 1), 1: (2, 2), 2: (1, 3), 3: (0, 0)}
CQ_LOG2 = {0: 3, 1: 2, 2: 3, 3: 2}
SOURCES = ("sent", "read_done", "refused", "complete")


def offered(rng, source, conn, ident):
    """A random completion of ``source`` for ``conn`` with id ``ident``, and the entry fields
    it must make."""
    if source == "sent":
        return {"conn": conn, "id": ident}, {"kind": CqeKind.SEND, "status": 0}
    if source == "read_done":
        status = rng.choice([0, 1, 4])
        return {"conn": conn, "id": ident, "status": status}, {"kind": CqeKind.SEND,
                                                               "status": status}
    if source == "refused":
        flushed = rng.getrandbits(1)
        return {"conn": conn, "id": ident, "flushed": flushed}, {
            "kind": CqeKind.SEND, "status": 5 if flushed else 2}
    imm, inv, se = rng.getrandbits(1), rng.getrandbits(1), rng.getrandbits(1)
    fields = {"conn": conn, "id": ident, "status": rng.choice([0, 1, 4]),
              "byte_len": rng.getrandbits(32), "with_imm": imm, "imm_data": rng.getrandbits(64),
              "with_inv": inv, "invalidated": rng.getrandbits(32), "solicited": se}
    return fields, {"kind": CqeKind.RECV, "status": fields["status"],
                    "byte_len": fields["byte_len"], "imm_data": fields["imm_data"],
                    "invalidated": fields["invalidated"],
                    "flags": imm * CqeFlags.WITH_IMM | inv * CqeFlags.WITH_INV
                    | se * CqeFlags.SOLICITED}


def entry(conn, ident, fields):
    """The entry a completion makes (owner left out)."""
    return {"wqe": ident, "qp": conn, "kind": 0, "status": 0, "flags": 0, "byte_len": 0,
            "invalidated": 0, "imm_data": 0, **fields}


def decode(octets):
    value = int.from_bytes(octets, "little")
    out = {}
    for name, field in Cqe:
        if not name.startswith("_"):
            out[name] = value >> field.offset & ((1 << field.width) - 1)
    return out


@pytest.mark.parametrize("n", [8, 64])
def test_queues(n):
    rng = random.Random(n)
    dut = CompletionWriter(n, conns=4, cqs=4)
    bases = {cq: 0x10000 * (cq + 1) for cq in CQ_LOG2}
    memory = {}                             # address -> 32 octets
    state = {"cycle": 0, "issued": 0, "done": 0}
    got = {"entries": {cq: [] for cq in CQ_LOG2}, "events": [], "writes": []}
    wanted = {source: [] for source in SOURCES}     # (cq, entry, issued when offered)
    issued_at = {}          # id -> placements issued when its completion was offered

    def feeder(source, port):
        async def bench(ctx):
            bus, r = AmaranthBus(ctx), random.Random(f"{n}{source}")
            while not state.get("configured"):
                await ctx.tick()
            for k in range(40):
                conn = r.choice(list(QPS))
                ident = SOURCES.index(source) << 8 | k     # unique: names it when written
                fields, made = offered(r, source, conn, ident)
                issued_at[ident] = state["issued"]
                cq = QPS[conn][1 if source == "complete" else 0]
                wanted[source].append((cq, entry(conn, fields["id"], made), state["issued"]))
                await send(bus, StreamPort.amaranth(port), [fields], rng=r, idle=0.6,
                           timeout=1 << 20)
            state[source] = True
        return bench

    async def setup(ctx):
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_cq),
                   [{"conn": cq, "base": bases[cq], "log2_entries": k}
                    for cq, k in CQ_LOG2.items()])
        await send(bus, StreamPort.amaranth(dut.i_qp),
                   [{"conn": c, "send_cq": s, "recv_cq": r} for c, (s, r) in QPS.items()])
        state["configured"] = True
        while not all(state.get(s) for s in SOURCES):
            await ctx.tick()
        for _ in range(3000):
            await ctx.tick()

    async def placements(ctx):
        """Placement writes issued at random, each done a random time later, in order."""
        due = []
        while True:
            issue = rng.random() < 0.2
            finish = bool(due) and due[0] <= state["cycle"]
            ctx.set(dut.place_issued, issue)
            ctx.set(dut.place_done, finish)
            await ctx.tick()
            state["cycle"] += 1
            if issue:
                state["issued"] += 1
                due.append(state["cycle"] + rng.randrange(5, 80))
            if finish:
                due.pop(0)
                state["done"] += 1

    async def dma(ctx):
        """The entries' writes into host memory, each done after a random wait."""
        bus = AmaranthBus(ctx)
        while True:
            (write,) = await recv(bus, StreamPort.amaranth(dut.o_write), 1, rng=rng, stall=0.3,
                                  timeout=1 << 30)
            done = state["done"]
            (data,) = await recv_packets(bus, StreamPort.amaranth(dut.o_data), 1, n, rng=rng,
                                         stall=0.3)
            # The fence: written only once the placements issued before it are done.
            ident = decode(bytes(data))["wqe"]
            assert done >= issued_at[ident], (ident, done, issued_at[ident])
            got["writes"].append(ident)
            assert write["length"] == CQE_BYTES == len(data)
            memory[write["addr"]] = bytes(data)
            for _ in range(rng.randrange(6)):
                await ctx.tick()
            got["done_writes"] = got.get("done_writes", 0) + 1
            await send(bus, StreamPort.amaranth(dut.i_written), [{"error": 0}])

    async def driver(ctx):
        """Reads CQs 0 to 2 by their owner bits, giving back its head now and then."""
        bus, heads = AmaranthBus(ctx), dict.fromkeys(CQ_LOG2, 0)
        while True:
            for cq in (0, 1, 2):
                size = 1 << CQ_LOG2[cq]
                addr = bases[cq] + (heads[cq] % size) * CQE_BYTES
                owner = (heads[cq] // size + 1) % 2
                if addr in memory and decode(memory[addr])["owner"] == owner:
                    got["entries"][cq].append(decode(memory[addr]))
                    heads[cq] += 1
                    if rng.random() < 0.5:
                        await send(bus, StreamPort.amaranth(dut.i_head),
                                   [{"conn": cq, "tail": heads[cq] & 0xFFFF}])
                    continue
                if rng.random() < 0.05:
                    await send(bus, StreamPort.amaranth(dut.i_head),
                               [{"conn": cq, "tail": heads[cq] & 0xFFFF}])
            await ctx.tick()

    async def events(ctx):
        bus = AmaranthBus(ctx)
        while True:
            (event,) = await recv(bus, StreamPort.amaranth(dut.o_event), 1, rng=rng,
                                  stall=0.3, timeout=1 << 30)
            got["events"].append((event, got.get("done_writes", 0)))

    run(dut, setup, monitors=[*(feeder(s, getattr(dut, f"i_{s}")) for s in SOURCES),
                              placements, dma, driver, events], name=f"completion_w{n}")

    # CQ 3, never read: its first four entries, in order, the rest overflows.
    to_unread = [e for source in SOURCES for cq, e, _ in wanted[source] if cq == 3]
    written3 = [decode(memory[a]) for a in sorted(memory) if bases[3] <= a < bases[3] + 0x10000]
    assert [dict(e, owner=1) for e in to_unread[:4]] == written3
    overflows = [e for e, _ in got["events"] if e["overflow"]]
    assert len(overflows) == len(to_unread) - 4 > 0 and {e["cq"] for e in overflows} == {3}
    # Every other queue: each completion once, each source's in its order.
    for cq in (0, 1, 2):
        read = got["entries"][cq]
        size = 1 << CQ_LOG2[cq]
        assert [e.pop("owner") for e in read] == [(k // size + 1) % 2 for k in range(len(read))]
        for source in SOURCES:
            mine = [e for c, e, _ in wanted[source] if c == cq]
            assert [e for e in read if e in mine] == mine, (cq, source)
        assert len(read) == sum(c == cq for s in SOURCES for c, _, _ in wanted[s])
    # An event per entry written, each after its write was done.
    written = [(e, done) for e, done in got["events"] if not e["overflow"]]
    assert len(written) == len(got["writes"]) and all(
        done >= k + 1 for k, (_, done) in enumerate(written))
    assert max(issued_at.values()) > 20

# amaranth: UnusedElaboratable=no
"""SendQueueEngine under the Amaranth simulator, against a driver that posts entries into
rings in a Python host memory (small rings that wrap many times), a DMA engine that answers
its reads in order after random waits, and an issuer that defers work requests at random as
``RequestIssuer`` does (once one of a connection's is deferred, every later one of that
connection is too, until it is offered again). Each connection's work requests must be taken
exactly once, in posted order, each the work request its entry describes; a failed read stops
that connection alone."""

import random

import pytest

from iwarp_nic.host.formats import SQ_INLINE_OFFSET, SQ_WQE_BYTES, SqWqe
from iwarp_nic.host.send_queue import SendQueueEngine
from iwarp_nic.rdmap import WorkRequest
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send, send_packets

#: The WorkRequest field each SqWqe field becomes (``flags`` bit 0: ``fence``).
FIELDS = {"opcode": ("message", "opcode"), "stag": ("message", "stag"),
          "to": ("message", "to"), "inv_stag": ("message", "inv_stag"),
          "length": ("message", "length"), "source": ("source",),
          "sink_stag": ("sink_stag",), "sink_to": ("sink_to",), "size": ("size",),
          "request_id": ("request_id",)}


def random_entry(rng):
    entry = {name: rng.getrandbits(field.width) for name, field in SqWqe
             if not name.startswith("_")}
    entry["opcode"] = rng.choice([0, 1, 3, 4, 5, 6, 8, 9, 10])
    return entry


def work_of(entry, index):
    """The work request an entry describes (read independently of the engine's mapping:
    field by field from :data:`FIELDS`)."""
    work = {"id": index, "fence": entry["flags"] & 1, "rtr": 0,
            "message": {"msn": 0}}
    for name, path in FIELDS.items():
        target = work
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = entry[name]
    return WorkRequest.const(work).as_bits()


def simulate(n, rings, count, *, seed, fail=None):
    """``rings``: conn -> log2 of its entries; ``count`` entries posted on each. ``fail``:
    (conn, index) whose read returns ``err``. Returns what the issuer took, per connection,
    the deferrals, and the connections reported on ``o_fetch_error``."""
    rng = random.Random(seed)
    dut = SendQueueEngine(n, conns=4, ahead=4, retry_cycles=64)
    memory, holds, bases = {}, {}, {}     # holds: the (conn, index) each slot has now
    for k, conn in enumerate(rings):
        bases[conn] = 0x10_0000 * (k + 1) + SQ_WQE_BYTES * rng.randrange(64)
    entries = {conn: [random_entry(rng) for _ in range(count)] for conn in rings}
    taken = {conn: [] for conn in rings}
    got = {"deferred": 0, "errors": [], "reads": []}
    state = {"cycle": 0}

    def slot(conn, index):
        return bases[conn] + (index % (1 << rings[conn])) * SQ_WQE_BYTES

    async def driver(ctx):
        """Posts each connection's entries while its ring has room (an entry is free once
        its work request was taken), with doorbells after one or several."""
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_ring),
                   [{"conn": c, "base": bases[c], "log2_entries": log2}
                    for c, log2 in rings.items()])
        posted = dict.fromkeys(rings, 0)
        for _ in range(200_000):
            room = [c for c in rings if posted[c] < count
                    and posted[c] - len(taken[c]) < 1 << rings[c]]
            if not room:
                if all(posted[c] == count for c in rings):
                    return
                await ctx.tick()
                continue
            conn = rng.choice(room)
            for _ in range(rng.randint(1, 3)):
                if posted[conn] == count or posted[conn] - len(taken[conn]) == 1 << rings[conn]:
                    break
                value = SqWqe.const(entries[conn][posted[conn]]).as_bits()
                memory[slot(conn, posted[conn])] = value.to_bytes(SQ_INLINE_OFFSET, "little")
                holds[slot(conn, posted[conn])] = (conn, posted[conn])
                posted[conn] += 1
            await send(bus, StreamPort.amaranth(dut.i_doorbell),
                       [{"conn": conn, "tail": posted[conn] & 0xFFFF}], rng=rng, idle=0.5)
        raise AssertionError("the driver never posted everything")

    async def commands(ctx):
        """The DMA engine's read commands, each due a random latency after it is taken."""
        bus = AmaranthBus(ctx)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=rng, stall=0.2,
                                 timeout=1 << 30)
            assert read["length"] == SQ_INLINE_OFFSET and read["addr"] in memory, read
            got["reads"].append((read["addr"], state["cycle"] + rng.randrange(2, 14)))

    async def answers(ctx):
        """Each read answered in order, once due: the 64 octets at its address."""
        bus, done = AmaranthBus(ctx), 0
        while True:
            if done == len(got["reads"]) or got["reads"][done][1] > state["cycle"]:
                await ctx.tick()
                continue
            addr = got["reads"][done][0]
            done += 1
            await send_packets(bus, StreamPort.amaranth(dut.i_fetched),
                               [Packet(memory[addr], err=holds[addr] == fail)], n, rng=rng,
                               idle=0.1)

    async def clock(ctx):
        while True:
            await ctx.tick()
            state["cycle"] += 1

    async def issuer(ctx):
        """Takes work requests at random, and defers some (RequestIssuer's rules)."""
        work, back = dut.o_work, dut.i_deferred
        waiting, answer = {}, None
        while True:
            ready = rng.random() < 0.7
            ctx.set(work.ready, ready)
            if answer is not None:
                ctx.set(back.payload.conn, answer[0])
                ctx.set(back.payload.id, answer[1])
            ctx.set(back.valid, answer is not None)
            if rng.random() < 0.02:
                ctx.set(dut.i_wake.payload.conn, rng.choice(list(rings)))
                ctx.set(dut.i_wake.valid, 1)
            else:
                ctx.set(dut.i_wake.valid, 0)
            _, _, valid, bits = await ctx.tick().sample(work.valid, work.payload.as_value())
            answer = None
            if not (valid and ready):
                continue
            conn, fields = bits >> WorkRequest.size, bits & ((1 << WorkRequest.size) - 1)
            index = fields >> WorkRequest["id"].offset & 0xFFFF
            defer = conn in waiting and waiting[conn] != index or rng.random() < 0.15
            if defer:
                waiting.setdefault(conn, index)
                answer = (conn, index)
                got["deferred"] += 1
                continue
            waiting.pop(conn, None)
            assert index == len(taken[conn]) & 0xFFFF, (conn, index, len(taken[conn]))
            assert fields == work_of(entries[conn][len(taken[conn])], index), conn
            taken[conn].append(index)

    async def errors(ctx):
        bus = AmaranthBus(ctx)
        while True:
            got["errors"] += await recv(bus, StreamPort.amaranth(dut.o_fetch_error), 1,
                                        timeout=1 << 30)

    async def control(ctx):
        for _ in range(400_000):
            await ctx.tick()
            if all(len(taken[c]) == count for c in rings if fail is None or c != fail[0]) \
                    and (fail is None or got["errors"]):
                break
        for _ in range(500):
            await ctx.tick()

    run(dut, control, monitors=[driver, commands, answers, clock, issuer, errors],
        name=f"send_queue_w{n}")
    return taken, got


@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("rings", [{0: 2, 2: 3, 3: 1}, {1: 4}], ids=["three", "one"])
def test_posted_order(n, rings):
    """Three connections' queues, or one's: with one, its entries reach the issuer back to
    back, and the issuer's deferral of an entry comes while the entry after it is taken."""
    taken, got = simulate(n, rings, 60, seed=n)
    assert all(taken[c] == list(range(60)) for c in rings), taken
    assert got["deferred"] >= 5 and not got["errors"]


def test_fetch_error_stops_one_connection():
    rings = {0: 2, 1: 2}
    taken, got = simulate(8, rings, 20, seed=3, fail=(1, 7))
    assert taken[0] == list(range(20))
    assert taken[1] == list(range(7))
    assert got["errors"] == [{"conn": 1}]

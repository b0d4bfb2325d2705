# amaranth: UnusedElaboratable=no
"""ReceiveQueueEngine under the Amaranth simulator: a driver posts receive entries into small
rings (they wrap) in a Python host memory between the placer's questions, a DMA engine answers
the reads in order after random waits, and each answer must be the connection's next entry
posted (or none posted), as a Python queue of the same entries says. Some connections have a
receive queue of their own, some share one of two shared receive queues (whose entries go to
whichever of its connections asks first), one has none; a read that fails answers with none
posted and is reported for the connection that asked, and the next entry is read as usual."""

import random

import pytest

from iwarp_nic.host.formats import RQ_WQE_BYTES, RqWqe
from iwarp_nic.host.receive_queue import ReceiveQueueEngine
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send, send_packets

CONNS, SRQS = 7, 2
#: Each queue's log2 of entries, by its number (queue pair k's own is k, SRQ s is CONNS + s).
RINGS = {0: 2, 1: 3, 3: 2, CONNS: 2, CONNS + 1: 3}
#: The queue each connection takes its receives from (connection 2: none opened).
QUEUE_OF = {0: 0, 1: 1, 2: 2, 3: 3, 4: CONNS, 5: CONNS, 6: CONNS + 1}
FAILING = {(1, 5), (CONNS, 3)}          # (queue, index) whose read fails


@pytest.mark.parametrize("n", [8, 64])
def test_answers(n):
    rng = random.Random(n)
    dut = ReceiveQueueEngine(n, conns=CONNS, srqs=SRQS)
    bases = {q: 0x4000 * (q + 1) + RQ_WQE_BYTES * rng.randrange(16) for q in RINGS}
    memory, holds = {}, {}
    got = {"answers": [], "wanted": [], "errors": [], "wanted_errors": [], "reads": 0}

    async def driver(ctx):
        """Makes the queues and queue pairs, then posts entries (while the ring has room)
        and asks, in random order."""
        bus = AmaranthBus(ctx)
        pairs = [{"conn": c, "base": bases.get(q, 0), "log2_entries": RINGS.get(q, 0),
                  "srq": q - CONNS + 1 if q >= CONNS else 0} for c, q in QUEUE_OF.items()
                 if q in RINGS]
        shared = [{"conn": q - CONNS, "base": bases[q], "log2_entries": RINGS[q]}
                  for q in RINGS if q >= CONNS]
        await send(bus, StreamPort.amaranth(dut.i_srq_ring), shared)
        await send(bus, StreamPort.amaranth(dut.i_ring), pairs)
        posted, used = dict.fromkeys(RINGS, 0), dict.fromkeys(RINGS, 0)
        queues = {q: [] for q in RINGS}
        for _ in range(400):
            if rng.random() < 0.4:
                q = rng.choice(list(RINGS))
                for _ in range(rng.randint(1, 3)):
                    if posted[q] - used[q] == 1 << RINGS[q]:
                        break
                    entry = {"addr": rng.getrandbits(64), "lkey": rng.getrandbits(32),
                             "length": rng.getrandbits(32), "sges": rng.choice([0, 1, 1, 3])}
                    addr = bases[q] + (posted[q] % (1 << RINGS[q])) * RQ_WQE_BYTES
                    memory[addr] = RqWqe.const(entry).as_bits().to_bytes(RQ_WQE_BYTES, "little")
                    holds[addr] = (q, posted[q])
                    queues[q].append((posted[q], entry))
                    posted[q] += 1
                await send(bus, StreamPort.amaranth(dut.i_doorbell),
                           [{"conn": q, "tail": posted[q]}])
                continue
            conn = rng.randrange(CONNS)
            q = QUEUE_OF[conn]
            await send(bus, StreamPort.amaranth(dut.i_ask), [{"conn": conn}], rng=rng, idle=0.3)
            if q not in RINGS or not queues[q]:
                got["wanted"].append({"posted": 0})
            else:
                index, entry = queues[q].pop(0)
                used[q] += 1
                if (q, index) in FAILING:
                    got["wanted"].append({"posted": 0})
                    got["wanted_errors"].append({"conn": conn})
                else:
                    got["wanted"].append({"posted": 1, "id": index, "sges": int(entry["sges"] > 0),
                                          "lkey": entry["lkey"], "addr": entry["addr"],
                                          "length": entry["length"]})
            (answer,) = await recv(bus, StreamPort.amaranth(dut.o_receive), 1, rng=rng,
                                   stall=0.3, timeout=1000)
            got["answers"].append(answer if answer["posted"] else {"posted": 0})
        got["used"] = used

    async def dma(ctx):
        bus = AmaranthBus(ctx)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=rng, stall=0.3,
                                 timeout=1 << 30)
            assert read["length"] == RQ_WQE_BYTES and read["addr"] in memory, read
            got["reads"] += 1
            for _ in range(rng.randrange(10)):
                await ctx.tick()
            await send_packets(bus, StreamPort.amaranth(dut.i_fetched),
                               [Packet(memory[read["addr"]],
                                       err=holds[read["addr"]] in FAILING)], n, rng=rng,
                               idle=0.2)

    async def errors(ctx):
        bus = AmaranthBus(ctx)
        while True:
            got["errors"] += await recv(bus, StreamPort.amaranth(dut.o_fetch_error), 1,
                                        timeout=1 << 30)

    run(dut, driver, monitors=[dma, errors], name=f"receive_queue_w{n}")
    assert got["answers"] == got["wanted"]
    assert got["errors"] == got["wanted_errors"] and len(got["errors"]) == 2
    assert sum(a["posted"] for a in got["answers"]) > 50 and got["reads"] > 50
    assert all(used > 8 for used in got["used"].values()), got["used"]

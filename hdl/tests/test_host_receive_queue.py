# amaranth: UnusedElaboratable=no
"""ReceiveQueueEngine under the Amaranth simulator: a driver posts receive entries into small
rings (they wrap) in a Python host memory between the placer's questions, a DMA engine answers
the reads in order after random waits, and each answer must be the connection's next entry
posted (or none posted), as a Python queue of the same entries says; a read that fails answers
with none posted and is reported, and the next entry is read as usual."""

import random

import pytest

from iwarp_nic.host.formats import RQ_WQE_BYTES, RqWqe
from iwarp_nic.host.receive_queue import ReceiveQueueEngine
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send, send_packets

RINGS = {0: 2, 1: 3, 3: 2}      # conn -> log2 of its entries


@pytest.mark.parametrize("n", [8, 64])
def test_answers(n):
    rng = random.Random(n)
    dut = ReceiveQueueEngine(n, conns=4)
    bases = {c: 0x4000 * (c + 1) + RQ_WQE_BYTES * rng.randrange(16) for c in RINGS}
    memory, holds = {}, {}
    failing = {(1, 5)}          # (conn, index) whose read fails
    got = {"answers": [], "wanted": [], "errors": [], "reads": 0}

    async def driver(ctx):
        """Posts entries (while the ring has room) and asks, in random order."""
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_ring),
                   [{"conn": c, "base": bases[c], "log2_entries": k} for c, k in RINGS.items()])
        posted, used = dict.fromkeys(RINGS, 0), dict.fromkeys(RINGS, 0)
        queues = {c: [] for c in RINGS}
        for _ in range(300):
            conn = rng.choice([*RINGS, 2])
            if conn in RINGS and rng.random() < 0.5:
                for _ in range(rng.randint(1, 3)):
                    if posted[conn] - used[conn] == 1 << RINGS[conn]:
                        break
                    entry = {"addr": rng.getrandbits(64), "lkey": rng.getrandbits(32),
                             "length": rng.getrandbits(32), "sges": rng.choice([0, 1, 1, 3])}
                    addr = bases[conn] + (posted[conn] % (1 << RINGS[conn])) * RQ_WQE_BYTES
                    memory[addr] = RqWqe.const(entry).as_bits().to_bytes(RQ_WQE_BYTES, "little")
                    holds[addr] = (conn, posted[conn])
                    queues[conn].append((posted[conn], entry))
                    posted[conn] += 1
                await send(bus, StreamPort.amaranth(dut.i_doorbell),
                           [{"conn": conn, "tail": posted[conn]}])
                continue
            await send(bus, StreamPort.amaranth(dut.i_ask), [{"conn": conn}], rng=rng, idle=0.3)
            if conn not in RINGS or not queues[conn]:
                got["wanted"].append({"posted": 0})
            else:
                index, entry = queues[conn].pop(0)
                used[conn] += 1
                if (conn, index) in failing:
                    got["wanted"].append({"posted": 0})
                else:
                    got["wanted"].append({"posted": 1, "id": index, "sges": int(entry["sges"] > 0),
                                          "lkey": entry["lkey"], "addr": entry["addr"],
                                          "length": entry["length"]})
            (answer,) = await recv(bus, StreamPort.amaranth(dut.o_receive), 1, rng=rng,
                                   stall=0.3, timeout=1000)
            got["answers"].append(answer if answer["posted"] else {"posted": 0})

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
                                       err=holds[read["addr"]] in failing)], n, rng=rng,
                               idle=0.2)

    async def errors(ctx):
        bus = AmaranthBus(ctx)
        while True:
            got["errors"] += await recv(bus, StreamPort.amaranth(dut.o_fetch_error), 1,
                                        timeout=1 << 30)

    run(dut, driver, monitors=[dma, errors], name=f"receive_queue_w{n}")
    assert got["answers"] == got["wanted"]
    assert got["errors"] == [{"conn": 1}]
    assert sum(a["posted"] for a in got["answers"]) > 50 and got["reads"] > 50

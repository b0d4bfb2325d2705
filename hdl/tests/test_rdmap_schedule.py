# amaranth: UnusedElaboratable=no
"""SendScheduler: messages from the send queue and Read Responses taken in turns, each input's
order kept, and every payload fetch turned into the host read of its message's source plus
the offset; ``response_sent`` once per Read Response, after its last fetch."""

import random

import pytest
from amaranth.back import verilog

from iwarp_nic.rdmap.read import ReadResponse
from iwarp_nic.rdmap.schedule import SendScheduler
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

STEP = 700                  # the payload per segment the test's sender fetches


def work(rng, count, opcode):
    return [{"message": {"opcode": opcode, "stag": rng.getrandbits(32), "to": rng.getrandbits(64),
                         "msn": 0, "inv_stag": 0,
                         "length": rng.choice([0, 1, 600, 700, 701, rng.randrange(3000)])},
             "source": rng.getrandbits(64)} for _ in range(count)]


def simulate(sends, responses, *, seed, idle, stall):
    dut = SendScheduler()
    got = {"reads": [], "sent": 0}
    state = {"done": False}

    def feeder(port, items, offset):
        # The whole payload as one number (the driver sets plain values).
        flat = [{"bits": ReadResponse.const(w).as_bits()} for w in items]
        whole = StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})

        async def bench(ctx):
            await send(AmaranthBus(ctx), whole, flat, rng=random.Random(seed + offset),
                       idle=idle)
        return bench

    async def sender(ctx):
        """The StreamSender's part: take each message, fetch its payload in STEP pieces."""
        bus, rng = AmaranthBus(ctx), random.Random(seed + 3)
        got["messages"] = []
        for _ in range(len(sends) + len(responses)):
            (msg,) = await recv(bus, StreamPort.amaranth(dut.o_message), 1, rng=rng,
                                stall=stall)
            got["messages"].append(msg)
            fetches = [{"offset": o, "length": min(STEP, msg["length"] - o)}
                       for o in range(0, msg["length"], STEP)]
            await send(bus, StreamPort.amaranth(dut.i_fetch), fetches, rng=rng, idle=idle)
        state["done"] = True

    async def reads(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 4)
        while not state["done"]:
            ready = rng.random() >= stall
            bus.set(dut.o_read.ready, ready)
            valid, addr, length, sent = await bus.edge(
                dut.o_read.valid, dut.o_read.payload.addr, dut.o_read.payload.length,
                dut.response_sent)
            if valid and ready:
                got["reads"].append((addr, length))
            got["sent"] += sent

    run(dut, feeder(dut.i_send, sends, 1), feeder(dut.i_response, responses, 2), sender,
        reads, name="rdmap_schedule")
    return got


def expected_reads(order):
    return [((w["source"] + o) % (1 << 64), min(STEP, w["message"]["length"] - o))
            for w in order for o in range(0, w["message"]["length"], STEP)]


def test_turns_at_full_rate():
    """Both inputs always offering: they alternate, the responses first, then the rest."""
    rng = random.Random(1)
    sends, responses = work(rng, 6, 3), work(rng, 9, 2)
    got = simulate(sends, responses, seed=1, idle=0, stall=0)
    order = [r for pair in zip(responses, sends) for r in pair] + responses[6:]
    assert got["messages"] == [w["message"] for w in order]
    assert got["reads"] == expected_reads(order)
    assert got["sent"] == len(responses)


@pytest.mark.parametrize("seed", [2, 3])
def test_random_timing(seed):
    """Random idles and stalls: each input's order kept, no message lost, reads right."""
    rng = random.Random(seed)
    sends, responses = work(rng, 12, 0), work(rng, 12, 2)
    got = simulate(sends, responses, seed=seed, idle=0.3, stall=0.3)
    by_message = {id(w): w for w in sends + responses}
    order = []
    pending = {0: list(sends), 2: list(responses)}
    for msg in got["messages"]:
        w = pending[msg["opcode"]].pop(0)
        assert msg == w["message"]
        order.append(w)
    assert not pending[0] and not pending[2] and len(by_message) == 24
    assert got["reads"] == expected_reads(order)
    assert got["sent"] == len(responses)


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "schedule.v"
    path.write_text(verilog.convert(SendScheduler(), name="schedule"))
    assert lint(path) == ""

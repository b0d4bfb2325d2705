# amaranth: UnusedElaboratable=no
"""SendScheduler at 1, 8 and 64 bytes: messages from the send queue and responses taken in
turns, each input's order kept; every payload fetch answered in order, by the host read of its
message's source plus the offset (the host's data passed on) or, for an inline message (an
Atomic Response), by its own octets from the offset; ``response_sent`` once per response,
after its last fetch (``response_inline`` with it for an inline one), never lost when a
response without payload ends in the same cycle as another."""

import random

import pytest
from amaranth.back import verilog

from iwarp_nic.rdmap.respond import INLINE_BYTES, OutboundMessage
from iwarp_nic.rdmap.schedule import SendScheduler
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, collector, recv, send, send_packets

STEP, INLINE_STEP = 700, 5      # the payload per fetch the test's sender asks for


def work(rng, count, opcode, *, inline=0.0):
    out = []
    for _ in range(count):
        if rng.random() < inline:
            out.append({"message": {"opcode": 11, "stag": 0, "to": 0, "msn": rng.getrandbits(32),
                                    "inv_stag": 0, "length": INLINE_BYTES},
                        "source": 0, "inline": 1, "data": rng.getrandbits(8 * INLINE_BYTES)})
            continue
        out.append({"message": {"opcode": opcode, "stag": rng.getrandbits(32),
                                "to": rng.getrandbits(64), "msn": 0, "inv_stag": 0,
                                "length": rng.choice([0, 0, 1, 600, 700, 701,
                                                      rng.randrange(3000)])},
                    "source": rng.getrandbits(64), "inline": 0, "data": 0,
                    "id": rng.getrandbits(16), "report": int(rng.random() < 0.8)})
    return out


def fetches(w):
    """The sender's fetches of ``w``'s message: (offset, length)."""
    step = INLINE_STEP if w["inline"] else STEP
    length = w["message"]["length"]
    return [(o, min(step, length - o)) for o in range(0, length, step)]


def host_data(addr, length):
    return random.Random(addr * 7 + length).randbytes(length)


def simulate(n, sends, responses, *, seed, idle, stall):
    dut = SendScheduler(n)
    got = {"reads": [], "sent": [], "messages": [], "reported": [], "payload": []}
    state = {"done": False}
    pending = []                # host reads taken, their data still to give

    def feeder(port, items, offset):
        # The whole payload as one number (the driver sets plain values).
        flat = [{"bits": OutboundMessage.const(w).as_bits()} for w in items]
        whole = StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})

        async def bench(ctx):
            await send(AmaranthBus(ctx), whole, flat, rng=random.Random(seed + offset),
                       idle=idle)
        return bench

    async def sender(ctx):
        """The StreamSender's planning: take each message (it plans ahead of its fetches)."""
        bus, rng = AmaranthBus(ctx), random.Random(seed + 3)
        for _ in range(len(sends) + len(responses)):
            (msg,) = await recv(bus, StreamPort.amaranth(dut.o_message), 1, rng=rng,
                                stall=stall)
            got["messages"].append(msg)

    async def fetcher(ctx):
        """The StreamSender's fetches: each message's payload in pieces, then wait for every
        packet."""
        bus, rng = AmaranthBus(ctx), random.Random(seed + 7)
        asked = 0
        for k in range(len(sends) + len(responses)):
            while len(got["messages"]) <= k:
                await ctx.tick()
            msg = got["messages"][k]
            step = INLINE_STEP if msg["opcode"] == 11 else STEP
            asks = [{"offset": o, "length": min(step, msg["length"] - o)}
                    for o in range(0, msg["length"], step)]
            await send(bus, StreamPort.amaranth(dut.i_fetch), asks, rng=rng, idle=idle)
            asked += len(asks)
        for _ in range(100_000):            # until every packet has come (or a timeout)
            if len(got["payload"]) >= asked:
                break
            await ctx.tick()
        for _ in range(50):
            await ctx.tick()
        state["done"] = True

    async def reads(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 4)
        while True:
            ready = rng.random() >= stall
            bus.set(dut.o_read.ready, ready)
            valid, addr, length, sent, inline = await bus.edge(
                dut.o_read.valid, dut.o_read.payload.addr, dut.o_read.payload.length,
                dut.response_sent, dut.response_inline)
            if valid and ready:
                got["reads"].append((addr, length))
                pending.append(host_data(addr, length))
            if sent:
                got["sent"].append(inline)

    async def host(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 5)
        while True:
            while not pending:
                await ctx.tick()
            await send_packets(bus, StreamPort.amaranth(dut.i_host), [pending.pop(0)], n,
                               rng=rng, idle=idle)

    async def reported(ctx):
        """Each work request reported done with host memory, and how many payload packets
        had passed by then."""
        bus, rng = AmaranthBus(ctx), random.Random(seed + 8)
        while True:
            (sent,) = await recv(bus, StreamPort.amaranth(dut.o_sent), 1, rng=rng, stall=stall,
                                 timeout=1 << 30)
            got["reported"].append((sent["id"], len(got["payload"])))

    run(dut, feeder(dut.i_send, sends, 1), feeder(dut.i_response, responses, 2), sender,
        fetcher, monitors=[reads, host, reported,
                           collector(got, "payload", dut.o_payload, data_bytes=n,
                                     rng=random.Random(seed + 6), stall=stall)],
        name=f"rdmap_schedule_w{n}")
    assert state["done"]
    return got


def check(got, order, responses):
    """The messages in ``order``, the reads and payloads of their fetches, one end per
    response."""
    assert got["messages"] == [w["message"] for w in order]
    reads, payloads = [], []
    for w in order:
        data = w["data"].to_bytes(INLINE_BYTES, "little")
        for offset, length in fetches(w):
            if w["inline"]:
                payloads.append(data[offset:offset + length])
            else:
                addr = (w["source"] + offset) % (1 << 64)
                reads.append((addr, length))
                payloads.append(host_data(addr, length))
    assert got["reads"] == reads
    assert [bytes(p) for p in got["payload"]] == payloads
    # One end per response, of its kind (an empty one's may come a little later).
    assert sorted(got["sent"]) == sorted(w["inline"] for w in order if w in responses)
    # One report per send with ``report``; for one with a payload, after its last packet.
    assert sorted(i for i, _ in got["reported"]) == sorted(
        w["id"] for w in order if w not in responses and w["report"])
    packets, passed = 0, {}
    for w in order:
        packets += len(fetches(w))
        if w not in responses and w["report"]:
            passed.setdefault(w["id"], []).append(packets if fetches(w) else 0)
    for ident, seen in got["reported"]:
        assert seen >= min(passed[ident]), (ident, seen, passed[ident])
        passed[ident].remove(min(passed[ident]))


def interleaved(got, sends, responses):
    """The work in the order the messages came out, each input's order kept (a response is
    a Read Response, opcode 2, or an Atomic Response, 11)."""
    queues = {False: list(sends), True: list(responses)}
    order = [queues[msg["opcode"] in (2, 11)].pop(0) for msg in got["messages"]]
    assert not queues[False] and not queues[True]
    return order


@pytest.mark.parametrize("n", [1, 8, 64])
def test_turns_at_full_rate(n):
    """Both inputs always offering: they alternate, the responses first, then the rest."""
    rng = random.Random(1)
    sends, responses = work(rng, 6, 3), work(rng, 9, 2, inline=0.4)
    got = simulate(n, sends, responses, seed=1, idle=0, stall=0)
    order = [r for pair in zip(responses, sends) for r in pair] + responses[6:]
    check(got, order, responses)


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("seed", [2, 3])
def test_random_timing(n, seed):
    """Random idles and stalls: each input's order kept, no message lost, payloads right."""
    rng = random.Random(seed)
    sends, responses = work(rng, 12, 0), work(rng, 16, 2, inline=0.4)
    got = simulate(n, sends, responses, seed=seed, idle=0.3, stall=0.3)
    check(got, interleaved(got, sends, responses), responses)


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "schedule.v"
    path.write_text(verilog.convert(SendScheduler(8), name="schedule"))
    assert lint(path) == ""


@pytest.mark.parametrize("seed", [4, 5])
def test_ends_together(seed):
    """Short inline responses between empty ones, both inputs busy: ends that come in the same
    cycle are each reported."""
    rng = random.Random(seed)
    responses = work(rng, 40, 2, inline=0.5)
    for w in responses:
        if not w["inline"]:
            w["message"]["length"] = 0
    sends = work(rng, 10, 3)
    got = simulate(8, sends, responses, seed=seed, idle=0.1 * (seed - 4), stall=0.0)
    check(got, interleaved(got, sends, responses), responses)

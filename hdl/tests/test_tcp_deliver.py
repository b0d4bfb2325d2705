# amaranth: UnusedElaboratable=no
"""RxDeliver against a Python reference of the verdicts, widths 1, 8 and 64.

The reference (:func:`reference`) applies a consistent verdict sequence to the receive buffer's
packets: each packet of ``i`` is delivered (``{conn, length}`` on ``o_header``, the packet minus
its first ``trim`` bytes on ``o``), dropped, or parked (moved whole to ``o_park``); each parked
packet later gets a ``parked`` verdict, in park order, that delivers it (random ``trim`` below its
length) or drops it. The testbench loops ``o_park`` back into ``i_parked`` through a Python FIFO
of whole packets, as the engine's park buffer does.

Checked: the headers and the delivered packets, in order, equal the reference's; ``o_park``'s
packets equal the parked ones byte for byte with ``err`` 0; every beat follows the stream rules;
nothing more comes out once every input has been taken. Random scenarios run with random idle
cycles on ``i``, ``i_parked`` and ``i_verdict`` and random stalls on ``o``, ``o_header`` and
``o_park``; directed ones cover 1-byte packets, packets of whole beats, trims that leave one
byte, and a verdict offered well before its packet's first beat or well after it (from either
buffer), both at full rate and under back-pressure.
"""

import random

import pytest

from iwarp_nic.tcp.deliver import RxDeliver
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.3
WIDTHS = (1, 2, 8, 64)  # 2: the ECPIX-5 server's width
CONNS = 5
LEAD = 6            # cycles one side of a directed verdict/packet pair is offered first


# A verdict step: (source, index, action, trim, conn) with source "i" (index into the receive
# buffer's packets) or "parked" (index into the parked packets, in park order) and action
# "deliver", "drop" or "park" (park only for source "i").

def verdict(step, packet):
    """The Verdict transfer for ``step`` on ``packet``, with the fields the control gives a drop
    or a park (trim 0, the payload's length) where they do not matter."""
    source, _, action, trim, conn = step
    deliver = action == "deliver"
    return {"conn": conn, "deliver": int(deliver), "park": int(action == "park"),
            "parked": int(source == "parked"), "trim": trim if deliver else 0,
            "length": len(packet) - trim if deliver else len(packet)}


def reference(packets, steps):
    """What RxDeliver must produce: ([(header, bytes)] delivered, [bytes] parked), in order;
    also checks that ``steps`` is consistent (one verdict per packet, parked ones in order)."""
    delivered, parked = [], []
    next_i = next_parked = 0
    for source, index, action, trim, conn in steps:
        if source == "i":
            assert index == next_i
            packet = packets[index]
            next_i += 1
        else:
            assert index == next_parked and index < len(parked) and action != "park"
            packet = parked[index]
            next_parked += 1
        if action == "deliver":
            assert 0 <= trim < len(packet)
            delivered.append(({"conn": conn, "length": len(packet) - trim}, packet[trim:]))
        elif action == "park":
            parked.append(packet)
    assert next_i == len(packets) and next_parked == len(parked)
    return delivered, parked


def random_length(rng, n):
    return rng.choice([1, n, n + 1, n * rng.randint(1, 4), rng.randint(1, max(20, 4 * n + 7))])


def random_trim(rng, n, length):
    return min(length - 1, rng.choice([0, length - 1, n, n - 1, n + 1,
                                       rng.randrange(length), rng.randrange(length)]))


def random_scenario(rng, n, count):
    """``count`` random packets of ``i`` and a consistent random verdict sequence for them:
    parked packets get their verdicts in park order, interleaved with the later ones of ``i``."""
    packets = [bytes(rng.getrandbits(8) for _ in range(random_length(rng, n)))
               for _ in range(count)]
    steps, waiting, parks = [], [], 0       # waiting: lengths of parked packets with no verdict

    def release():
        length = waiting.pop(0)
        index = parks - len(waiting) - 1
        if rng.random() < 0.75:
            steps.append(("parked", index, "deliver", random_trim(rng, n, length),
                          rng.randrange(CONNS)))
        else:
            steps.append(("parked", index, "drop", 0, rng.randrange(CONNS)))

    for k, packet in enumerate(packets):
        while waiting and rng.random() < 0.35:
            release()
        kind = rng.random()
        if kind < 0.4:
            steps.append(("i", k, "deliver", random_trim(rng, n, len(packet)),
                          rng.randrange(CONNS)))
        elif kind < 0.6:
            steps.append(("i", k, "drop", 0, rng.randrange(CONNS)))
        else:
            steps.append(("i", k, "park", 0, rng.randrange(CONNS)))
            waiting.append(len(packet))
            parks += 1
    while waiting:
        release()
    return packets, steps


def check_deliver(n, packets, steps, *, idle, stall, seed, order=None):
    """Run RxDeliver on ``packets`` and ``steps`` and compare its outputs with the reference.

    ``order`` maps a step's index to "verdict_first" (its packet's first beat is offered only
    ``LEAD`` cycles after the verdict is) or "packet_first" (the verdict only ``LEAD`` cycles
    after the first beat); other steps run with random timing."""
    rng = random.Random(seed)
    order = order or {}
    dut = RxDeliver(n, CONNS)
    delivered, parked = reference(packets, steps)
    parked_list = []
    verdicts = []
    for step in steps:
        source, index = step[:2]
        packet = packets[index] if source == "i" else parked_list[index]
        verdicts.append(verdict(step, packet))
        if step[2] == "park":
            parked_list.append(packet)
    step_of = {(s[0], s[1]): e for e, s in enumerate(steps)}
    state = {"verdict": -1, "i": -1, "parked": -1}
    loop = []                                    # the park buffer: packets o_park gave
    done = set()

    def rand():
        return random.Random(rng.random())

    async def wait_for(ctx, key, index, valid):
        """Until stream ``key`` offers item ``index`` (its ``valid`` is high), then LEAD
        cycles more."""
        while True:
            # Item `index` is the one offered at this edge only if it was current before it.
            current = state[key] >= index
            _, _, seen = await ctx.tick().sample(valid)
            if current and seen:
                break
        for _ in range(LEAD):
            await ctx.tick()

    async def verdict_source(ctx):
        bus, port, r = AmaranthBus(ctx), StreamPort.amaranth(dut.i_verdict), rand()
        for e, (step, v) in enumerate(zip(steps, verdicts)):
            if order.get(e) == "packet_first":
                source, index = step[:2]
                valid = dut.i.valid if source == "i" else dut.i_parked.valid
                await wait_for(ctx, source, index, valid)
            state["verdict"] = e
            await send(bus, port, [v], rng=r, idle=idle)
        done.add("verdict")

    async def packet_source(ctx, source, port, packet_at, count):
        bus, r = AmaranthBus(ctx), rand()
        for k in range(count):
            e = step_of[(source, k)]
            if order.get(e) == "verdict_first":
                await wait_for(ctx, "verdict", e, dut.i_verdict.valid)
            while source == "parked" and len(loop) <= k:
                await ctx.tick()
            state[source] = k
            await send_packets(bus, port, [packet_at(k)], n, rng=r, idle=idle)
        done.add(source)

    async def rx_source(ctx):
        await packet_source(ctx, "i", StreamPort.amaranth(dut.i), packets.__getitem__,
                            len(packets))

    async def park_source(ctx):
        await packet_source(ctx, "parked", StreamPort.amaranth(dut.i_parked), loop.__getitem__,
                            len(parked))

    async def park_sink(ctx):
        bus, port, r = AmaranthBus(ctx), StreamPort.amaranth(dut.o_park), rand()
        for j in range(len(parked)):
            [got] = await recv_packets(bus, port, 1, n, rng=r, stall=stall)
            assert (bytes(got), got.err) == (parked[j], False), f"parked packet {j}"
            loop.append(bytes(got))
        done.add("o_park")

    async def header_sink(ctx):
        got = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_header), len(delivered),
                         rng=rand(), stall=stall)
        assert got == [h for h, _ in delivered]
        done.add("o_header")

    async def data_sink(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(delivered),
                                 n, rng=rand(), stall=stall)
        for k, (packet, (header, data)) in enumerate(zip(got, delivered)):
            assert bytes(packet) == data, f"delivery {k}, header {header}"
        done.add("o")

    offered = {}                                 # (stream, index) -> first cycle offered

    async def watch(ctx):
        """Record the cycle each verdict, and each packet's first beat, is first offered."""
        ports = {"verdict": dut.i_verdict, "i": dut.i, "parked": dut.i_parked}
        taken = dict.fromkeys(ports, 0)          # items (verdicts, packets) taken so far
        cycle = 0
        while len(done) < 6:
            signals = []
            for iface in ports.values():
                last = iface.payload.last if hasattr(iface.payload, "last") else iface.valid
                signals += [iface.valid, iface.ready, last]
            _, _, *values = await ctx.tick().sample(*signals)
            for k, key in enumerate(ports):
                valid, ready, last = values[3 * k:3 * k + 3]
                if valid:
                    offered.setdefault((key, taken[key]), cycle)
                    taken[key] += ready and last
            cycle += 1

    async def quiet(ctx):
        """Once everything expected has passed: every input taken, and nothing more out."""
        while len(done) < 6:
            await ctx.tick()
        for iface in (dut.o, dut.o_header, dut.o_park):
            ctx.set(iface.ready, 1)
        for _ in range(3 * n + 8):
            _, _, *valid = await ctx.tick().sample(dut.o.valid, dut.o_header.valid,
                                                    dut.o_park.valid, dut.i_verdict.ready)
            assert valid == [0, 0, 0, 0], "output (or a verdict taken) beyond the expected"

    run(dut, verdict_source, rx_source, park_source, park_sink, header_sink, data_sink, watch,
        quiet, name=f"tcp_deliver_w{n}")
    for e, first in order.items():
        verdict_at, packet_at = offered[("verdict", e)], offered[steps[e][:2]]
        lead = packet_at - verdict_at if first == "verdict_first" else verdict_at - packet_at
        assert lead >= LEAD, f"step {e} {steps[e]}: {first} by {lead} cycles only"
    return delivered, parked


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n", WIDTHS)
def test_random(n, seed):
    """A random consistent scenario with random idle and stall cycles on all six streams."""
    rng = random.Random(3000 + 100 * seed + n)
    packets, steps = random_scenario(rng, n, 200)
    delivered, parked = check_deliver(n, packets, steps, idle=IDLE, stall=STALL,
                                      seed=rng.random())
    # The scenario reaches every kind of verdict, on both buffers.
    kinds = {(s[0], s[2]) for s in steps}
    assert kinds == {("i", "deliver"), ("i", "drop"), ("i", "park"),
                     ("parked", "deliver"), ("parked", "drop")}
    assert len(delivered) > 10 and len(parked) > 10


@pytest.mark.parametrize("n", WIDTHS)
def test_random_full_rate(n):
    """The same with no idle and no stall: verdicts back to back, nothing lost between them."""
    rng = random.Random(4000 + n)
    packets, steps = random_scenario(rng, n, 150)
    check_deliver(n, packets, steps, idle=0, stall=0, seed=rng.random())


def edge_scenario(n):
    """Directed packets and verdicts, with each step's verdict/packet order alternating."""
    rng = random.Random(n)

    def data(length):
        return bytes(rng.getrandbits(8) for _ in range(length))

    lengths = [1, 1, 1, 1, n, 2 * n, 3 * n, 2, n + 1, 2 * n + 1, 3 * n, 1, 2 * n, 5]
    packets = [data(k) for k in lengths]
    # Per packet of i: its own verdict, and for a parked one that of its later release.
    plan = [
        ("deliver", 0, None),             # 1 byte, trim 0
        ("drop", 0, None),                # 1 byte dropped
        ("park", 0, ("deliver", 0)),      # 1 byte parked, then delivered
        ("park", 0, ("drop", 0)),         # 1 byte parked, then dropped
        ("deliver", 0, None),             # one whole beat
        ("deliver", n, None),             # two beats, the first trimmed away
        ("deliver", 3 * n - 1, None),     # three beats, one byte left
        ("deliver", 1, None),             # two bytes, one left
        ("park", 0, ("deliver", n)),      # n + 1 bytes parked, one byte left
        ("park", 0, ("deliver", 2 * n)),  # 2n + 1 bytes parked, one byte left
        ("park", 0, ("deliver", 0)),      # whole beats parked, delivered whole
        ("drop", 0, None),
        ("park", 0, ("deliver", 2 * n - 1)),  # whole beats parked, one byte left
        ("deliver", 4, None),             # five bytes, one left
    ]
    steps, releases, parks = [], [], 0
    for k, (action, trim, release) in enumerate(plan):
        steps.append(("i", k, action, trim, k % CONNS))
        if release:
            releases.append(("parked", parks, *release, (k + 2) % CONNS))
            parks += 1
        # Release parked packets two at a time, behind the receive buffer's.
        if len(releases) == 2 or k == len(plan) - 1:
            steps += releases
            releases = []
    order = {e: ("verdict_first", "packet_first")[e % 2] for e in range(len(steps))}
    return packets, steps, order


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("pressure", [False, True])
def test_edges(n, pressure):
    """1-byte packets, whole-beat packets, trims leaving one byte, from both buffers; every
    verdict offered LEAD cycles before its packet's first beat or LEAD cycles after it."""
    packets, steps, order = edge_scenario(n)
    rate = IDLE if pressure else 0
    delivered, parked = check_deliver(n, packets, steps, idle=rate, stall=rate,
                                      seed=n + pressure, order=order)
    assert any(len(d) == 1 for _, d in delivered)
    assert {"verdict_first", "packet_first"} == {order[e] for e, s in enumerate(steps)
                                                 if s[0] == "parked"}
    assert len(parked) == 6

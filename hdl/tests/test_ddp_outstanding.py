# amaranth: UnusedElaboratable=no
"""OutstandingTable against a reference of its own: a ``collections.deque`` per connection.

Four testbenches offer pushes, questions, retires and clears at once, each with random idle
cycles, and the answers are taken with random stalls. A monitor samples every handshake at
every clock edge and replays it on the reference in the documented order: the cycle's question
first (it sees the state before the cycle), then the one retire, clear or push taken, which
must be the one the priority (retire > clear > push, a push only into a FIFO not full) says.
Every answer must be the reference's oldest entry of its connection at the time its question
was taken (or ``present`` 0), offered the cycle after. The drivers choose their connections
from the reference as it stands: pushes crowd a few connections in turn until they fill (and
a push waits for a retire), retires mostly take the fullest connections and sometimes an empty
one (ignored), clears come now and then. Runs with 16 connections, 4 and 32 deep, and one with
5 connections whose operations also name the connections 5 to 7 (ignored, answered absent).
"""

import random
from collections import Counter, deque

import pytest
from amaranth.back import verilog

from iwarp_nic.ddp import OutstandingTable
from iwarp_nic.ddp.placement import OutstandingRead
from iwarp_nic.tcp.layouts import conn_bits
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, collector, send

FIELDS = list(OutstandingRead.members)
STALL = 0.3


def _entry(rng, serial):
    """A random outstanding Read or atomic, its ``id`` the serial number of its push."""
    fields = {name: rng.getrandbits(width) for name, width in OutstandingRead.members.items()}
    fields["id"] = serial & 0xFFFF
    return fields


def simulate(conns, depth, *, pushes, seed, span=None):
    """Run the four drivers until ``pushes`` pushes are taken; return the monitor's counts.
    Connections are drawn from ``range(span)`` (``conns`` unless given)."""
    span = span or conns
    dut = OutstandingTable(conns, depth)
    ref = {conn: deque() for conn in range(span)}
    expected, got, errors = [], {}, []
    stats = Counter()
    state = {"pushed": 0, "done": False}

    def phase():
        """Filling (pushes crowd two connections, retires rare) or draining, in turns."""
        return state["pushed"] // (3 * depth) % 2

    def nonempty():
        return [conn for conn, fifo in ref.items() if fifo]

    def drive(port, choose, idle, rng):
        """A testbench offering ``choose()`` (a dict of payload fields, or None to stop) after
        random idle cycles (``idle()`` per cycle), each held until taken."""
        async def bench(ctx):
            await send(AmaranthBus(ctx), StreamPort.amaranth(port), iter(choose, None),
                       rng=rng, idle=idle, timeout=5_000)
            for _ in range(40):         # the last answer goes out
                await ctx.tick()
        return bench

    push_rng, retire_rng, clear_rng, ask_rng = (random.Random(seed * 10 + k) for k in range(4))
    hot = [0, 1]

    def choose_push():
        if state["pushed"] >= pushes:
            state["done"] = True
            return None
        if push_rng.random() < 0.02:
            hot[:] = push_rng.sample(range(span), 2)
        serial = state["pushed"]
        state["pushed"] += 1
        conn = push_rng.choice(hot) if push_rng.random() < 0.7 else push_rng.randrange(span)
        return {**_entry(push_rng, serial), "conn": conn}

    def choose_retire():
        if state["done"]:
            return None
        full = [conn for conn, fifo in ref.items() if len(fifo) >= depth]
        busy = nonempty()
        if full and retire_rng.random() < 0.5:
            conn = retire_rng.choice(full)
        elif busy and retire_rng.random() < 0.85:
            conn = retire_rng.choice(busy)
        else:
            conn = retire_rng.randrange(span)
        return {"conn": conn}

    def choose_conn(rng):
        """For a clear or a question: mostly a connection with entries, else any."""
        def choose():
            if state["done"]:
                return None
            busy = nonempty()
            return {"conn": rng.choice(busy) if busy and rng.random() < 0.7 else
                    rng.randrange(span)}
        return choose

    push, retire, clear, ask, out = dut.i_push, dut.i_retire, dut.i_clear, dut.i_ask, dut.o_oldest
    drivers = [
        drive(push, choose_push, lambda: 0.7 if phase() else 0.2, push_rng),
        drive(retire, choose_retire,
              lambda: 0.95 if not nonempty() else 0.3 if phase() else 0.85, retire_rng),
        drive(clear, choose_conn(clear_rng), lambda: 0.98, clear_rng),
        drive(ask, choose_conn(ask_rng), lambda: 0.4, ask_rng),
    ]
    answers = collector(got, "answers", out, rng=random.Random(seed + 5), stall=STALL)

    sampled = [push.valid, push.ready, push.payload.conn,
               *(push.payload[name] for name in FIELDS),
               retire.valid, retire.ready, retire.payload.conn,
               clear.valid, clear.ready, clear.payload.conn,
               ask.valid, ask.ready, ask.payload.conn, out.valid, out.ready]

    async def monitor(ctx):
        asked_before = False
        cycle = 0
        while True:
            _, _, *values = await ctx.tick().sample(*sampled)
            p_valid, p_ready, p_conn = values[:3]
            entry = dict(zip(FIELDS, values[3:3 + len(FIELDS)]))
            (r_valid, r_ready, r_conn, c_valid, c_ready, c_conn,
             a_valid, a_ready, a_conn, o_valid, o_ready) = values[3 + len(FIELDS):]
            cycle += 1

            def check(ok, what, cycle=cycle):
                if not ok:
                    errors.append(f"cycle {cycle}: {what}")

            check(not asked_before or o_valid, "the answer is not offered the cycle after")
            check(a_ready == int(not o_valid or o_ready), "i_ask.ready is not the output's")
            asked_before = bool(a_valid and a_ready)
            if asked_before:                    # the question sees the state before the cycle
                fifo = ref.get(a_conn) if a_conn < conns else None
                expected.append((cycle, a_conn, dict(fifo[0]) if fifo else None))
            check(r_ready, "i_retire not ready")
            if c_valid:
                check(c_ready == int(not r_valid), "clear's priority")
            if p_valid:
                fits = p_conn >= conns or len(ref[p_conn]) < depth
                check(p_ready == int(not r_valid and not c_valid and fits), "push's priority")
                if not r_valid and not c_valid and not fits:
                    stats["push held, full"] += 1
            if r_valid:
                if r_conn < conns and ref[r_conn]:
                    ref[r_conn].popleft()
                    stats["retire"] += 1
                else:
                    stats["retire, empty"] += 1
            elif c_valid and c_ready:
                if c_conn < conns:
                    stats["clear, not empty"] += bool(ref[c_conn])
                    ref[c_conn].clear()
            elif p_valid and p_ready:
                if p_conn < conns:
                    ref[p_conn].append(entry)
                    stats["push"] += 1
                    stats["filled"] += len(ref[p_conn]) == depth
                else:
                    stats["push, outside"] += 1

    run(dut, *drivers, monitors=[monitor, answers], name=f"ddp_outstanding_c{conns}_d{depth}")
    assert not errors, errors[:5]
    answers = got["answers"]
    assert len(answers) == len(expected), (len(answers), len(expected))
    for (cycle, conn, want), answer in zip(expected, answers):
        where = f"question at cycle {cycle} about connection {conn}"
        if want is None:
            assert answer["present"] == 0, where
        else:
            assert answer["present"] == 1, where
            assert {name: answer[name] for name in FIELDS} == want, where
    stats["present"] = sum(want is not None for _, _, want in expected)
    stats["absent"] = len(expected) - stats["present"]
    return stats


@pytest.mark.parametrize("depth, pushes", [(4, 1500), (32, 3000)])
def test_random(depth, pushes):
    """16 connections: pushes, questions, retires and clears interleaved at random, with
    FIFOs filled until a push waits for a retire, empty retires and clears."""
    stats = simulate(16, depth, pushes=pushes, seed=depth)
    for what in ("push held, full", "retire, empty", "clear, not empty", "filled", "present",
                 "absent"):
        assert stats[what] > 0, (what, stats)
    assert stats["retire"] > pushes // 4, stats


def test_outside():
    """5 connections (not a power of two), two deep, operations also about connections 5 to
    7: those are taken and ignored, their questions answered absent."""
    stats = simulate(5, 2, pushes=600, seed=7, span=1 << conn_bits(5))
    for what in ("push held, full", "retire, empty", "push, outside", "present", "absent"):
        assert stats[what] > 0, (what, stats)


@pytest.mark.parametrize("conns, depth", [(0, 4), (4, 3), (4, 1), (4, True)])
def test_parameters(conns, depth):
    with pytest.raises(ValueError):
        OutstandingTable(conns, depth)


@pytest.mark.parametrize("conns, depth", [(16, 32), (5, 4)])
def test_lint(conns, depth, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "outstanding.v"
    path.write_text(verilog.convert(OutstandingTable(conns, depth), name="outstanding"))
    assert lint(path) == ""

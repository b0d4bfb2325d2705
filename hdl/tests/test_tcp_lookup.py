# amaranth: UnusedElaboratable=no
"""ConnLookup against a Python model of the table: a dict for the answers, and the chains
(head first, from a bucket hash written here from the docstring) for the exact cycle counts.

One testbench drives all four streams cycle by cycle: random inserts (free ids, fresh or
recycled keys), removes (present and absent ids) and lookups (present, removed and never-seen
keys) with random idle cycles on each input and random stalls on ``o_lookup``; tiny bucket
counts force long chains. Every edge is checked: one operation at a time, never before the
previous one is done, never idle while work waits, the documented arbitration, each answer
in order with its documented latency. Also: reset empties the table, and a broken insert
contract (a looping chain) still lets every walk end.
"""

import random

import pytest
from amaranth import Signal, Value
from amaranth.hdl import ResetInserter

from iwarp_nic.tcp.layouts import conn_bits
from iwarp_nic.tcp.lookup import ConnLookup
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort

IDLE, STALL = 0.4, 0.3
M32 = 0xFFFF_FFFF
KINDS = ("lookup", "insert", "remove")


def rotl32(x, r):
    return ((x << r) | (x >> (32 - r))) & M32


def bucket_of(key, hash_key, bits):
    """The bucket of ``key`` = (remote_ip, remote_port, local_port), per ConnLookup's doc."""
    remote_ip, remote_port, local_port = key
    a = remote_ip ^ hash_key
    b = (local_port | remote_port << 16) ^ rotl32(hash_key, 16)
    a = (a + b) & M32
    b = rotl32(b, 7) ^ a
    a = (rotl32(a, 16) + b) & M32
    b = rotl32(b, 13) ^ a
    h = a ^ rotl32(b, 8)
    index = 0
    for lo in range(0, 32, bits):
        index ^= (h >> lo) & ((1 << bits) - 1)
    return index


def key_value(key):
    """A key as the packed ConnKey (remote_ip, remote_port, local_port from bit 0 up)."""
    remote_ip, remote_port, local_port = key
    return remote_ip | remote_port << 32 | local_port << 48


def input_port(iface):
    """An input as a StreamPort whose ``key`` field is the packed ConnKey."""
    payload = iface.payload
    names = [name for name, _ in payload.shape()]
    if "remote_ip" in names:                     # i_lookup: the payload is the key
        return StreamPort(iface.valid, iface.ready, {"key": Value.cast(payload)})
    return StreamPort(iface.valid, iface.ready,
                      {name: Value.cast(payload[name]) for name in names})


class Model:
    """The table: ``conn_of`` for the answers, ``chains`` for the timing."""

    def __init__(self, buckets, hash_key):
        self.bits = (buckets - 1).bit_length()
        self.hash_key = hash_key
        self.conn_of, self.key_of, self.chains = {}, {}, {}

    def chain(self, key):
        return self.chains.setdefault(bucket_of(key, self.hash_key, self.bits), [])

    def lookup(self, key):
        """((hit, conn), cycles to the answer = cycles until the next operation)."""
        chain = self.chain(key)
        if key in self.conn_of:
            conn = self.conn_of[key]
            return (1, conn), 5 + chain.index(conn)
        return (0, 0), 4 + len(chain)

    def insert(self, key, conn):
        assert key not in self.conn_of and conn not in self.key_of, "test broke the contract"
        self.chain(key).insert(0, conn)
        self.conn_of[key], self.key_of[conn] = conn, key
        return 4

    def remove(self, conn):
        if conn not in self.key_of:
            return 2
        key = self.key_of.pop(conn)
        del self.conn_of[key]
        chain = self.chain(key)
        position = chain.index(conn)
        chain.remove(conn)
        return 4 + position


class Driver:
    """Offers random operations on the three inputs and checks every edge (see module doc)."""

    def __init__(self, dut, rng, ops, *, idle=IDLE, stall=STALL):
        self.dut, self.rng, self.ops_left = dut, rng, ops
        self.idle, self.stall = idle, stall
        self.hash_key = rng.getrandbits(32)
        self.model = Model(dut.buckets, self.hash_key)
        self.ports = {kind: input_port(getattr(dut, f"i_{kind}")) for kind in KINDS}
        self.out = StreamPort.amaranth(dut.o_lookup)
        self.offers = dict.fromkeys(KINDS)
        self.seen_keys = []                   # every key ever inserted, for lookups and reuse
        self.expected = []                    # [(hit, conn), cycle due] of accepted lookups
        self.cycle = 0
        self.sweep = max(dut.buckets, dut.conns)
        self.free_at = self.sweep             # the first edge the DUT can accept at
        self.lookup_last = self.insert_last = False
        self.filling = True
        self.answers = 0
        self.stats = {"hit": 0, "miss": 0, "insert": 0, "remove": 0, "longest": 0}

    # --- random operations -------------------------------------------------------------------
    def fresh_key(self):
        return (self.rng.getrandbits(32), self.rng.getrandbits(16), self.rng.getrandbits(16))

    def make(self, kind):
        """A random operation of ``kind``, or None. The table fills up until it is full, then
        drains until it is empty, and so on: full tables and long chains get their turn."""
        rng, model, conns = self.rng, self.model, self.dut.conns
        if len(model.key_of) == conns:
            self.filling = False
        elif not model.key_of:
            self.filling = True
        if kind != "lookup" and (kind == "insert") != self.filling and rng.random() < 0.8:
            return None
        if kind == "lookup":
            roll = rng.random()
            if roll < 0.5 and model.conn_of:
                key = rng.choice(list(model.conn_of))
            elif roll < 0.8 and self.seen_keys:
                key = rng.choice(self.seen_keys)
            else:
                key = self.fresh_key()
            return {"key": key}
        if kind == "insert":
            free = [c for c in range(conns) if c not in model.key_of]
            if not free:
                return None
            unused = [k for k in self.seen_keys if k not in model.conn_of]
            key = rng.choice(unused) if unused and rng.random() < 0.3 else self.fresh_key()
            self.seen_keys.append(key)
            return {"key": key, "conn": rng.choice(free)}
        roll = rng.random()
        if model.key_of and roll < 0.85:
            return {"conn": rng.choice(list(model.key_of))}
        return {"conn": rng.randrange(conns)} if roll < 0.9 else None

    def put(self, bus, kind, op):
        """Offer ``op`` on input ``kind`` (held from now on until it is accepted)."""
        port = self.ports[kind]
        self.offers[kind] = op
        for name, value in op.items():
            bus.set(port.fields[name], key_value(value) if name == "key" else value)

    def offer(self, bus):
        for kind in KINDS:
            if self.offers[kind] is None and self.ops_left > 0 and self.rng.random() >= self.idle:
                # An insert is drawn against the table as it is now; only removes can be
                # served before it, so it stays within the contract.
                op = self.make(kind)
                if op is not None:
                    self.put(bus, kind, op)
                    self.ops_left -= 1
            bus.set(self.ports[kind].valid, int(self.offers[kind] is not None))

    # --- one edge ----------------------------------------------------------------------------
    async def step(self, bus):
        self.offer(bus)
        ready = self.rng.random() >= self.stall
        bus.set(self.out.ready, int(ready))
        names = list(self.out.fields)
        signals = [p.ready for p in self.ports.values()] + [self.out.valid] + \
            [self.out.fields[n] for n in names]
        sampled = await bus.edge(*signals)
        readies, (out_valid, *values) = sampled[:3], sampled[3:]
        edge, self.cycle = self.cycle, self.cycle + 1
        valid = {kind: self.offers[kind] is not None for kind in KINDS}
        taken = [kind for kind, r in zip(KINDS, readies) if r and valid[kind]]
        result_free = not out_valid or ready
        self.check_arbitration(edge, valid, taken, result_free)
        self.check_answer(edge, out_valid, ready, dict(zip(names, values)))
        if taken:
            self.serve(edge, taken[0])

    def check_arbitration(self, edge, valid, taken, result_free):
        assert len(taken) <= 1, f"edge {edge}: {taken} accepted together"
        if edge < self.free_at:
            assert not taken, f"edge {edge}: {taken} accepted while busy until {self.free_at}"
            return
        lookup_ok = valid["lookup"] and result_free
        updates = valid["insert"] or valid["remove"]
        if lookup_ok and (not self.lookup_last or not updates):
            want = "lookup"
        elif updates:
            remove_first = valid["remove"] and (self.insert_last or not valid["insert"])
            want = "remove" if remove_first else "insert"
        else:
            want = None
        assert taken == ([want] if want else []), \
            f"edge {edge}: took {taken}, expected {want} (valid {valid}, last lookup " \
            f"{self.lookup_last}, result free {result_free})"

    def check_answer(self, edge, out_valid, ready, payload):
        if not self.expected or edge < self.expected[0][1]:
            assert not out_valid, f"edge {edge}: unexpected o_lookup.valid"
            return
        want, due = self.expected[0]
        assert out_valid, f"edge {edge}: answer due at {due} missing"
        got = (payload["hit"], payload["conn"])
        assert got == want, f"edge {edge}: answer {got}, expected {want}"
        if ready:
            self.expected.pop(0)
            self.answers += 1

    def serve(self, edge, kind):
        op = self.offers[kind]
        self.offers[kind] = None
        model = self.model
        if kind == "lookup":
            answer, cycles = model.lookup(op["key"])
            self.expected.append((answer, edge + cycles))
            self.stats["hit" if answer[0] else "miss"] += 1
            self.stats["longest"] = max(self.stats["longest"], len(model.chain(op["key"])))
        elif kind == "insert":
            cycles = model.insert(op["key"], op["conn"])
            self.stats["insert"] += 1
        else:
            cycles = model.remove(op["conn"])
            self.stats["remove"] += 1
        self.lookup_last = kind == "lookup"
        if kind != "lookup":
            self.insert_last = kind == "insert"
        self.free_at = edge + cycles

    def busy(self):
        return self.ops_left > 0 or any(self.offers.values()) or self.expected

    async def run(self, ctx, *, limit=200_000):
        bus = AmaranthBus(ctx)
        ctx.set(self.dut.hash_key, self.hash_key)
        while self.busy():
            await self.step(bus)
            assert self.cycle < limit, "no progress"

    async def reset(self, ctx, rst):
        """Pulse reset (``rst``, a reset of the DUT's sync domain) for one edge with nothing in
        flight: the table must come back empty."""
        bus = AmaranthBus(ctx)
        assert not self.busy()
        for port in self.ports.values():
            bus.set(port.valid, 0)
        ctx.set(rst, 1)
        await bus.edge()
        ctx.set(rst, 0)
        self.free_at = self.cycle + 1 + self.sweep
        self.cycle += 1
        self.model = Model(self.dut.buckets, self.hash_key)
        self.lookup_last = self.insert_last = False


def simulate(conns, buckets, ops, seed, **kw):
    dut = ConnLookup(conns, buckets=buckets)
    driver = Driver(dut, random.Random(seed), ops, **kw)

    async def bench(ctx):
        await driver.run(ctx)

    run(dut, bench)
    return driver


@pytest.mark.parametrize("conns,buckets,ops", [
    (1, 2, 300), (1, None, 300),
    (16, 2, 1200), (16, None, 1200),
    (64, 2, 1500), (64, 8, 1500), (64, None, 1500),
])
def test_random(conns, buckets, ops):
    driver = simulate(conns, buckets, ops, seed=conns * 100 + (buckets or 0))
    stats = driver.stats
    assert driver.answers == stats["hit"] + stats["miss"]
    # The mix exercised what it should: hits, misses, both updates, and (with tiny bucket
    # counts) chains longer than one. (With one connection hits are rare: the key a lookup
    # draws is often removed before the lookup's turn, the more so the longer a lookup takes.)
    assert min(stats["miss"], stats["insert"], stats["remove"]) > ops // 40, stats
    assert stats["hit"] > (ops // 40 if conns > 1 else 0), stats
    if buckets == 2 and conns > 1:
        assert stats["longest"] >= conns // 3, stats


def test_back_to_back():
    """No idle cycles or stalls: every operation starts the cycle the previous one ends."""
    driver = simulate(16, 4, 1000, seed=5, idle=0.0, stall=0.0)
    assert driver.answers > 200


def test_large():
    """1024 connections (the default 2048 buckets): a fill-up, then the random mix."""
    driver = simulate(1024, None, 2500, seed=11)
    assert driver.stats["hit"] > 200 and len(driver.model.key_of) > 150, driver.stats


def test_reset_empties():
    dut = ConnLookup(16, buckets=4)
    rst = Signal()
    rng = random.Random(3)
    driver = Driver(dut, rng, 300)
    present = {}

    async def bench(ctx):
        await driver.run(ctx)
        present.update(driver.model.conn_of)
        await driver.reset(ctx, rst)
        bus = AmaranthBus(ctx)
        for key in present:                      # every old key now misses
            driver.put(bus, "lookup", {"key": key})
            while driver.busy():
                await driver.step(bus)
        driver.ops_left = 300                    # and the table works as new
        await driver.run(ctx)

    run(ResetInserter({"sync": rst})(dut), bench)
    assert present and driver.stats["hit"] > 20


def test_broken_contract_ends():
    """A conn inserted twice into one bucket points at itself: walks still end (at most
    ``conns`` - 1 pointers followed) and a remove then unlinks what it can."""
    conns, buckets, hash_key = 4, 2, 0x1234_5678
    rng = random.Random(9)
    keys = {}
    while len(keys.setdefault(0, [])) < 3:
        key = (rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(16))
        keys.setdefault(bucket_of(key, hash_key, 1), []).append(key)
    k1, k2, k3 = keys[0]
    dut = ConnLookup(conns, buckets=buckets)
    answers = []

    async def bench(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.hash_key, hash_key)
        ctx.set(dut.o_lookup.ready, 1)

        async def do(kind, **fields):
            port = input_port(getattr(dut, f"i_{kind}"))
            for name, value in fields.items():
                bus.set(port.fields[name], key_value(value) if name == "key" else value)
            bus.set(port.valid, 1)
            cycles = 0
            while not (await bus.edge(port.ready))[0]:
                cycles += 1
                assert cycles < 1000
            bus.set(port.valid, 0)
            if kind == "lookup":
                start = cycles
                while not (await bus.edge(dut.o_lookup.valid))[0]:
                    cycles += 1
                    assert cycles - start < 100, "lookup never answered"
                answers.append((ctx.get(dut.o_lookup.payload.hit),
                                ctx.get(dut.o_lookup.payload.conn), cycles - start + 1))

        await do("insert", key=k1, conn=2)
        await do("insert", key=k2, conn=2)        # breaks the contract: next[2] = 2
        await do("lookup", key=k3)                # absent: walks 2, 2, 2, 2 and gives up
        await do("lookup", key=k2)                # the head
        await do("remove", conn=2)
        await do("lookup", key=k2)
        await do("insert", key=k3, conn=1)
        await do("lookup", key=k3)

    run(dut, bench)
    assert answers[0] == (0, 0, 4 + conns)
    assert answers[1] == (1, 2, 5)
    assert answers[2][:2] == (0, 0)
    assert answers[3][:2] == (1, 1)


@pytest.mark.parametrize("conns,buckets", [(0, None), (4, 3), (4, 1), (4, 0), (4, True),
                                           (4, 1 << 33), (True, None)])
def test_bad_params(conns, buckets):
    with pytest.raises(ValueError):
        ConnLookup(conns, buckets=buckets)


def test_default_buckets_and_widths():
    for conns, buckets in ((1, 2), (2, 4), (3, 8), (16, 32), (1000, 2048), (1024, 2048)):
        dut = ConnLookup(conns)
        assert dut.buckets == buckets
        assert len(dut.o_lookup.payload.conn) == conn_bits(conns)
        assert len(dut.i_insert.payload.conn) == conn_bits(conns)

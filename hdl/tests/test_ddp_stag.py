# amaranth: UnusedElaboratable=no
"""StagTable against the model's ``MrTable``: every check and invalidation, in order.

The model's table is filled with regions of three protection domains (``reg_mr`` with random
rights, offsets and lengths, one at the very top of the 64-bit TO space, and ``alloc_mr`` ones
fast-registered or not), and each entry is written into the DUT. Then one sequence of requests
goes in, each taken before the next is offered, with random idles and random stalls on both
results: checks inside and at the edges of each region, past them, wrapping the TO, under
another key or PD, for each right, at unused indices and indices beyond the table; remote
invalidations of every kind, each followed by a check at an empty index (offered while the
invalidation is under way) and one of the region; fast re-registrations under a new key and
deregistrations as host writes. Every result must be the model's (its exception, or the host
address) for the same sequence.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_model.mr import Access, make_stag, stag_index
from iwarp_nic.ddp.stag import Fault, LookupArbiter, StagTable
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

ENTRIES = 32
IDLE = STALL = 0.25


class Model(HostTable):
    """The model's table, the regions registered and the writes that mirror them."""

    def __init__(self, rng):
        super().__init__(rng, ENTRIES)
        self.regions = []

    def write(self, region, *, removed=False):
        return ("write", super().write(region, removed=removed))


def operations(rng, model):
    """(ops, expected check results, expected invalidation results)."""
    ops, checks, invalidations = [], [], []
    for k in range(14):
        pd = rng.choice(model.pds)
        if k < 10:
            size = rng.choice([1, 2, 64, 4096, rng.getrandbits(20)])
            iova = rng.choice([0, rng.getrandbits(48), (1 << 64) - size])
            region = model.table.reg_mr(pd, bytearray(size), Access(rng.randrange(16)),
                                        iova=iova)
        else:
            region = model.table.alloc_mr(pd)
            if k % 2:
                model.table.fast_reg(region.stag, bytearray(rng.randrange(1, 300)),
                                     Access(rng.randrange(16)), iova=rng.getrandbits(40))
        model.regions.append(region)
        ops.append(model.write(region))

    def check(stag, to, length, access, pd):
        ops.append(("check", {"stag": stag, "to": to % (1 << 64), "length": length,
                              "access": access, "pd": pd}))
        checks.append(model.check(stag, to % (1 << 64), length, access, pd))

    def invalidate(stag, pd):
        ops.append(("invalidate", {"stag": stag, "pd": pd}))
        invalidations.append(model.invalidate(stag, pd))

    for _ in range(6):
        for region in list(model.regions):
            size = max(region.length, 1)
            pd = region.pd.handle
            for to, length in ((region.iova, size), (region.iova, 1), (region.iova + size - 1, 1),
                               (region.iova + size - 1, 2), (region.iova - 1, 1),
                               (region.iova + size, 1), (region.iova + rng.randrange(size), 0),
                               ((1 << 64) - 1, 2), (region.iova + rng.randrange(size),
                                                    rng.randint(1, size))):
                if 0 <= to < 1 << 64 and length < 1 << 32:
                    check(region.stag, to, length, int(region.access), pd)
            check(region.stag, region.iova, 1, rng.randrange(16), pd)
            check(region.stag, region.iova, 1, int(region.access), rng.randrange(5))
            check(region.stag ^ rng.choice([1, 0x80]), region.iova, 1, 0, pd)
            check(make_stag(rng.randrange(ENTRIES), rng.randrange(256)), rng.getrandbits(64),
                  rng.randrange(100), rng.randrange(16), rng.randrange(4))
            check(rng.getrandbits(32), region.iova, 1, 0, pd)        # mostly past the table
            if rng.random() < 0.15:
                invalidate(region.stag if rng.random() < 0.7 else region.stag ^ 2,
                           pd if rng.random() < 0.8 else rng.randrange(4))
                # A check at an empty index, offered while the invalidation is under way, then
                # one of this region: the entry written back is the one invalidated.
                used = {stag_index(r.stag) for r in model.regions}
                empty = next(k for k in range(ENTRIES) if k not in used)
                check(make_stag(empty, region.stag & 0xFF), 0, 1, 0, pd)
                check(region.stag, region.iova, 1, 0, pd)
        # Host writes between requests: a fast re-registration under a new key, and a
        # deregistration.
        for region in model.regions:
            if region.invalidatable and not region.valid and rng.random() < 0.5:
                stag = make_stag(stag_index(region.stag), rng.randrange(256))
                model.table.fast_reg(stag, bytearray(rng.randrange(1, 200)),
                                     Access(rng.randrange(16)), iova=rng.getrandbits(40))
                ops.append(model.write(region))
        if rng.random() < 0.5:
            region = rng.choice([r for r in model.regions if not r.invalidatable])
            if stag_index(region.stag) in {stag_index(r.stag) for r in model.regions}:
                model.table.dereg_mr(region)
                model.regions.remove(region)
                ops.append(model.write(region, removed=True))
    return ops, checks, invalidations


def simulate(ops, n_checks, n_invalidations, *, seed, idle=IDLE, stall=STALL):
    dut = StagTable(ENTRIES)
    got = {}
    ports = {"write": dut.i_write, "check": dut.i_check, "invalidate": dut.i_invalidate}

    async def source(ctx):
        rng = random.Random(seed)
        bus = AmaranthBus(ctx)
        for kind, fields in ops:
            while rng.random() < idle:
                await bus.edge()
            port = StreamPort.amaranth(ports[kind])
            for name, value in fields.items():
                if isinstance(value, dict):
                    for sub, v in value.items():
                        ctx.set(ports[kind].payload[name][sub], v)
                else:
                    ctx.set(ports[kind].payload[name], value)
            bus.set(port.valid, 1)
            while not (await bus.edge(port.ready))[0]:
                pass
            bus.set(port.valid, 0)

    async def results(ctx):
        got["checks"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_check), n_checks,
                                   rng=random.Random(seed + 1), stall=stall)

    async def invalidations(ctx):
        got["invalidations"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_invalidate),
                                          n_invalidations, rng=random.Random(seed + 2),
                                          stall=stall)

    run(dut, source, results, invalidations, name="ddp_stag")
    # The address is defined only where there is no fault.
    return ([(Fault(r["fault"]), r["addr"] if Fault(r["fault"]) == Fault.NONE else 0)
             for r in got["checks"]],
            [(Fault(r["fault"]), 0) for r in got["invalidations"]])


@pytest.mark.parametrize("seed", [1, 2])
def test_against_model(seed):
    rng = random.Random(seed)
    model = Model(rng)
    ops, checks, invalidations = operations(rng, model)
    got_checks, got_invalidations = simulate(ops, len(checks), len(invalidations), seed=seed)
    for k, (got, want) in enumerate(zip(got_checks, checks)):
        assert got == want, (k, [op for op in ops if op[0] == "check"][k])
    assert len(got_checks) == len(checks)
    assert got_invalidations == invalidations
    # Every answer the table can give was asked for.
    assert {f for f, _ in checks} == set(Fault)
    assert {f for f, _ in invalidations} >= {Fault.NONE, Fault.INVALID_STAG,
                                             Fault.ACCESS_RIGHTS}


def test_full_rate():
    """Checks back to back, results taken at once: one per cycle."""
    rng = random.Random(9)
    model = Model(rng)
    ops, checks, invalidations = operations(rng, model)
    got_checks, _ = simulate(ops, len(checks), len(invalidations), seed=9, idle=0, stall=0)
    assert got_checks == checks


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "stag.v"
    path.write_text(verilog.convert(StagTable(4096), name="stag"))
    assert lint(path) == ""


def test_arbiter():
    """Two clients' checks share one table port: each client gets the results of its own
    checks, in its order, whatever the interleaving and the table's latency."""
    dut = LookupArbiter()
    rng = random.Random(3)
    asks = {c: [{"stag": rng.getrandbits(32), "to": rng.getrandbits(64), "length": k,
                 "access": 0, "pd": 0} for k in range(40)] for c in "ab"}
    got = {"a": [], "b": []}

    def client(name):
        async def bench(ctx):
            await send(AmaranthBus(ctx), StreamPort.amaranth(getattr(dut, f"i_{name}")),
                       asks[name], rng=random.Random(ord(name)), idle=0.3)
        return bench

    def results(name):
        async def bench(ctx):
            got[name] = await recv(AmaranthBus(ctx), StreamPort.amaranth(
                getattr(dut, f"o_{name}")), len(asks[name]), rng=random.Random(ord(name) + 1),
                stall=0.3)
        return bench

    async def table(ctx):
        """Answers in order, a few cycles late: the fault says whose it was, addr the TO."""
        bus, r = AmaranthBus(ctx), random.Random(5)
        for _ in range(80):
            (ask,) = await recv(bus, StreamPort.amaranth(dut.o_check), 1, rng=r, stall=0.2)
            for _ in range(r.randrange(6)):
                await ctx.tick()
            await send(bus, StreamPort.amaranth(dut.i_check),
                       [{"fault": ask["length"] % 7, "addr": ask["to"]}])

    run(dut, client("a"), client("b"), results("a"), results("b"), table,
        name="ddp_lookup_arbiter")
    for name in "ab":
        assert [(r["addr"], r["fault"].value) for r in got[name]] == [
            (a["to"], a["length"] % 7) for a in asks[name]]

# amaranth: UnusedElaboratable=no
"""AtomicExecutor against the model's ``_atomic_result``: FetchAdd and CmpSwap with masks of
every kind (none, all ones, single fields, random), CmpSwap that match and that do not, on
random memory; the executor reads, writes back the model's value and answers the original,
one operation after another, with a memory that answers late and stalls.
"""

import random

from iwarp_model.engine import _atomic_result
from iwarp_model.wire.rdmap import AtomicOp, AtomicRequest
from iwarp_nic.rdmap.atomic import AtomicExecutor
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

U64 = (1 << 64) - 1


def random_mask(rng):
    return rng.choice([0, U64, 1 << 63, 1 << rng.randrange(64), rng.getrandbits(64),
                       rng.getrandbits(64) & rng.getrandbits(64) & rng.getrandbits(64)])


def random_op(rng, memory):
    addr = 8 * rng.randrange(len(memory) // 8)
    original = int.from_bytes(memory[addr:addr + 8], "little")
    cmp_swap = rng.random() < 0.5
    compare_mask = random_mask(rng)
    compare = rng.getrandbits(64)
    if cmp_swap and rng.random() < 0.5:         # a match in the compared bits
        compare = (original & compare_mask) | (compare & ~compare_mask & U64)
    request = AtomicRequest(AtomicOp.CMP_SWAP if cmp_swap else AtomicOp.FETCH_ADD, 1, 0, addr,
                            rng.getrandbits(64), random_mask(rng), compare, compare_mask)
    return addr, request


def test_operations():
    """Each operation leaves the model's value and answers the original."""
    rng = random.Random(1)
    memory = bytearray(rng.randbytes(256))
    expected = bytearray(memory)
    ops, originals = [], []
    for _ in range(300):
        addr, request = random_op(rng, expected)
        original = int.from_bytes(expected[addr:addr + 8], "little")
        expected[addr:addr + 8] = _atomic_result(request, original).to_bytes(8, "little")
        originals.append(original)
        ops.append({"addr": addr, "cmp_swap": request.op == AtomicOp.CMP_SWAP,
                    "add_swap_data": request.add_swap_data,
                    "add_swap_mask": request.add_swap_mask,
                    "compare_data": request.compare_data, "compare_mask": request.compare_mask})
    dut = AtomicExecutor()
    got = []

    async def host(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_atomic), ops,
                   rng=random.Random(2), idle=0.3)

    async def memory_side(ctx):
        bus, r = AmaranthBus(ctx), random.Random(3)
        for _ in ops:
            (read,) = await recv(bus, StreamPort.amaranth(dut.o_read), 1, rng=r, stall=0.3)
            addr = read["data"]
            for _ in range(r.randrange(6)):
                await ctx.tick()
            await send(bus, StreamPort.amaranth(dut.i_read),
                       [{"data": int.from_bytes(memory[addr:addr + 8], "little")}])
            (word,) = await recv(bus, StreamPort.amaranth(dut.o_write), 1, rng=r, stall=0.3)
            assert word["addr"] == addr
            memory[addr:addr + 8] = word["data"].to_bytes(8, "little")

    async def answers(ctx):
        bus, r = AmaranthBus(ctx), random.Random(4)
        for _ in ops:
            (value,) = await recv(bus, StreamPort.amaranth(dut.o_original), 1, rng=r,
                                  stall=0.3)
            got.append(value["data"])

    run(dut, host, memory_side, answers, name="rdmap_atomic")
    assert got == originals
    assert memory == expected

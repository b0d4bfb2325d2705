"""Clients of the DMA engine's ports (:class:`iwarp_nic.dma.DmaMaster`, ``DmaWriter``,
``DmaReader``) for Amaranth simulations: random commands, and the testbenches that issue them
and collect what comes back (``hdl/tests/test_dma.py``, ``hdl/tests/test_axi_ram.py``)."""

from .streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

__all__ = ["commands", "write_client", "read_client"]


def commands(rng, n, count, at, *, max_len=5000, gap=200):
    """``count`` disjoint ``(addr, length)`` from ``at`` on: lengths 0, short (around the
    width) and long, any alignment, often ending or starting near a 4 KiB boundary. Returns
    them and the address after the last."""
    out = []
    for _ in range(count):
        at += rng.randint(0, gap)
        if rng.random() < 0.3:              # end a few bytes past a 4 KiB boundary
            at = max(at, (at | 0xFFF) + 1 - rng.randint(1, 3 * n))
        length = rng.choice([0, rng.randint(1, 2 * n + 1), rng.randint(1, 2 * n + 1),
                             rng.randint(1, max_len)])
        out.append((at, length))
        at += length
    return out, at


def write_client(cmd_port, data_port, done_port, cmds, payloads, rng, *, idle, stall, seen,
                 memory=None):
    """Testbenches for one write client: commands, data (independently: the data may lead),
    and completions into ``seen`` (checking, with ``memory``, that each arrives only after the
    write response of the last burst of its command)."""
    async def commander(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(cmd_port),
                   [{"addr": a, "length": k} for a, k in cmds], rng=rng, idle=idle)

    async def feeder(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(data_port),
                           [p for p in payloads if p], data_port.payload.data.shape().width // 8,
                           rng=rng, idle=idle)

    async def completions(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(done_port)
        for addr, length in cmds:
            seen.append((await recv(bus, port, 1, rng=rng, stall=stall))[0]["error"])
            if memory is not None:
                for burst in memory.bursts:
                    if burst.kind == "write" and addr <= burst.addr < addr + length:
                        assert burst.b_cycle is not None, "done before its write response"
    return [commander, feeder, completions]


def read_client(cmd_port, data_port, cmds, rng, *, idle, stall, got):
    async def commander(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(cmd_port),
                   [{"addr": a, "length": k} for a, k in cmds], rng=rng, idle=idle)

    async def reader(ctx):
        n = data_port.payload.data.shape().width // 8
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(data_port),
                                      sum(1 for _, k in cmds if k), n, rng=rng, stall=stall))
    return [commander, reader]

"""Set-up shared by the tests of the receive paths (:class:`iwarp_nic.ddp.StreamReceiver`, the
several-connection placer and the engines built on them)."""

from .stags import load_table
from .streams import AmaranthBus, StreamPort, send

__all__ = ["configure", "receive_answers"]


async def configure(ctx, dut, writes, pd, *, crc, markers, max_ulpdu=0xFFFF):
    """Give the receiver ``dut`` its MPA options, largest ULPDU and protection domain ``pd``,
    and make the table ``writes`` (:meth:`~iwarp_tb.stags.HostTable.write`)."""
    ctx.set(dut.crc, crc)
    ctx.set(dut.markers, markers)
    ctx.set(dut.max_ulpdu, max_ulpdu)
    ctx.set(dut.pd, pd)
    await load_table(ctx, dut.i_write, writes)


def receive_answers(placer, offers, rng):
    """A testbench answering ``placer``'s questions for a connection's next receive after a
    random delay, from ``offers`` (conn -> receives not yet taken)."""
    async def receives(ctx):
        ask = placer.o_ask_receive
        while True:
            ctx.set(ask.ready, 1)
            _, _, valid, conn = await ctx.tick().sample(ask.valid, ask.payload.conn)
            if valid:
                ctx.set(ask.ready, 0)
                offer = offers[conn].pop(0) if offers[conn] else None
                for _ in range(rng.randrange(8)):
                    await ctx.tick()
                await send(AmaranthBus(ctx), StreamPort.amaranth(placer.i_receive),
                           [{**(offer or {}), "posted": int(bool(offer))}], timeout=1 << 30)
    return receives

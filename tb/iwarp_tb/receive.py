"""Set-up shared by the tests of :class:`iwarp_nic.ddp.StreamReceiver`."""

from .stags import load_table

__all__ = ["configure"]


async def configure(ctx, dut, writes, pd, *, crc, markers, max_ulpdu=0xFFFF):
    """Give the receiver ``dut`` its MPA options, largest ULPDU and protection domain ``pd``,
    and make the table ``writes`` (:meth:`~iwarp_tb.stags.HostTable.write`)."""
    ctx.set(dut.crc, crc)
    ctx.set(dut.markers, markers)
    ctx.set(dut.max_ulpdu, max_ulpdu)
    ctx.set(dut.pd, pd)
    await load_table(ctx, dut.i_write, writes)

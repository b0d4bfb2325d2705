"""The NIC's AXI4 manager to host memory: ARM IHI 0022 (AXI4), write channels from
:class:`~.write.DmaWriter`, read channels from :class:`~.read.DmaReader`, each shared by its
clients through :mod:`.arbiter`. The AXI4 write and read channels are independent (A3.3), so
reads and writes run concurrently and neither waits for the other; a client that must order a
read after a write waits for the write's ``done``.
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axi import Axi4
from . import arbiter as arbiters
from .read import DmaReader
from .split import check_dma
from .write import DmaWriter, drive_constants

__all__ = ["DmaMaster"]

#: Extra commands the arbiters queue beyond the bursts in flight (a command waits in the
#: arbiter's register, the engine's splitter and its skid buffers as well).
_ROUTE_SLACK = 4


def _join(m, outer, inner, prefixes):
    """Connect the members of ``inner`` (an ``Axi4`` port of a submodule) whose names start with
    one of ``prefixes`` to the same members of ``outer``."""
    for name, member in outer.signature.members.items():
        if not name.startswith(prefixes):
            continue
        mine, theirs = getattr(outer, name), getattr(inner, name)
        m.d.comb += mine.eq(theirs) if member.flow == Out else theirs.eq(mine)


class DmaMaster(wiring.Component):
    """Host-memory DMA for ``write_clients`` writers and ``read_clients`` readers over one AXI4
    manager port.

    Ports
    -----
    i_write<k>_command, i_write<k>_data, o_write<k>_done
        Write client ``k`` (``k`` from 0 to ``write_clients - 1``): see
        :class:`~.arbiter.WriteArbiter` and :class:`~.write.DmaWriter`. Verilog:
        ``s_axis_write<k>_command_tdata`` (``{length, addr}``), ``s_axis_write<k>_data_t*``,
        ``m_axis_write<k>_done_tdata`` (``error``).
    i_read<k>_command, o_read<k>_data
        Read client ``k``: see :class:`~.arbiter.ReadArbiter` and :class:`~.read.DmaReader`.
        Verilog: ``s_axis_read<k>_command_tdata``, ``m_axis_read<k>_data_t*`` (``tuser`` is
        ``err``).
    m_axi : Out(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width))
        Verilog ``m_axi_awaddr`` and so on: every transfer uses ID 0, full-width INCR bursts of
        at most ``max_burst`` beats, never across 4 KiB.

    Writes and reads each run at one data beat per cycle in steady state, concurrently. At most
    ``write_outstanding`` write bursts wait for their responses and ``read_outstanding`` read
    bursts for their data. With no write (read) client the write (read) channels are idle.

    Parameters
    ----------
    data_bytes : int
        Data width in bytes: 4, 8, 16, 32 or 64 (32 to 512 bits).
    write_clients, read_clients : int
        0 to 16 each, not both 0.
    max_burst : int
        Beats per burst at most, a power of two up to 256. The default, 16, is AXI3's limit, so
        an AXI3 bridge never splits a burst, and it keeps an interconnect's arbitration fine
        grained; 16 beats of 8 to 64 bytes are 128 bytes to 1 KiB, the order of PCIe's
        payload and read-request sizes.
    write_outstanding, read_outstanding : int
        Bursts in flight per direction, 3 to 256 (default 16: 16 bursts of 16 beats keep 256
        beats in flight, enough to cover a read latency of 256 cycles at full rate).
    addr_width : int
        32 to 64 address bits.
    id_width : int
        AXI ID bits (all transfers use ID 0).
    """

    def __init__(self, data_bytes, *, write_clients, read_clients, addr_width=64, id_width=4,
                 max_burst=16, write_outstanding=16, read_outstanding=16):
        check_dma(data_bytes, max_burst=max_burst, outstanding=write_outstanding,
                  addr_width=addr_width, what="write_outstanding")
        check_dma(data_bytes, max_burst=max_burst, outstanding=read_outstanding,
                  addr_width=addr_width, what="read_outstanding")
        for what, count in (("write_clients", write_clients), ("read_clients", read_clients)):
            if not isinstance(count, int) or not 0 <= count <= 16:
                raise ValueError(f"{what} must be an integer from 0 to 16, not {count!r}")
        if not write_clients and not read_clients:
            raise ValueError("a DmaMaster needs at least one write or read client")
        self.data_bytes, self.addr_width, self.id_width = data_bytes, addr_width, id_width
        self.write_clients, self.read_clients = write_clients, read_clients
        self.max_burst = max_burst
        self.write_outstanding, self.read_outstanding = write_outstanding, read_outstanding
        axi = Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width)
        members = {**arbiters.write_clients(data_bytes, write_clients),
                   **arbiters.read_clients(data_bytes, read_clients)}
        members["m_axi"] = Out(axi)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n, axi = self.data_bytes, self.m_axi
        common = dict(max_burst=self.max_burst, addr_width=self.addr_width,
                      id_width=self.id_width)
        depth = dict(write=self.write_outstanding + _ROUTE_SLACK,
                     read=self.read_outstanding + _ROUTE_SLACK)
        if self.write_clients:
            m.submodules.write_arbiter = arbiter = arbiters.WriteArbiter(
                n, self.write_clients, depth=depth["write"])
            m.submodules.writer = writer = DmaWriter(n, outstanding=self.write_outstanding,
                                                     **common)
            wiring.connect(m, arbiter.o_command, writer.i_command)
            wiring.connect(m, arbiter.o_data, writer.i_data)
            wiring.connect(m, writer.o_done, arbiter.i_done)
            _join(m, axi, writer.m_axi, ("aw", "w", "b"))
            self._pass(m, arbiter)
        else:
            m.d.comb += [axi.awvalid.eq(0), axi.wvalid.eq(0), axi.bready.eq(0)]
            drive_constants(m, axi, "aw", n)
        if self.read_clients:
            m.submodules.read_arbiter = arbiter = arbiters.ReadArbiter(
                n, self.read_clients, depth=depth["read"])
            m.submodules.reader = reader = DmaReader(n, outstanding=self.read_outstanding,
                                                     **common)
            wiring.connect(m, arbiter.o_command, reader.i_command)
            wiring.connect(m, reader.o_data, arbiter.i_data)
            _join(m, axi, reader.m_axi, ("ar", "r"))
            self._pass(m, arbiter)
        else:
            m.d.comb += [axi.arvalid.eq(0), axi.rready.eq(0)]
            drive_constants(m, axi, "ar", n)
        return m

    def _pass(self, m, arbiter):
        for name, member in self.signature.members.items():
            if name in arbiter.signature.members:
                if member.flow == In:
                    wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(arbiter, name))
                else:
                    wiring.connect(m, getattr(arbiter, name), wiring.flipped(getattr(self, name)))

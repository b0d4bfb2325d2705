"""AMBA AXI4 and AXI4-Lite interfaces (ARM IHI 0022, the AXI and ACE protocol specification),
as Amaranth signatures seen from the manager (master) side.

A component takes a manager port as ``Out(Axi4(...))`` and a subordinate (slave) port as
``In(AxiLite(...))``. The members are the channel signals with their AXI names in lower case
(``awaddr``, ``awvalid``, ``wdata``, ...), so a member named ``m_axi`` becomes the Verilog
ports ``m_axi_awaddr``, ``m_axi_awvalid``, ... (:func:`iwarp_nic.axis.axi_ports` joins the
path with ``_``), and a member named ``s_axil`` becomes ``s_axil_awaddr``, ...: the names
cocotbext-axi's ``AxiBus.from_prefix`` and ``AxiLiteBus.from_prefix`` look for.

Only the signals this design drives or needs are members. AXI4's optional ``awqos``,
``awregion``, ``awuser`` (and their read and response counterparts) are left out; a
subordinate that has them ties them to their defaults.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Axi4", "AxiLite", "Burst", "Resp", "BOUNDARY", "MAX_BURST"]

#: A burst never crosses a 4 KiB address boundary (AXI4, A3.4.1).
BOUNDARY = 4096
#: The most beats an AXI4 INCR burst may have (``axlen`` + 1).
MAX_BURST = 256


class Burst:
    """``axburst`` encodings."""
    FIXED, INCR, WRAP = 0, 1, 2


class Resp:
    """``bresp``/``rresp`` encodings."""
    OKAY, EXOKAY, SLVERR, DECERR = 0, 1, 2, 3


def _check(addr_width, data_bytes, valid_bytes):
    if not isinstance(addr_width, int) or not 12 <= addr_width <= 64:
        raise ValueError(f"addr_width must be an integer from 12 to 64, not {addr_width!r}")
    if data_bytes not in valid_bytes:
        raise ValueError(f"data_bytes must be one of {valid_bytes}, not {data_bytes!r}")


class Axi4(wiring.Signature):
    """An AXI4 manager interface: ``addr_width`` address bits, ``data_bytes`` per data beat
    (4 to 128, that is 32 to 1024 bits), ``id_width`` ID bits on both directions."""

    DATA_BYTES = (4, 8, 16, 32, 64, 128)

    def __init__(self, *, addr_width=64, data_bytes=8, id_width=4):
        _check(addr_width, data_bytes, self.DATA_BYTES)
        if not isinstance(id_width, int) or not 1 <= id_width <= 32:
            raise ValueError(f"id_width must be an integer from 1 to 32, not {id_width!r}")
        self.addr_width, self.data_bytes, self.id_width = addr_width, data_bytes, id_width
        members = {}
        for ch in ("aw", "ar"):
            members.update({
                f"{ch}id": Out(id_width), f"{ch}addr": Out(addr_width), f"{ch}len": Out(8),
                f"{ch}size": Out(3), f"{ch}burst": Out(2), f"{ch}lock": Out(1),
                f"{ch}cache": Out(4), f"{ch}prot": Out(3),
                f"{ch}valid": Out(1), f"{ch}ready": In(1)})
        members.update({
            "wdata": Out(8 * data_bytes), "wstrb": Out(data_bytes), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "rid": In(id_width), "rdata": In(8 * data_bytes), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1)})
        super().__init__(members)

    def __eq__(self, other):
        return (type(other) is type(self) and (self.addr_width, self.data_bytes, self.id_width)
                == (other.addr_width, other.data_bytes, other.id_width))

    def __repr__(self):
        return (f"Axi4(addr_width={self.addr_width}, data_bytes={self.data_bytes}, "
                f"id_width={self.id_width})")


class AxiLite(wiring.Signature):
    """An AXI4-Lite manager interface: ``addr_width`` address bits, ``data_bytes`` (4 or 8)
    per transfer."""

    DATA_BYTES = (4, 8)

    def __init__(self, *, addr_width=16, data_bytes=4):
        _check(addr_width, data_bytes, self.DATA_BYTES)
        self.addr_width, self.data_bytes = addr_width, data_bytes
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(8 * data_bytes), "wstrb": Out(data_bytes), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(8 * data_bytes), "rresp": In(2), "rvalid": In(1), "rready": Out(1)})

    def __eq__(self, other):
        return (type(other) is type(self)
                and (self.addr_width, self.data_bytes) == (other.addr_width, other.data_bytes))

    def __repr__(self):
        return f"AxiLite(addr_width={self.addr_width}, data_bytes={self.data_bytes})"

"""Every connection's received MPA stream to its ULPDUs: RFC 5044 sections 7.1 (the startup frame,
handed to the host) and 4.1 to 4.4 and 8 (FPDUs deframed, each connection failing alone).

:class:`~iwarp_nic.mpa.gather.FrameGather` turns the TCP engine's interleaved chunks into pieces
of whole frames; the startup frames (and octets before FPDU mode it could not hold) go to the
host, which runs the MPA exchange; the FPDU pieces go to a
:class:`~iwarp_nic.mpa.deframer.FpduDeframer` of several connections.
"""

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import eq
from ..ip.mux import Demux
from ..stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes
from ..tcp.layouts import ChunkHeader
from .deframer import ConnError, FpduDeframer
from .gather import FrameGather, GatherCommand, Release, ReleaseKind

__all__ = ["MpaReceiver"]


class MpaReceiver(wiring.Component):
    """Gather and deframe the received streams of ``conns`` connections.

    Ports
    -----
    i_header : In(stream ChunkHeader(conns)); i : In(BeatStream(data_bytes))
        The chunks of every connection, as the TCP engine offers them (see
        :class:`~iwarp_nic.mpa.gather.FrameGather`).
    i_cmd : In(stream GatherCommand(conns))
        ``START`` a connection on a slot; ``FPDUS`` once the host has settled its exchange, with
        the markers and CRC setting it negotiated.
    o_startup_header : Out(stream Release(conns)); o_startup : Out(BeatStream(data_bytes))
        The STARTUP pieces (a connection's startup frame) and EARLY pieces (octets before
        ``FPDUS`` that the gather could not hold for it, see
        :class:`~iwarp_nic.mpa.gather.FrameGather`), each a header then its octets as one
        packet, for the host.
    o : Out(BeatStream(data_bytes, err=True, conns=conns))
        Per FPDU, its ULPDU_Length field and ULPDU as one packet naming its connection; ``err``
        on the last beat of a connection's first bad FPDU, and nothing more of that connection
        until it starts afresh (``START``, then ``FPDUS``).
    o_error : Out(stream ConnError(conns))
        One event per failed connection: CRC, marker or length (RFC 5044 section 8).

    ``ring_bytes`` and ``max_chunk`` are the gather's; the largest ULPDU taken is
    :func:`~iwarp_nic.mpa.gather.max_frame_ulpdu` of them, beyond which a connection fails
    with a length error.

    Throughput: the gather's (one beat per cycle within a chunk, and two to four cycles
    between chunks), while the deframer adds about four cycles per piece between the pieces.
    Latency: the gather's (a chunk's frames leave once the chunk is in) plus the deframer's.
    Back-pressure on ``o`` or ``o_error`` holds back FPDU pieces, on ``o_startup`` the startup
    pieces, and either, once the gather's ring fills, every connection's chunks.
    """

    def __init__(self, data_bytes, *, conns=16, ring_bytes=4096, max_chunk=1460):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        self._gather = FrameGather(data_bytes, conns=conns, ring_bytes=ring_bytes,
                                   max_chunk=max_chunk)
        self.max_ulpdu = self._gather.max_ulpdu
        super().__init__({
            "i_header": In(stream.Signature(ChunkHeader(conns))),
            "i": In(BeatStream(data_bytes)),
            "i_cmd": In(stream.Signature(GatherCommand(conns))),
            "o_startup_header": Out(stream.Signature(Release(conns))),
            "o_startup": Out(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes, err=True, conns=conns)),
            "o_error": Out(stream.Signature(ConnError(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n, conns = self.data_bytes, self._gather.conns
        m.submodules.frame_gather = gather = self._gather
        m.submodules.route = route = Demux(Release(conns), n, 2, err=False)
        m.submodules.deframer = deframer = FpduDeframer(n, conns=conns,
                                                        max_ulpdu=self.max_ulpdu)
        wiring.connect(m, wiring.flipped(self.i_header), gather.i_header)
        wiring.connect(m, wiring.flipped(self.i), gather.i)
        wiring.connect(m, wiring.flipped(self.i_cmd), gather.i_cmd)
        wiring.connect(m, gather.o_header, route.i_header)
        # A register slice: the deframer's ready does not reach into the gather's ring read.
        m.submodules.slice = slice_ = SkidBuffer(BeatLayout(n))
        wiring.connect(m, gather.o, slice_.i)
        wiring.connect(m, slice_.o, route.i_payload)
        # Way 0: the FPDU pieces to the deframer; way 1: the rest to the host.
        m.d.comb += route.sel.eq(~eq(route.i_header.payload.kind.as_value(),
                                     ReleaseKind.FPDUS.value))
        wiring.connect(m, route.o_header[0], deframer.i_piece)
        wiring.connect(m, route.o_payload[0], deframer.i)
        wiring.connect(m, route.o_header[1], wiring.flipped(self.o_startup_header))
        wiring.connect(m, route.o_payload[1], wiring.flipped(self.o_startup))
        wiring.connect(m, deframer.o, wiring.flipped(self.o))
        wiring.connect(m, deframer.o_error, wiring.flipped(self.o_error))
        return m

"""The receive path of one RDMAP stream, from TCP octets to placement: RFC 5044 section 6 (FPDU
deframing), RFC 5041 sections 3, 4 and 7 (segments, tagged and untagged placement, errors),
RFC 5040 sections 5.3 and 6 (Send, remote invalidation), RFC 5042 sections 5 and 6 (the checks
before placement), RFC 6581 section 7 (the RTR check).

:class:`StreamReceiver` chains the :class:`~iwarp_nic.mpa.FpduDeframer`, the
:class:`~.segment.SegmentParser`, the :class:`~.rtr.RtrCheck` (RFC 6581 section 7), the
:class:`~.placement.SegmentPlacer` and its :class:`~.stag.StagTable`.
"""

from amaranth import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..errors import Violation
from ..exact import eq, gt
from ..mpa import FpduDeframer, MpaReceiver
from ..mpa.deframer import ErrorKind
from ..mpa.negotiate import Rtr
from ..stream import BeatStream, HalfRateSlice, check_data_bytes, pass_through
from ..tcp.layouts import ConnRef, with_conn
from . import placement
from .outstanding import OutstandingTable
from .rtr import RtrCheck
from .segment import SegmentHeader, SegmentParser
from .stag import LookupArbiter, LookupRequest, LookupResult, StagTable, StagWrite

__all__ = ["StreamReceiver", "ConnectionsOpen", "ConnectionsPlacer", "ConnectionsReceiver"]


def ConnectionsOpen(conns, pd_bits):
    """A new stream taking connection ``conn``'s slot of a :class:`ConnectionsPlacer`: its
    protection domain and the RTR it awaits as a peer-to-peer Responder (RFC 6581 section 7;
    ``NONE`` when it awaits none)."""
    return with_conn(StructLayout({"pd": pd_bits, "rtr": Rtr}), conns)


class StreamReceiver(wiring.Component):
    """One stream's octets in; placements of RDMA Writes, Read Responses and Sends, receive
    completions, the ends of Reads, Terminate requests and the other segments out.

    Ports
    -----
    i : In(BeatStream(data_bytes))
        The stream from its MPA data phase on, in chunks of any size (see the deframer).
    crc, markers, max_ulpdu, pd : In
        The negotiated MPA options, the largest ULPDU accepted (no more than
        :attr:`ulpdu_limit`, set by ``fifo_bytes``), the stream's protection domain.
    rtr : In(Rtr)
        The RTR a peer-to-peer Responder awaits as the first FPDU (:class:`~.rtr.RtrCheck`);
        ``NONE`` otherwise.
    started : Out(1)
        The peer's first FPDU was taken (with ``rtr``: it matched): this end may send.
    i_write : In(stream.Signature(StagWrite(pd_bits, log2(stag_entries))))
        STag table entries from the host.
    i_check, o_check : In(stream.Signature(LookupRequest(pd_bits))),
                       Out(stream.Signature(LookupResult))
        Checks of the table for another block of the stream (the request responder), taking
        turns with the placer's (:class:`~.stag.LookupArbiter`), answered in order.
    i_receive, receive_pending, i_outstanding : In
        The receives posted on queue 0, and the Reads outstanding
        (:class:`~.placement.SegmentPlacer`).
    o_place, o_data : Out
        A placement request (host address, length) per RDMA Write, Read Response or queue 0
        segment that passed every check, then its payload (:class:`~.placement.SegmentPlacer`).
    o_complete, o_read_done : Out
        A completion per receive taken; the end of each Read.
    o_fault : Out(stream.Signature(Violation))
        The Terminate request for the first violation found after the FPDU layer.
    o_error : Out(stream.Signature(ErrorKind))
        The deframer's event for a bad FPDU (CRC, marker, length), offered when the deframer
        finds it, which may be before the placer has decided the segments ahead of it.
    bad_fpdu : Out(1)
        A cycle's pulse when the placer reaches the bad FPDU (:class:`~.placement.SegmentPlacer`):
        a Terminate request of an earlier segment is on ``o_fault`` by then.
    o_header, o_payload : Out
        The other good segments, for the RDMAP stages.

    Nothing is placed after the first error of either kind. Latency from an FPDU's last
    octet in to its placement request: the deframer's, a cycle of the parser, one of the
    register slice after the RTR check, the payload FIFO's and the table's five (measured by
    ``make bench``). Throughput: one beat per cycle for FPDUs longer than a few beats.
    """

    def __init__(self, data_bytes, *, stag_entries=4096, pd_bits=16, fifo_bytes=16384):
        self.data_bytes = check_data_bytes(data_bytes)
        self.stag_entries = stag_entries
        self.pd_bits = pd_bits
        self.fifo_beats = max(2, fifo_bytes // data_bytes)
        #: The longest ULPDU the stream accepts whatever ``max_ulpdu`` says: one whose payload
        #: fits the placer's FIFO (a longer one is the deframer's length error).
        self.ulpdu_limit = min(self.fifo_beats * data_bytes, 0xFFFF)
        index_bits = stag_entries.bit_length() - 1
        super().__init__({
            "i": In(BeatStream(data_bytes)),
            "crc": In(1), "markers": In(1), "max_ulpdu": In(16), "pd": In(pd_bits),
            "rtr": In(Rtr), "started": Out(1),
            "i_write": In(stream.Signature(StagWrite(pd_bits, index_bits))),
            "i_check": In(stream.Signature(LookupRequest(pd_bits))),
            "o_check": Out(stream.Signature(LookupResult)),
            "i_receive": In(stream.Signature(placement.PostedReceive)), "receive_pending": In(1),
            "i_outstanding": In(stream.Signature(placement.OutstandingRead)),
            "o_place": Out(stream.Signature(placement.PlaceRequest)),
            "o_data": Out(BeatStream(data_bytes)),
            "o_complete": Out(stream.Signature(placement.ReceiveCompletion)),
            "o_read_done": Out(stream.Signature(placement.ReadDone)),
            "o_fault": Out(stream.Signature(Violation)),
            "o_error": Out(stream.Signature(ErrorKind)), "bad_fpdu": Out(1),
            "o_header": Out(stream.Signature(SegmentHeader)),
            "o_payload": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.deframer = deframer = FpduDeframer(n)
        m.submodules.parser = parser = SegmentParser(n)
        m.submodules.rtr = rtr = RtrCheck()
        m.submodules.placer = placer = placement.SegmentPlacer(
            n, pd_bits=self.pd_bits, fifo_beats=self.fifo_beats)
        m.submodules.table = table = StagTable(self.stag_entries, pd_bits=self.pd_bits)
        limit = self.ulpdu_limit
        max_ulpdu = (self.max_ulpdu if limit == 0xFFFF
                     else Mux(gt(self.max_ulpdu, limit), limit, self.max_ulpdu))
        m.d.comb += [deframer.crc.eq(self.crc), deframer.markers.eq(self.markers),
                     deframer.max_ulpdu.eq(max_ulpdu), placer.pd.eq(self.pd),
                     placer.receive_pending.eq(self.receive_pending),
                     self.bad_fpdu.eq(placer.bad_fpdu)]
        wiring.connect(m, wiring.flipped(self.i), deframer.i)
        wiring.connect(m, deframer.o, parser.i)
        wiring.connect(m, deframer.o_error, wiring.flipped(self.o_error))
        wiring.connect(m, parser.o_header, rtr.i)
        _checked_headers(m, rtr, placer, None)
        m.d.comb += [rtr.expect.eq(self.rtr), placer.send_rtr.eq(rtr.o_send_rtr),
                     self.started.eq(rtr.started)]
        wiring.connect(m, parser.o_payload, placer.i_payload)
        _share_lookups(m, self, placer, table)
        wiring.connect(m, placer.o_invalidate, table.i_invalidate)
        wiring.connect(m, table.o_invalidate, placer.i_invalidate)
        wiring.connect(m, wiring.flipped(self.i_write), table.i_write)
        wiring.connect(m, wiring.flipped(self.i_receive), placer.i_receive)
        wiring.connect(m, wiring.flipped(self.i_outstanding), placer.i_outstanding)
        for name in ("o_place", "o_data", "o_complete", "o_read_done", "o_fault", "o_header",
                     "o_payload"):
            wiring.connect(m, getattr(placer, name), wiring.flipped(getattr(self, name)))
        return m


class ConnectionsPlacer(wiring.Component):
    """The DDP half of :class:`ConnectionsReceiver`: the ULPDUs of ``conns`` connections in
    (the several-connection deframer's packets, each beat naming its connection), every
    connection's placements and events out.

    It chains the several-connection :class:`~.segment.SegmentParser`,
    :class:`~.rtr.RtrCheck` (RFC 6581 section 7) and :class:`~.placement.SegmentPlacer`, with
    the :class:`~.stag.StagTable` (the placer's lookups and invalidations only) and the
    :class:`~.outstanding.OutstandingTable` the placer asks for each connection's oldest
    outstanding Read.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True, conns=conns))
        The ULPDU packets (``err``: the FPDU was bad; its connection then places nothing more).
    i_open : In(stream.Signature(ConnectionsOpen(conns, pd_bits)))
        A new stream takes connection ``conn``'s slot, before its first segment: its placer
        context made afresh with its PD (queue 0 starting after MSN 1 when the RTR awaited,
        ``rtr``, is a Send), its outstanding Reads cleared, its first segment to be checked
        against ``rtr`` (``NONE``: none awaited); taken by all three in one cycle.
    o_started : Out(stream.Signature(ConnRef(conns)))
        The :class:`~.rtr.RtrCheck`'s: a connection's first FPDU taken (with an RTR awaited,
        it matched); it may send from then on.
    i_push, count_conn, count :
        The :class:`~.outstanding.OutstandingTable`'s, for the requester: a
        Read or atomic whose request was sent, and a connection's number outstanding.
    i_write : In(stream.Signature(StagWrite(pd_bits, log2(stag_entries))))
        STag table entries from the host.
    i_check, o_check : In(stream.Signature(LookupRequest(pd_bits))),
                       Out(stream.Signature(LookupResult))
        Checks of the table for the request responder (its PD in each), taking turns with the
        placer's (:class:`~.stag.LookupArbiter`), answered in order.
    o_ask_receive, i_receive, o_place, o_data, o_complete, o_read_done, o_fault, o_header,
    o_payload, bad_fpdu, bad_fpdu_conn :
        The several-connection placer's (``bad_fpdu``: it reached a connection's bad FPDU,
        whose deframing error the engine then reports).

    Throughput and latency: the parser's and the placer's, and a cycle of the register slice
    between the RTR check and the placer (two cycles more for a segment whose connection
    differs from the last one's).
    """

    def __init__(self, data_bytes, *, conns=16, fifo_beats=512, stag_entries=4096,
                 pd_bits=16, ord_depth=32):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        self._placer = placement.SegmentPlacer(data_bytes, pd_bits=pd_bits, conns=conns,
                                               fifo_beats=fifo_beats)
        self._table = StagTable(stag_entries, pd_bits=pd_bits)
        self._outstanding = OutstandingTable(conns, ord_depth)
        placer = self._placer.signature.members
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True, conns=conns)),
            "i_open": In(stream.Signature(ConnectionsOpen(conns, pd_bits))),
            "o_started": Out(stream.Signature(ConnRef(conns))),
            **{name: self._outstanding.signature.members[name] for name in _OUTSTANDING_PORTS},
            "i_write": self._table.signature.members["i_write"],
            "i_check": In(stream.Signature(LookupRequest(pd_bits))),
            "o_check": Out(stream.Signature(LookupResult)),
            **{name: placer[name] for name in _PLACER_PORTS},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.placer = placer = self._placer
        m.submodules.table = table = self._table
        m.submodules.outstanding = outstanding = self._outstanding
        m.submodules.parser = parser = SegmentParser(self.data_bytes, conns=self.conns)
        wiring.connect(m, wiring.flipped(self.i), parser.i)
        m.submodules.rtr = rtr = RtrCheck(self.conns)
        wiring.connect(m, parser.o_header, rtr.i)
        _checked_headers(m, rtr, placer, self.conns)
        wiring.connect(m, rtr.o_started, wiring.flipped(self.o_started))
        wiring.connect(m, parser.o_payload, placer.i_payload)
        _share_lookups(m, self, placer, table)
        wiring.connect(m, placer.o_invalidate, table.i_invalidate)
        wiring.connect(m, table.o_invalidate, placer.i_invalidate)
        wiring.connect(m, wiring.flipped(self.i_write), table.i_write)
        wiring.connect(m, placer.o_ask_oldest, outstanding.i_ask)
        wiring.connect(m, outstanding.o_oldest, placer.i_oldest)
        wiring.connect(m, placer.o_retire, outstanding.i_retire)
        pass_through(m, self, outstanding, _OUTSTANDING_PORTS)
        # i_open goes to the placer, to the RTR check (always ready) and, as a clear, to the
        # outstanding Reads: taken by all in one cycle.
        opening, clear = self.i_open, outstanding.i_clear
        m.d.comb += [placer.i_open.payload.conn.eq(opening.payload.conn),
                     placer.i_open.payload.pd.eq(opening.payload.pd),
                     placer.i_open.payload.send_rtr.eq(eq(opening.payload.rtr.as_value(),
                                                           Rtr.SEND.value)),
                     rtr.i_open.payload.conn.eq(opening.payload.conn),
                     rtr.i_open.payload.expect.eq(opening.payload.rtr),
                     rtr.i_open.valid.eq(opening.valid & placer.i_open.ready & clear.ready),
                     clear.payload.conn.eq(opening.payload.conn),
                     placer.i_open.valid.eq(opening.valid & clear.ready),
                     clear.valid.eq(opening.valid & placer.i_open.ready),
                     opening.ready.eq(placer.i_open.ready & clear.ready)]
        pass_through(m, self, placer, _PLACER_PORTS)
        return m


class ConnectionsReceiver(wiring.Component):
    """The receive path of ``conns`` connections: the TCP engine's chunks in; startup frames
    for the host, and every connection's placements, completions, ends of Reads, Terminate
    requests and other segments out, each naming its connection.

    It chains the :class:`~iwarp_nic.mpa.MpaReceiver` (gather and deframer) and the
    :class:`ConnectionsPlacer` (segment parser and placer, STag table, outstanding Reads).

    Ports
    -----
    i_header, i, i_cmd, o_startup_header, o_startup, o_error :
        The :class:`~iwarp_nic.mpa.MpaReceiver`'s: chunks, the host's ``START`` and ``FPDUS``,
        the startup frames, a connection's deframing failure (its FPDUs then stop, and so does
        its placement, without a Terminate request of the placer's).
    i_open, o_started, i_push, count_conn, count, i_write, i_check, o_check, o_ask_receive,
    i_receive, o_place, o_data, o_complete, o_read_done, o_fault, o_header, o_payload,
    bad_fpdu, bad_fpdu_conn :
        The :class:`ConnectionsPlacer`'s (``i_open`` before the connection's ``FPDUS``).

    The placer's payload FIFO holds ``ring_bytes`` octets, more than the largest ULPDU the
    gather takes (:attr:`max_ulpdu`). Throughput and latency: the MpaReceiver's, then the
    :class:`ConnectionsPlacer`'s.
    """

    def __init__(self, data_bytes, *, conns=16, ring_bytes=4096, max_chunk=1460,
                 stag_entries=4096, pd_bits=16, ord_depth=32):
        self.data_bytes = check_data_bytes(data_bytes)
        self._mpa = MpaReceiver(data_bytes, conns=conns, ring_bytes=ring_bytes,
                                max_chunk=max_chunk)
        self._placement = ConnectionsPlacer(
            data_bytes, conns=conns, fifo_beats=-(-ring_bytes // data_bytes),
            stag_entries=stag_entries, pd_bits=pd_bits, ord_depth=ord_depth)
        self.conns = conns
        self.max_ulpdu = self._mpa.max_ulpdu
        mpa, placement_ports = self._mpa.signature.members, self._placement.signature.members
        super().__init__({
            **{name: mpa[name] for name in _MPA_PORTS},
            **{name: placement_ports[name] for name in _PLACEMENT_PORTS},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mpa, m.submodules.placement = mpa, placement = self._mpa, self._placement
        pass_through(m, self, mpa, _MPA_PORTS)
        pass_through(m, self, placement, _PLACEMENT_PORTS)
        wiring.connect(m, mpa.o, placement.i)
        return m


def _checked_headers(m, rtr, placer, conns):
    """The RTR check's headers into the placer through a register slice: the placer's ready
    would otherwise chain back through the check (its memories read at the header's
    connection) into the parser and the deframer. The placer spends two cycles at least on a
    header (it takes it, then decides), so a one-entry slice loses nothing."""
    m.submodules.checked = checked = HalfRateSlice(with_conn(SegmentHeader, conns))
    wiring.connect(m, rtr.o, checked.i)
    wiring.connect(m, checked.o, placer.i_header)


def _share_lookups(m, receiver, placer, table):
    """The table's checks shared by the placer and ``receiver``'s ``i_check``/``o_check``
    (the request responder's), taking turns (:class:`~.stag.LookupArbiter`)."""
    m.submodules.lookups = lookups = LookupArbiter(pd_bits=table.pd_bits)
    wiring.connect(m, placer.o_lookup, lookups.i_a)
    wiring.connect(m, lookups.o_a, placer.i_lookup)
    wiring.connect(m, wiring.flipped(receiver.i_check), lookups.i_b)
    wiring.connect(m, lookups.o_b, wiring.flipped(receiver.o_check))
    wiring.connect(m, lookups.o_check, table.i_check)
    wiring.connect(m, table.o_check, lookups.i_check)


#: The placer's ports a :class:`ConnectionsPlacer` passes through.
_PLACER_PORTS = ("o_ask_receive", "i_receive", "o_place", "o_data", "o_complete",
                 "o_read_done", "o_fault", "o_header", "o_payload", "bad_fpdu", "bad_fpdu_conn")
#: The ports a :class:`ConnectionsReceiver` passes through: the MpaReceiver's, and the
#: ConnectionsPlacer's but its input.
_MPA_PORTS = ("i_header", "i", "i_cmd", "o_startup_header", "o_startup", "o_error")
#: The OutstandingTable's ports a :class:`ConnectionsPlacer` passes through (the requester's).
_OUTSTANDING_PORTS = ("i_push", "count_conn", "count")
_PLACEMENT_PORTS = ("i_open", "o_started", *_OUTSTANDING_PORTS, "i_write", "i_check", "o_check",
                    *_PLACER_PORTS)

"""The send rings of the TCP offload engine: every connection's unacknowledged and unsent bytes.

RFC 9293 section 3.3.1 (the send sequence space): the byte with sequence number ``s`` of
connection ``c`` is kept, until it is acknowledged, at ring offset ``s mod ring_bytes``, so a
retransmission reads it again by its sequence number. Which bytes are free, written or
acknowledged is the control's bookkeeping; this block only stores and fetches them.
"""

from amaranth import C, Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, lt, mask, select, sub, wrap_add
from ..stream import BeatStream, check_data_bytes
from ..trim import HeadTrim
from .layouts import RingRequest

__all__ = ["TxRing"]


def _rotations(m, value, lanes, amount, unit, name):
    """``value`` (``lanes`` fields of ``unit`` bits) rotated up by ``amount`` lanes: field ``j``
    moves to lane ``(j + amount) mod lanes``."""
    if lanes == 1:
        return value
    return select(m, amount, [value.rotate_left(unit * k) for k in range(lanes)],
                  unit * lanes, name)


class TxRing(wiring.Component):
    """The send buffer of ``conns`` connections: one block RAM, one write port, one read port.

    Byte ``s mod ring_bytes`` of connection ``c``'s ring is byte ``c * ring_bytes +
    (s mod ring_bytes)`` of a memory of ``conns * ring_bytes / data_bytes`` words of
    ``data_bytes`` bytes with a write enable per byte.

    Ports
    -----
    i_write : In(stream.Signature(RingRequest(conns)))
        Store ``length`` (>= 1) bytes at sequence numbers ``seq`` .. ``seq + length - 1``
        (modulo ``ring_bytes``: a write wraps inside its connection's ring).
    i_data : In(BeatStream(data_bytes))
        For each write request, in order, exactly ``length`` bytes as one packet (``last`` on
        its final beat, lane 0 first). Its beats are rotated to the ring's byte alignment and
        each cycle writes one memory word under byte enables; bytes that fall into the next word
        wait in a carry register for the next beat.
    i_read : In(stream.Signature(RingRequest(conns)))
        Fetch ``length`` (>= 1) bytes from sequence number ``seq`` on (wrapping likewise).
    o_data : Out(BeatStream(data_bytes))
        For each read request, in order, those bytes as one packet realigned to lane 0: the
        whole words that hold them are read and the first ``seq mod data_bytes`` bytes dropped by
        :class:`~iwarp_nic.trim.HeadTrim`.
    o_written : Out(stream.Signature(RingRequest(conns)))
        One report per write, in order, once all its bytes are in memory (readable by any
        request taken from then on): the connection, ``seq`` the sequence number after its
        last byte, and its ``length``. A write request waits while two reports are untaken.

    Reads and writes are independent and run at the same time. The caller guarantees that a
    read never asks for bytes not yet written (reported), nor a write overwrites bytes still to
    be read.
    ``conn`` must be below ``conns``; other values address nothing defined.

    Visibility: a write beat stores its word at the end of the cycle it is taken; when the last
    beat's bytes spill into a further word, that word is stored in the next cycle, so a write's
    bytes are all in memory one cycle after its last beat is taken. The read port is not
    transparent: a word read in the same cycle as it is written returns its old bytes. A read
    request taken in a cycle reads its first word in the next cycle at the earliest, so it sees
    every byte stored up to the cycle it is taken in.

    Throughput: writes take one beat per cycle; a request is taken in the cycle of the previous
    packet's last beat, except when that beat spills into a further word, which costs one cycle.
    Reads issue one word per cycle, a new request taken in the cycle of the previous one's last
    word, so packets follow each other without a gap; :class:`~iwarp_nic.trim.HeadTrim` adds one
    cycle when a packet's last output beat is a tail and the next packet starts aligned.
    Latency: the first beat of a read is offered three cycles after its request is taken (two
    at ``data_bytes`` 1, which needs no trim), four when ``seq`` is not word-aligned (the trim
    holds the first word). Back-pressure on ``o_data`` stalls the read pipeline only.
    """

    def __init__(self, data_bytes, conns, ring_bytes):
        check_data_bytes(data_bytes)
        if (not isinstance(ring_bytes, int) or ring_bytes < 4 * data_bytes
                or ring_bytes & (ring_bytes - 1)):
            raise ValueError(f"ring_bytes must be a power of two of at least 4 * data_bytes "
                             f"({4 * data_bytes}), not {ring_bytes!r}")
        RingRequest(conns)                      # validates conns
        self.data_bytes = data_bytes
        self.conns = conns
        self.ring_bytes = ring_bytes
        super().__init__({
            "i_write": In(stream.Signature(RingRequest(conns))),
            "i_data": In(BeatStream(data_bytes)),
            "i_read": In(stream.Signature(RingRequest(conns))),
            "o_data": Out(BeatStream(data_bytes)),
            "o_written": Out(stream.Signature(RingRequest(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        lane_bits = n.bit_length() - 1          # seq bits that pick a lane
        index_bits = (self.ring_bytes // n).bit_length() - 1   # seq bits that pick a ring word
        words = self.conns * self.ring_bytes // n
        m.submodules.mem = mem = Memory(shape=8 * n, depth=words, init=[])
        wport = mem.write_port(granularity=8)
        rport = mem.read_port()
        addr_bits = len(wport.addr)

        def address(conn, index):
            return Cat(index, conn)[:addr_bits]

        def ring_index(seq):
            return seq[lane_bits:lane_bits + index_bits]

        self._write_side(m, n, lane_bits, index_bits, wport, address, ring_index)
        self._read_side(m, n, lane_bits, index_bits, rport, address, ring_index)
        return m

    def _write_side(self, m, n, lane_bits, index_bits, wport, address, ring_index):
        req, beat = self.i_write.payload, self.i_data.payload
        active = Signal()                       # taking the packet's beats
        flush = Signal()                        # storing the spilled bytes of its last beat
        conn = Signal.like(req.conn, name="w_conn")
        # Completed writes, reported once their bytes are all in memory. A request is taken
        # only with room for its report and the one before it.
        m.submodules.written = written = fifo.SyncFIFOBuffered(
            width=RingRequest(self.conns).size, depth=4)
        wiring.connect(m, written.r_stream, wiring.flipped(self.o_written))
        report = Signal(RingRequest(self.conns))
        report_now = Signal()
        m.d.comb += [written.w_data.eq(report), written.w_en.eq(report_now)]
        end = wrap_add(m, req.seq, req.length, 32, "w_end")
        index = Signal(index_bits, name="w_index")
        offset = Signal(lane_bits, name="w_offset") if lane_bits else Const(0, 0)
        carry_data = Signal(8 * n)              # lanes below `offset`: bytes of the next word
        carry_keep = Signal(n)

        rot_data = _rotations(m, beat.data, n, offset, 8, "w_rot_data")
        rot_keep = _rotations(m, beat.keep, n, offset, 1, "w_rot_keep")
        low = select(m, offset, [mask(k) for k in range(n)], n, "w_low") if lane_bits \
            else C(0, 1)
        spill = beat.last & (rot_keep & low).any()

        m.d.comb += [
            wport.addr.eq(address(conn, index)),
            self.i_data.ready.eq(active),
            self.i_write.ready.eq((~active | (self.i_data.valid & beat.last & ~spill))
                                  & lt(written.level, written.depth - 1)),
        ]
        # Reported in the cycle its last word is stored (the report leaves the FIFO a cycle
        # later, when the word is readable), before a request taken now replaces it.
        m.d.comb += report_now.eq(flush | (active & self.i_data.valid & beat.last & ~spill))
        with m.If(flush):
            m.d.comb += [wport.data.eq(carry_data), wport.en.eq(carry_keep)]
            m.d.sync += flush.eq(0)
        with m.Elif(active & self.i_data.valid):
            m.d.comb += [
                wport.data.eq(Cat(*(Mux(low[j], carry_data.word_select(j, 8),
                                        rot_data.word_select(j, 8)) for j in range(n)))),
                wport.en.eq(carry_keep | (rot_keep & ~low)),
            ]
            m.d.sync += [index.eq(add(index, 1)), carry_data.eq(rot_data),
                         carry_keep.eq(rot_keep & low)]
            with m.If(beat.last):
                m.d.sync += [active.eq(0), flush.eq(spill)]
        # After the beat: a request taken now overrides its updates.
        with m.If(self.i_write.valid & self.i_write.ready):
            m.d.sync += [active.eq(1), conn.eq(req.conn), index.eq(ring_index(req.seq)),
                         carry_keep.eq(0), report.conn.eq(req.conn), report.seq.eq(end),
                         report.length.eq(req.length)]
            if lane_bits:
                m.d.sync += offset.eq(req.seq[:lane_bits])

    def _read_side(self, m, n, lane_bits, index_bits, rport, address, ring_index):
        req = self.i_read.payload
        # Stage 0: the request being read, a word address per cycle.
        active = Signal()
        conn = Signal.like(req.conn, name="r_conn")
        index = Signal(index_bits, name="r_index")
        left = Signal(17)                       # words still to read
        first = Signal()                        # the next word is the request's first
        offset = Signal(lane_bits, name="r_offset") if lane_bits else None
        end_keep = Signal(n)                    # keep of the request's last word
        # Stage 1: the word out of the memory, with its place in the packet.
        s1_valid = Signal()
        s1_last = Signal()
        s1_keep = Signal(n)
        s1_first = Signal()
        s1_offset = Signal(lane_bits) if lane_bits else None

        if lane_bits:
            m.submodules.trim = trim = HeadTrim(n, lane_bits)
            wiring.connect(m, trim.o, wiring.flipped(self.o_data))
            sink = trim.i
            # The count travels with the packet's first word: HeadTrim uses it at once when it
            # takes that word, else holds it, so it is offered only until taken.
            count_taken = Signal()
            m.d.comb += [trim.i_count.valid.eq(s1_valid & s1_first & ~count_taken),
                         trim.i_count.payload.eq(s1_offset)]
        else:
            sink = self.o_data
        m.d.comb += [sink.valid.eq(s1_valid), sink.payload.data.eq(rport.data),
                     sink.payload.keep.eq(s1_keep), sink.payload.last.eq(s1_last)]

        advance = ~s1_valid | sink.ready
        issue = advance & active
        final = eq(left, 1)
        m.d.comb += [rport.addr.eq(address(conn, index)), rport.en.eq(advance),
                     self.i_read.ready.eq(~active | (issue & final))]
        with m.If(advance):
            m.d.sync += [s1_valid.eq(active), s1_last.eq(final), s1_first.eq(first),
                         s1_keep.eq(mask(n))]
            if lane_bits:
                m.d.sync += s1_offset.eq(offset)
                m.d.sync += count_taken.eq(0)
            with m.If(final):
                m.d.sync += s1_keep.eq(end_keep)
        if lane_bits:
            with m.Elif(trim.i_count.valid & trim.i_count.ready):
                m.d.sync += count_taken.eq(1)
        with m.If(issue):
            m.d.sync += [index.eq(add(index, 1)), left.eq(sub(left, 1)), first.eq(0)]
            with m.If(final):
                m.d.sync += active.eq(0)

        with m.If(self.i_read.valid & self.i_read.ready):
            # Words: the offset and the bytes, rounded up; the last one's keep reaches the
            # lane of the final byte, (offset + length - 1) mod n.
            # 17-bit operands of one width, for lint.
            span, length = Signal(17), Signal(17)
            m.d.comb += length.eq(req.length)
            if lane_bits:
                start = Signal(17)
                m.d.comb += [start.eq(req.seq[:lane_bits]), span.eq((length + start)[:17])]
            else:
                m.d.comb += span.eq(length)
            m.d.sync += [active.eq(1), first.eq(1), conn.eq(req.conn),
                         index.eq(ring_index(req.seq)),
                         left.eq(add(span, n - 1)[lane_bits:] if lane_bits else span)]
            if lane_bits:
                end = sub(span[:lane_bits], 1)
                m.d.sync += [offset.eq(req.seq[:lane_bits]),
                             end_keep.eq(select(m, end, [mask(k + 1) for k in range(n)], n,
                                                "r_end_keep"))]
            else:
                m.d.sync += end_keep.eq(1)

"""The Reads and atomics outstanding on each of several connections: RFC 5040 sections 4.4 and
5.2 (an RDMA Read Request waits for its Read Response, and Read Responses come in the order of
their Requests), RFC 7306 section 5.2 (so do the Atomic Requests, in one order with the Reads)
and RFC 6581 section 4 (the ORD: at most that many outstanding on a connection).

Outstanding Reads and atomics are answered in order, so a connection's are a FIFO: the
requester appends each as its request is sent, the placer asks for the oldest when an answer
arrives and drops it when the answer is complete. :class:`OutstandingTable` keeps one such FIFO
per connection for the several-connection :class:`~.placement.SegmentPlacer` (its
``o_ask_oldest``, ``i_oldest`` and ``o_retire``), all of them in one block RAM.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import add, is_zero, lt, sub, wrap_add
from ..tcp.layouts import ConnRef, conn_bits, with_conn, without_conn
from .placement import OldestRead, OutstandingRead

__all__ = ["OutstandingTable"]


class OutstandingTable(wiring.Component):
    """One FIFO of up to ``depth`` :data:`~.placement.OutstandingRead` per connection, for
    ``conns`` connections.

    Ports
    -----
    i_push : In(stream.Signature(with_conn(OutstandingRead, conns)))
        A Read or atomic whose request is sent: appended to connection ``conn``'s FIFO. When
        that FIFO is full the push waits (``ready`` low) until a retire frees a place; the
        requester's ORD (at most ``depth``) keeps that from happening.
    i_ask, o_oldest : In(stream.Signature(ConnRef(conns))), Out(stream.Signature(OldestRead))
        One answer per question, in order: connection ``conn``'s oldest entry with
        ``present`` 1, or ``present`` 0 (the other fields then mean nothing) when it has none.
    i_retire : In(stream.Signature(ConnRef(conns)))
        Connection ``conn``'s oldest is done: it is dropped.
    i_clear : In(stream.Signature(ConnRef(conns)))
        Connection ``conn`` is emptied: a new stream takes its slot.
    count_conn, count : In(conn_bits(conns)), Out(bits of depth + 1)
        How many entries connection ``count_conn`` has, combinationally (the requester's ORD
        credit and fences): a retire, clear or push taken in a cycle is counted from the next.

    Order. Each cycle takes at most one of retire, clear and push, in that priority (retire is
    always ready; clear is ready when no retire is offered; push when neither is and its FIFO is
    not full), and besides it a question whenever the answer's register is free. A question
    sees every retire, clear and push taken in an earlier cycle, and not one taken in its own
    cycle: that one is ordered after it. (The placer offers a question only once its retire is
    taken, and a Read is pushed as its request is sent, long before its answer can come.)

    Latency: the answer is offered the cycle after its question is taken; a retire, clear or
    push is seen by a question taken the next cycle. Throughput: a question per cycle and,
    beside it, a retire, clear or push per cycle. Back-pressure: ``i_ask``'s ``ready`` follows
    ``o_oldest``'s (combinationally) while an answer is offered; nothing else waits on an
    output.

    Storage. The entries are one block RAM of ``conns * depth`` words (connection ``c``'s FIFO
    at words ``c * depth`` on), written by a push and read by a question. Each connection's
    ``head`` (the oldest's slot) and ``count`` are a word of a small memory with asynchronous
    reads (distributed RAM on an FPGA, not flip-flops and a ``conns``-way multiplexer): a
    retire, clear or push reads its connection's word, updates it and writes it back in the
    same cycle, and a question reads its connection's from a second read port, so the entry is
    read at once and answered the next cycle. A memory has one write port, hence one retire,
    clear or push per cycle. Like every context memory of the design it is not emptied by a
    reset (it starts empty at configuration): a connection is cleared as its stream takes the
    slot.

    Bad input: a retire of an empty connection, and any operation on a ``conn`` of ``conns``
    or more, is taken and ignored (a question about such a connection is answered with
    ``present`` 0, and its ``count`` is 0).
    """

    def __init__(self, conns, depth=32):
        conn_bits(conns)                    # checks conns
        if (not isinstance(depth, int) or isinstance(depth, bool) or depth < 2
                or depth & (depth - 1) or depth > 1 << 16):
            raise ValueError(f"depth must be a power of two from 2 to 2**16, not {depth!r}")
        self.conns, self.depth = conns, depth
        self._slot_bits = (depth - 1).bit_length()
        super().__init__({
            "i_push": In(stream.Signature(with_conn(OutstandingRead, conns))),
            "i_ask": In(stream.Signature(ConnRef(conns))),
            "o_oldest": Out(stream.Signature(OldestRead)),
            "i_retire": In(stream.Signature(ConnRef(conns))),
            "i_clear": In(stream.Signature(ConnRef(conns))),
            "count_conn": In(conn_bits(conns)), "count": Out(self._slot_bits + 1),
        })

    def elaborate(self, platform):
        m = Module()
        bits = self._slot_bits
        pointers = StructLayout({"head": bits, "count": bits + 1})
        m.submodules.pointers = pointer_mem = Memory(shape=pointers, depth=max(self.conns, 2),
                                                     init=[])
        m.submodules.entries = entry_mem = Memory(shape=OutstandingRead,
                                                  depth=self.conns * self.depth, init=[])
        # op_rd: the connection of this cycle's retire, clear or push; ask_rd: the question's;
        # count_rd: the requester's.
        op_rd, ask_rd, count_rd = (pointer_mem.read_port(domain="comb") for _ in range(3))
        m.d.comb += [count_rd.addr.eq(self.count_conn),
                     self.count.eq(Mux(lt(self.count_conn, self.conns), count_rd.data.count, 0))]
        ptr_wr = pointer_mem.write_port()
        entry_wr, entry_rd = entry_mem.write_port(), entry_mem.read_port()

        retire, clear, push = self.i_retire, self.i_clear, self.i_push
        ask, out = self.i_ask, self.o_oldest

        # One retire, clear or push: its connection's pointers, updated and written back.
        conn = Signal(conn_bits(self.conns))
        with m.If(retire.valid):
            m.d.comb += conn.eq(retire.payload.conn)
        with m.Elif(clear.valid):
            m.d.comb += conn.eq(clear.payload.conn)
        with m.Else():
            m.d.comb += conn.eq(push.payload.conn)
        inside = lt(conn, self.conns)
        now = op_rd.data
        full = now.count[bits]              # count is at most depth
        m.d.comb += [op_rd.addr.eq(conn), ptr_wr.addr.eq(conn),
                     ptr_wr.data.eq(now),
                     entry_wr.addr.eq(Cat(wrap_add(m, now.head, now.count[:bits], bits, "tail"),
                                          conn)),
                     entry_wr.data.eq(without_conn(push.payload, OutstandingRead)),
                     retire.ready.eq(1), clear.ready.eq(~retire.valid)]
        with m.If(retire.valid):
            with m.If(inside & ~is_zero(now.count)):
                m.d.comb += [ptr_wr.en.eq(1), ptr_wr.data.head.eq(add(now.head, 1)),
                             ptr_wr.data.count.eq(sub(now.count, 1))]
        with m.Elif(clear.valid):
            m.d.comb += [ptr_wr.en.eq(inside), ptr_wr.data.count.eq(0)]
        with m.Else():
            m.d.comb += push.ready.eq(~full | ~inside)
            with m.If(push.valid & inside & ~full):
                m.d.comb += [ptr_wr.en.eq(1), entry_wr.en.eq(1),
                             ptr_wr.data.count.eq(add(now.count, 1))]

        # A question: its connection's oldest entry read now, answered from the next cycle.
        free = ~out.valid | out.ready
        present = Signal()
        asked = ask_rd.data
        m.d.comb += [ask.ready.eq(free), ask_rd.addr.eq(ask.payload.conn),
                     entry_rd.addr.eq(Cat(asked.head, ask.payload.conn)),
                     entry_rd.en.eq(ask.valid & free),
                     out.payload.present.eq(present)]
        m.d.comb += [out.payload[name].eq(entry_rd.data[name])
                     for name in OutstandingRead.members]
        with m.If(free):
            m.d.sync += [out.valid.eq(ask.valid),
                         present.eq(lt(ask.payload.conn, self.conns) & ~is_zero(asked.count))]
        return m

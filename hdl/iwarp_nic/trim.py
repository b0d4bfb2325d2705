"""Drop a per-packet number of bytes from the start of each packet of a byte stream.

:class:`HeadTrim` serves the TCP layer: stripping options after the fixed 20-byte header (count
``4 * data_offset - 20``), trimming the already-received part of a retransmitted segment, and
aligning a send-ring read of whole words to the first wanted byte (count ``seq % data_bytes``).
"""

from amaranth import C, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .exact import eq, is_zero, mask, shift_right, sub, wire
from .stream import BeatStream, check_data_bytes

__all__ = ["HeadTrim"]


class HeadTrim(wiring.Component):
    """The packets of ``i`` without their first ``count`` bytes, ``count`` given per packet.

    Ports
    -----
    i_count : In(stream.Signature(unsigned(count_bits)))
        One transfer per packet of ``i``, in the same order: the number of bytes to drop from the
        start of that packet, 0 to ``2**count_bits - 1``. It may be offered before the packet's
        first beat or together with it: a one-count buffer takes it as soon as it is empty (so
        also during the previous packet), and a count offered in the cycle of the first beat is
        used at once (so ``i_count.ready`` depends on ``i.valid``, and ``i.ready`` on
        ``i_count.valid``, as AXI allows). A producer must not wait for its first beat to be
        taken before offering the count.
    i : In(BeatStream(data_bytes, err=err))
        Packets, at least one byte each, following the stream rules of :mod:`iwarp_nic.stream`.
        No beat of a packet is taken before its count is available.
    o : Out(BeatStream(data_bytes, err=err))
        Each packet minus its first ``count`` bytes, realigned so its first kept byte is in
        lane 0, beaten by the stream rules; ``err`` of the input's last beat is on the last
        output beat. ``count`` 0 passes the packet unchanged. A packet with ``count`` >= its
        length produces no output at all, and its ``err`` is lost with it: a consumer that must
        see every bad packet gives counts below the length.

    Whole beats (``count // data_bytes`` of them) are dropped as they arrive; the first kept
    beat is held while ``count % data_bytes`` is not 0, and every later output beat joins the
    held bytes to the head of the next input beat. When a last input beat holds more bytes than
    fit in the output beat it completes, they follow as a tail beat of their own.

    Latency: an output beat is offered the cycle after the input beat that completes it is
    taken; a tail beat one cycle after the output beat before it.

    Throughput: one input beat per cycle while ``o`` is ready and counts come no later than
    their packets' first beats; a tail beat costs the next packet's first beat one cycle, and
    only when that beat itself completes an output beat (``count`` 0). Back-pressure on ``o``
    stalls ``i`` only for beats that complete an output beat and while a tail waits; beats
    that complete none (dropped whole, or the first kept beat when it is held) are taken
    regardless. Input that breaks the stream rules gives undefined output but
    never hangs the block.
    """

    def __init__(self, data_bytes, count_bits, *, err=False):
        check_data_bytes(data_bytes)
        if not isinstance(count_bits, int) or count_bits < 1:
            raise ValueError(f"count_bits must be a positive integer, not {count_bits!r}")
        if not isinstance(err, bool):
            raise TypeError(f"err must be a bool, not {err!r}")
        self.data_bytes = data_bytes
        self.count_bits = count_bits
        self.err = err
        super().__init__({
            "i_count": In(stream.Signature(unsigned(count_bits))),
            "i": In(BeatStream(data_bytes, err=err)),
            "o": Out(BeatStream(data_bytes, err=err)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        lanes = n.bit_length() - 1              # bits of a lane index
        beat_bits = self.count_bits - lanes     # bits of a whole-beat count, if any
        beat, out = self.i.payload, self.o

        # The next count: from the one-count buffer, else straight from i_count.
        held = Signal(self.count_bits)
        held_valid = Signal()
        count = wire(m, Mux(held_valid, held, self.i_count.payload), "count")

        # The packet in progress. With `shift` = count % n bytes to drop from the first kept
        # beat, `rot` = (shift - 1) mod n is the right shift, in lanes, of the window made of
        # the held beat's lanes 1..n-1 and the next beat: shift 0 gives rot = n - 1, the new
        # beat unchanged. `kept` says the first kept beat has been taken.
        body = Signal()
        kept = Signal()
        pending = Signal()                      # the held beat has a tail to send alone
        carry_data = Signal(8 * n)
        carry_keep = Signal(n)
        carry_err = Signal() if self.err else None
        if lanes:
            if beat_bits >= 0:
                rot_new = sub(count[:lanes], 1)
            else:
                # Counts below n / 2: the top bits of (count - 1) mod n are ones for count 0.
                rot_new = Cat(sub(count, 1), is_zero(count).replicate(-beat_bits))
            rot = Signal(lanes)
            rot_now = wire(m, Mux(body, rot, rot_new), "rot_now")
            passes = eq(rot_now, mask(lanes))   # shift 0: beats pass unchanged
        else:
            passes = C(1)
        if beat_bits > 0:
            skip = Signal(beat_bits)            # whole beats still to drop
            skip_now = wire(m, Mux(body, skip, count[lanes:]), "skip_now")
            skipping = ~is_zero(skip_now)
        else:
            skipping = C(0)
        kept_now = body & kept
        joins = ~skipping & (kept_now | passes)  # this beat completes an output beat

        out_free = ~out.valid | out.ready
        have_count = body | held_valid | self.i_count.valid
        # A waiting tail blocks every beat; one leaving this cycle blocks only beats that
        # need the output register themselves.
        m.d.comb += self.i.ready.eq(have_count & Mux(pending, out_free & ~joins,
                                                     ~joins | out_free))
        accept = self.i.valid & self.i.ready
        starts = accept & ~body
        m.d.comb += self.i_count.ready.eq(~held_valid | starts)
        with m.If(self.i_count.valid & self.i_count.ready):
            with m.If(held_valid | ~starts):
                m.d.sync += [held.eq(self.i_count.payload), held_valid.eq(1)]
        with m.Elif(starts):
            m.d.sync += held_valid.eq(0)

        # The window: the held beat's lanes 1..n-1, then the new beat (or nothing, for a tail),
        # shifted right by `rot` lanes (the packet's own, or n - 1 for a first beat that passes).
        if lanes:
            rot_out = wire(m, Mux(body | pending, rot, Const(mask(lanes), lanes)), "rot_out")
            tail_keep = shift_right(m, Cat(beat.keep[1:], C(0, 1)), rot_now, 1, "tail_keep")
            has_tail = beat.last & tail_keep
        else:
            rot_out = Const(0, 0)
            has_tail = C(0)
        new_data = Mux(pending, Const(0, 8 * n), beat.data)
        new_keep = Mux(pending, Const(0, n), beat.keep)
        win_data = shift_right(m, Cat(carry_data[8:], new_data), rot_out, 8, "win_data")
        win_keep = shift_right(m, Cat(carry_keep[1:], new_keep), rot_out, 1, "win_keep")
        last = Mux(pending, 1, beat.last & ~has_tail)

        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
            with m.If(pending | (accept & joins)):
                m.d.sync += [out.payload.data.eq(win_data), out.payload.keep.eq(win_keep),
                             out.payload.last.eq(last), out.valid.eq(1)]
                if self.err:
                    m.d.sync += out.payload.err.eq(Mux(pending, carry_err, beat.err & last))
            with m.If(pending):
                m.d.sync += pending.eq(0)

        with m.If(accept):
            m.d.sync += [body.eq(~beat.last), kept.eq(kept_now | ~skipping)]
            if lanes:
                m.d.sync += rot.eq(rot_now)
            if beat_bits > 0:
                m.d.sync += skip.eq(Mux(skipping, sub(skip_now, 1), skip_now))
            with m.If(~skipping):
                m.d.sync += [carry_data.eq(beat.data), carry_keep.eq(beat.keep),
                             pending.eq(has_tail)]
                if self.err:
                    m.d.sync += carry_err.eq(beat.err)
        return m

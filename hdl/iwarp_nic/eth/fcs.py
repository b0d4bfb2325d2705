"""IEEE 802.3 clause 4 (media access control): the width-generic halves of the MAC.

* :class:`TxFramer`: clause 4.2.3.2 transmit data encapsulation and 4.2.3.3 minimum frame size:
  preamble and SFD (clause 3.2.1-3.2.2), the frame padded to 60 bytes, the frame check sequence
  (clause 3.2.9, CRC-32) appended, and the inter-packet gap (clause 4.2.3.2.1) before the next.
* :class:`RxChecker`: clause 4.2.4.2 receive data decapsulation: FCS check (clause 4.2.4.1.2),
  FCS stripped, frames below the minimum (clause 4.2.4.2.2) or above the maximum length flagged.

The PHY-facing encoders and decoders (GMII in :mod:`.gmii`, XGMII in :mod:`.xgmii`) talk to these
through two plain, cycle-by-cycle (no handshake) records:

* :func:`LineLayout` (TX): ``data`` and ``keep`` for the bytes on the line this cycle, lane 0
  first (keep contiguous from lane 0; preamble, frame and FCS bytes), ``sop`` on the cycle whose
  lane 0 is the first preamble byte. A word with ``keep`` not all ones ends the frame.
* :func:`RunLayout` (RX): ``n`` frame bytes (those after the SFD, FCS included) in ``data`` lanes
  ``0..n-1``, and ``end`` (with ``err`` for a PHY error) on the cycle after the frame's last byte
  or together with it.
"""

import math

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..crc import CRC32Engine
from ..exact import add, eq, gt, lt, mask, select
from ..stream import BeatStream, check_data_bytes

__all__ = ["PREAMBLE", "MIN_FRAME", "MAX_FRAME", "IFG", "LineLayout", "RunLayout", "TxFramer",
           "RxChecker", "check_mac_width"]

#: Seven preamble bytes and the start frame delimiter, in wire order (clause 3.2.1-3.2.2).
PREAMBLE = bytes([0x55] * 7 + [0xD5])
#: The minimum frame, destination address to FCS inclusive (clause 4.4.2: minFrameSize).
MIN_FRAME = 64
#: The maximum untagged frame, destination address to FCS inclusive (clause 3.2.7).
MAX_FRAME = 1518
#: The minimum inter-packet gap in bytes (clause 4.4.2: interPacketGap, 96 bit times).
IFG = 12
_FCS = 4


def check_mac_width(data_bytes):
    """The MAC datapath carries a whole preamble in 8 bytes or less: 1, 2, 4 or 8."""
    check_data_bytes(data_bytes)
    if data_bytes > 8:
        raise ValueError(f"data_bytes of a MAC must be 1, 2, 4 or 8, not {data_bytes}")
    return data_bytes


def LineLayout(data_bytes):
    """One cycle of the TX line: see the module docstring."""
    return data.StructLayout({"data": 8 * data_bytes, "keep": data_bytes, "sop": 1})


def RunLayout(data_bytes):
    """One cycle of received frame bytes: see the module docstring."""
    return data.StructLayout({"data": 8 * data_bytes, "n": range(data_bytes + 1), "end": 1,
                              "err": 1})


def _crc_latency(data_bytes):
    return 3 + data_bytes.bit_length() - 1  # CRC32Engine.latency


def _widen(m, value, width, name):
    """A ``width``-bit Signal equal to the small unsigned ``value`` (a table: Amaranth would
    fold a plain zero-extension back into a narrow operand)."""
    return select(m, value, {j: j for j in range(1 << len(value))}, width, name)


def _by_keep(m, keep, func, width, name):
    """``select`` keyed by a contiguous, non-empty ``keep`` of ``k`` lanes: ``func(k)``."""
    return select(m, keep, {mask(k): func(k) for k in range(1, len(keep) + 1)}, width, name)


def _delay(m, value, cycles, name):
    """``value`` delayed by ``cycles`` registers."""
    for j in range(cycles):
        reg = Signal.like(value, name=f"{name}{j}")
        m.d.sync += reg.eq(value)
        value = reg
    return value


class TxFramer(wiring.Component):
    """Frames without FCS in, the TX line (preamble, frame, padding, FCS, gap) out.

    * ``i``: frames from the destination address on, without FCS. A frame with ``err`` on its
      last beat is sent with its FCS inverted, so every receiver drops it.
    * ``line``: one :func:`LineLayout` record every cycle (no handshake): the line never stalls.
    * Throughput: one beat per cycle while a frame's data goes out. Between frames ``i.ready``
      is low for the preamble (``8 / data_bytes`` cycles), the padding, the FCS bytes that do not
      fit the last beat and the gap: at least :data:`IFG` idle bytes, rounded up to whole words
      (the next preamble always starts in lane 0; no deficit idle count). The next frame's
      preamble follows the gap with no extra cycle.
    * Latency: :attr:`latency` = ``CRC32Engine.latency`` (3 + log2(data_bytes)) cycles plus
      one register from a beat accepted on ``i`` to its bytes on ``line``.
    * Back-pressure and bad input: once a frame's data has started, the source must offer one
      beat per cycle until its last (a packet FIFO in front guarantees that). A cycle with
      ``i.valid`` low mid-frame is an *underrun*: the frame is ended there with an inverted FCS,
      the rest of the source frame is consumed and discarded, and ``underruns`` counts it.
    * ``frames``: frames sent (including bad ones), counted the cycle after a frame's final slot.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_mac_width(data_bytes)
        self.latency = _crc_latency(data_bytes) + 1
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True)),
            "line": Out(LineLayout(data_bytes)),
            "frames": Out(32),
            "underruns": Out(32),
        })

    @staticmethod
    def gap_slots(data_bytes, k):
        """Cycles after a final beat of ``k`` bytes before the next preamble: the FCS bytes that
        spill over, then whole idle words making at least :data:`IFG` bytes of gap."""
        n = data_bytes
        spill = math.ceil((k + _FCS) / n) - 1
        tail_idle = n - (k + _FCS - spill * n)
        return spill + math.ceil(max(0, IFG - tail_idle) / n)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        full = Const(mask(n), n)
        m.submodules.crc = crc = CRC32Engine(n)
        m.d.comb += crc.o.ready.eq(1)

        # Front: one slot per cycle, as it will appear on the line `crc.latency` cycles later.
        s_data = Signal(8 * n)
        s_keep = Signal(n)
        s_sop = Signal()
        s_last = Signal()   # the final beat of frame data (padding included)
        s_err = Signal()
        s_frame = Signal()  # a beat of frame data: it feeds the CRC

        idle, pre_state, data_state, pad_state, gap_state = (1 << j for j in range(5))
        state = Signal(5, init=idle)  # one-hot
        min_data = MIN_FRAME - _FCS
        count = Signal(7)  # frame bytes so far, saturating once min_data are reached
        gap = Signal(range(max(self.gap_slots(n, k) for k in range(1, n + 1)) + 1))
        pre = Signal(range(8 // n + 1))
        frame_err = Signal()
        discard = Signal()  # consuming the rest of a source frame after an underrun

        beat = self.i.payload
        masked = Cat(beat.data.word_select(j, 8) & beat.keep[j].replicate(8) for j in range(n))
        beat_bytes = _by_keep(m, beat.keep, lambda k: k, len(count), "beat_bytes")
        # Lanes of padding the current beat needs to reach min_data bytes (none from there on).
        pad_keep = select(m, count, {**{c: mask(min(min_data - c, n)) for c in range(min_data)},
                                     min_data: 0}, n, "pad_keep")
        pads_more = lt(count, min_data - n)  # a full beat here still leaves it short
        pre_word = select(m, pre, {j: int.from_bytes(PREAMBLE[n * j:n * (j + 1)], "little")
                                   for j in range(8 // n)}, 8 * n, "pre_word")
        final_keep = Signal(n)
        gaps = _by_keep(m, final_keep, lambda k: self.gap_slots(n, k), len(gap), "gaps")

        # `frames` counts a cycle after the frame's final slot, from a register: the counter
        # may be placed far off (by what reads it), and its enable then has a cycle to get there.
        sent = Signal()

        def final(keep, err):
            m.d.comb += [s_last.eq(1), s_err.eq(err), final_keep.eq(keep)]
            m.d.sync += [gap.eq(gaps), count.eq(0), frame_err.eq(0), state.eq(gap_state),
                         sent.eq(1)]

        m.d.sync += sent.eq(0)
        with m.If(sent):
            m.d.sync += self.frames.eq(add(self.frames, 1))

        def pad_or_final(keep, err):
            with m.If(pads_more):
                m.d.sync += [count.eq(add(count, n)), frame_err.eq(err),
                             state.eq(pad_state)]
            with m.Else():
                final(keep, err)

        with m.If(discard):
            m.d.comb += self.i.ready.eq(1)
            with m.If(self.i.valid & beat.last):
                m.d.sync += discard.eq(0)

        with m.If(state[0]):  # idle
            with m.If(self.i.valid & ~discard):
                m.d.comb += [s_data.eq(int.from_bytes(PREAMBLE[:n], "little")), s_keep.eq(full),
                         s_sop.eq(1)]
                m.d.sync += [pre.eq(1), state.eq(pre_state if n < 8 else data_state)]
        with m.Elif(state[1]):  # preamble
            m.d.comb += [s_data.eq(pre_word), s_keep.eq(full)]
            m.d.sync += pre.eq(add(pre, 1))
            with m.If(eq(pre, 8 // n - 1)):
                m.d.sync += state.eq(data_state)
        with m.Elif(state[2]):  # frame data
            m.d.comb += [self.i.ready.eq(1), s_frame.eq(1)]
            with m.If(self.i.valid):
                with m.If(lt(count, min_data)):
                    m.d.sync += count.eq(count + beat_bytes)
                m.d.comb += [s_data.eq(masked), s_keep.eq(beat.keep | pad_keep)]
                with m.If(beat.last):
                    pad_or_final(beat.keep | pad_keep, frame_err | beat.err)
            with m.Else():
                # Underrun: end the frame here, bad, and drop the rest of the source frame.
                m.d.comb += [s_data.eq(0), s_keep.eq(full)]
                m.d.sync += [discard.eq(1),
                             self.underruns.eq(add(self.underruns, 1))]
                pad_or_final(full, 1)
        with m.Elif(state[3]):  # padding
            m.d.comb += [s_data.eq(0), s_keep.eq(pad_keep), s_frame.eq(1)]
            m.d.sync += count.eq(add(count, n))
            with m.If(~pads_more):
                final(pad_keep, frame_err)
        with m.Else():  # the gap
            m.d.sync += gap.eq(gap - 1)
            with m.If(eq(gap, 1)):
                m.d.sync += state.eq(idle)

        m.d.comb += [
            crc.i.valid.eq(s_frame & s_keep.any()),
            crc.i.payload.data.eq(s_data),
            crc.i.payload.keep.eq(s_keep),
            crc.i.payload.last.eq(s_last),
        ]

        # Delay line: the slot reaches its exit in the cycle the CRC of its frame is offered.
        slot = Signal(data.StructLayout({"data": 8 * n, "keep": n, "sop": 1, "last": 1,
                                         "err": 1}))
        m.d.comb += [slot.data.eq(s_data), slot.keep.eq(s_keep), slot.sop.eq(s_sop),
                     slot.last.eq(s_last), slot.err.eq(s_err)]
        out = _delay(m, slot, crc.latency, "slot")

        # Exit: the FCS goes after the final beat's bytes; what does not fit spills over.
        fcs = Signal(32)
        m.d.comb += fcs.eq(crc.o.payload ^ out.err.replicate(32))
        tail = Signal(32)
        tail_n = Signal(range(_FCS + 1))
        with m.If(out.last):
            m.d.sync += [
                self.line.data.eq(out.data | _by_keep(m, out.keep, lambda k: fcs << 8 * k,
                                                      8 * n, "with_fcs")),
                self.line.keep.eq(_by_keep(m, out.keep, lambda k: mask(min(n, k + _FCS)), n,
                                           "fcs_keep")),
                tail.eq(_by_keep(m, out.keep, lambda k: fcs >> 8 * (n - k), 32, "spill")),
                tail_n.eq(_by_keep(m, out.keep, lambda k: max(0, _FCS - (n - k)), len(tail_n),
                                   "spill_n")),
            ]
        with m.Elif(tail_n.any()):
            m.d.sync += [
                self.line.data.eq(tail),
                self.line.keep.eq(select(m, tail_n, {j: mask(min(n, j))
                                                     for j in range(1, _FCS + 1)}, n, "tail_keep")),
            ]
            if n < _FCS:
                rest = add(tail_n, (1 << len(tail_n)) - n)  # tail_n - n
                m.d.sync += [tail.eq(tail >> 8 * n), tail_n.eq(Mux(gt(tail_n, n), rest, 0))]
            else:
                m.d.sync += tail_n.eq(0)
        with m.Else():
            m.d.sync += [self.line.data.eq(out.data), self.line.keep.eq(out.keep)]
        m.d.sync += self.line.sop.eq(out.sop)
        return m


class RxChecker(wiring.Component):
    """Received frame bytes (FCS included) in, frames without FCS and with ``err`` out.

    * ``run``: one :func:`RunLayout` record per cycle from the PHY decoder (no handshake).
    * ``o``: the frame from the destination address on, FCS stripped, one beat per cycle at
      most. ``err`` is set on the last beat of a frame with a bad FCS, a PHY error, fewer than
      :data:`MIN_FRAME` bytes (runt) or more than ``max_frame`` bytes (oversize, FCS included);
      the next layer drops it. A frame of 4 bytes or fewer after the SFD has nothing to deliver:
      it is dropped and counted as a runt.
    * Latency: :attr:`latency` = ``CRC32Engine.latency`` (3 + log2(data_bytes)) cycles from
      the ``run`` cycle that completes a beat to that beat on ``o`` (the last beat is complete
      with the ``end`` record, or one cycle later when the frame's last 4 + ``data_bytes`` bytes
      straddle two beats).
    * Throughput: line rate; runs of ``data_bytes`` bytes every cycle.
    * Back-pressure: none is possible (the line does not stop). A beat offered while
      ``o.ready`` is low is lost and so is the rest of its frame; if part of the frame was
      delivered, a one-byte beat with ``last`` and ``err`` is delivered as soon as ``o.ready``
      allows, so the stream stays well formed. ``overflows`` counts such frames.
    * Counters (32 bits, wrapping), every frame in exactly one of the first five, first match:
      ``phy_errors``, ``runts``, ``oversize``, ``bad_fcs``, ``frames_ok``.

    Parameters
    ----------
    data_bytes : int
        1, 2, 4 or 8.
    max_frame : int
        The longest good frame, destination address to FCS inclusive: 1518 (default), 1522 for
        VLAN tags, up to 16383 for jumbo frames.
    """

    def __init__(self, data_bytes, *, max_frame=MAX_FRAME):
        self.data_bytes = check_mac_width(data_bytes)
        if not isinstance(max_frame, int) or not MIN_FRAME <= max_frame < 1 << 14:
            raise ValueError(f"max_frame must be an integer in {MIN_FRAME}..16383, "
                             f"not {max_frame!r}")
        self.max_frame = max_frame
        self.latency = _crc_latency(data_bytes)
        super().__init__({
            "run": In(RunLayout(data_bytes)),
            "o": Out(BeatStream(data_bytes, err=True)),
            **{name: Out(32) for name in ("frames_ok", "bad_fcs", "runts", "oversize",
                                          "phy_errors", "overflows")},
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        cap = 2 * n + _FCS  # bytes: a beat ready to go, a partial one, and the held-back FCS
        m.submodules.crc = crc = CRC32Engine(n)
        m.d.comb += crc.o.ready.eq(1)

        # Packer: collect runs into beats, always holding back the last 4 bytes seen (the FCS
        # when the frame ends).
        run = self.run
        acc = Signal(8 * cap)
        # acc_n (bytes in acc) is at most n + 4 after every cycle, and with the run's bytes at
        # most cap: a few bits, so that the count and its comparisons, into the enables of
        # acc and the held FCS, are one short carry chain each (on the MAC side's critical
        # path at one byte and 125 MHz).
        count_bits = cap.bit_length()
        acc_n = Signal(count_bits)
        flush = Signal()  # the frame's final beat is in acc, its FCS and flags are held
        held_fcs = Signal(32)
        held_flags = Signal(3)
        seen = Signal(15)  # frame bytes taken so far (delivered or in acc), saturating
        lanes = select(m, run.n, {j: mask(j) for j in range(n + 1)}, n, "run_lanes")
        fresh = Cat(run.data.word_select(j, 8) & lanes[j].replicate(8) for j in range(n))
        combined = Signal(8 * cap)
        m.d.comb += combined.eq(acc | select(m, acc_n, {s: fresh << 8 * s
                                                        for s in range(n + _FCS + 1)},
                                             8 * cap, "placed"))
        total = Signal(count_bits)  # bytes in acc and the run together
        m.d.comb += total.eq(acc_n + _widen(m, run.n, count_bits, "run_n_acc"))
        # At the end of a frame, `total - 4` of them are the payload and 4 the FCS.
        fcs_at = select(m, total, {t: (combined >> 8 * (t - _FCS))[:32]
                                   for t in range(_FCS + 1, cap + 1)}, 32, "fcs_at")
        end_keep = select(m, total, {t: mask(min(n, t - _FCS))
                                     for t in range(_FCS + 1, cap + 1)}, n, "end_keep")
        flush_keep = select(m, acc_n, {j: mask(j) for j in range(1, n + 1)}, n, "flush_keep")
        length = Signal(15)  # the frame with its FCS, at its end: one adder from registers
        m.d.comb += length.eq(seen + _widen(m, run.n, 15, "run_n"))
        flags = Cat(run.err, lt(length, MIN_FRAME), gt(length, self.max_frame))

        b_valid = Signal()
        b = Signal(data.StructLayout({"data": 8 * n, "keep": n, "last": 1, "fcs": 32,
                                      "phy": 1, "runt": 1, "big": 1}))
        tiny = Signal()  # a frame with nothing to deliver: a runt counted here
        b_flags = Cat(b.phy, b.runt, b.big)
        full = Const(mask(n), n)

        with m.If(flush):
            m.d.comb += [b_valid.eq(1), b.data.eq(acc), b.keep.eq(flush_keep), b.last.eq(1),
                         b.fcs.eq(held_fcs), b_flags.eq(held_flags)]
            m.d.sync += [flush.eq(0), acc.eq(0), acc_n.eq(0)]
        with m.Elif(run.end):
            m.d.sync += [acc.eq(0), acc_n.eq(0)]
            with m.If(lt(total, _FCS + 1)):
                m.d.comb += tiny.eq(1)
            with m.Elif(lt(total, n + _FCS + 1)):
                m.d.comb += [b_valid.eq(1), b.data.eq(combined), b.keep.eq(end_keep),
                             b.last.eq(1), b.fcs.eq(fcs_at), b_flags.eq(flags)]
            with m.Else():
                m.d.comb += [b_valid.eq(1), b.data.eq(combined), b.keep.eq(full)]
                m.d.sync += [acc.eq(combined >> 8 * n),
                             acc_n.eq(add(total, (1 << len(total)) - n - _FCS)), flush.eq(1),
                             held_fcs.eq(fcs_at), held_flags.eq(flags)]
        with m.Elif(gt(total, n + _FCS)):
            m.d.comb += [b_valid.eq(1), b.data.eq(combined), b.keep.eq(full)]
            m.d.sync += [acc.eq(combined >> 8 * n), acc_n.eq(add(total, (1 << len(total)) - n))]
        with m.Else():
            m.d.sync += [acc.eq(combined), acc_n.eq(total)]

        with m.If(flush | run.end):
            m.d.sync += seen.eq(0)
        with m.Elif(lt(seen, (1 << 15) - n)):
            m.d.sync += seen.eq(length)

        m.d.comb += [
            crc.i.valid.eq(b_valid),
            crc.i.payload.data.eq(b.data),
            crc.i.payload.keep.eq(b.keep),
            crc.i.payload.last.eq(b.last),
        ]

        # Delay line to the CRC result, then the verdict on the last beat.
        out_valid = _delay(m, b_valid, crc.latency, "beat_valid")
        out = _delay(m, b, crc.latency, "beat")
        bad_fcs = crc.o.payload != out.fcs
        late_runt = Signal()
        tiny_seen = Signal()  # `tiny` a cycle later: the counter stays out of the length's path
        m.d.sync += tiny_seen.eq(tiny)
        with m.If(tiny_seen & late_runt):
            m.d.sync += self.runts.eq(add(self.runts, 2))
        with m.Elif(tiny_seen | late_runt):
            m.d.sync += self.runts.eq(add(self.runts, 1))
        verdict = Signal(data.StructLayout({"data": 8 * n, "keep": n, "last": 1, "err": 1}))
        m.d.comb += [verdict.data.eq(out.data), verdict.keep.eq(out.keep),
                     verdict.last.eq(out.last),
                     verdict.err.eq(out.last & (out.phy | out.runt | out.big | bad_fcs))]
        with m.If(out_valid & out.last):
            with m.If(out.phy):
                m.d.sync += self.phy_errors.eq(add(self.phy_errors, 1))
            with m.Elif(out.runt):
                m.d.comb += late_runt.eq(1)
            with m.Elif(out.big):
                m.d.sync += self.oversize.eq(add(self.oversize, 1))
            with m.Elif(bad_fcs):
                m.d.sync += self.bad_fcs.eq(add(self.bad_fcs, 1))
            with m.Else():
                m.d.sync += self.frames_ok.eq(add(self.frames_ok, 1))

        # Output with overflow handling: lost frames are cut short and ended with err.
        abort = Signal()     # a one-byte err beat is owed to end a cut frame
        dropping = Signal()  # discarding the rest of a frame that lost a beat
        opened = Signal()    # beats of the current frame were delivered
        with m.If(abort):
            m.d.comb += [self.o.valid.eq(1), self.o.payload.keep.eq(1),
                         self.o.payload.last.eq(1), self.o.payload.err.eq(1)]
            with m.If(self.o.ready):
                m.d.sync += abort.eq(0)
            with m.If(out_valid):  # a beat arriving meanwhile is lost with its frame
                m.d.sync += dropping.eq(~out.last)
                with m.If(~dropping):
                    m.d.sync += self.overflows.eq(add(self.overflows, 1))
        with m.Elif(dropping):
            with m.If(out_valid & out.last):
                m.d.sync += [dropping.eq(0), abort.eq(opened), opened.eq(0)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.eq(verdict)]
            with m.If(out_valid & self.o.ready):
                m.d.sync += opened.eq(~out.last)
            with m.If(out_valid & ~self.o.ready):
                m.d.sync += self.overflows.eq(add(self.overflows, 1))
                with m.If(out.last):
                    m.d.sync += [abort.eq(opened), opened.eq(0)]
                with m.Else():
                    m.d.sync += dropping.eq(1)
        return m

"""IEEE 802.3 clause 46 (reconciliation sublayer and XGMII): the 10 Gb/s MAC, 64 bits at
156.25 MHz.

Clause 46.3: ``TXD<63:0>``/``TXC<7:0>`` and ``RXD<63:0>``/``RXC<7:0>``, here single data rate
(two XGMII transfers per 156.25 MHz cycle, lane 0 first in bits 7..0, ``*C[j]`` marking lane ``j``
a control character). Characters (table 46-3): idle /I/ 0x07, start /S/ 0xFB (lane 0 only on
TX; lane 0 or 4 on RX, clause 46.3.3.2 alignment to a 4-byte column), terminate /T/ 0xFD (any
lane), error /E/ 0xFE. The start replaces the first preamble byte.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .fcs import MAX_FRAME, PREAMBLE, LineLayout, RunLayout
from .mac import MacComponent

__all__ = ["IDLE", "START", "TERMINATE", "ERROR", "XgmiiRx", "XgmiiTx", "XgmiiMac"]

IDLE, START, TERMINATE, ERROR = 0x07, 0xFB, 0xFD, 0xFE
_SFD = PREAMBLE[-1]


def _lane(word, j):
    return word.word_select(j, 8)


class XgmiiRx(wiring.Component):
    """XGMII receive decoder: ``xgmii_rxd/rxc`` to :func:`~.fcs.RunLayout` records.

    A frame starts with /S/ in lane 0 (the SFD in lane 7) or in lane 4 (the SFD in lane 3 of the
    next word; its frame bytes then start in lane 4); other preamble bytes are not checked. An
    /E/ inside the frame stands for a corrupt byte: it is kept (as 0xFE) and the frame gets
    ``err``. The frame ends at the first other control character: /T/ ends it well, anything
    else with ``err``. A start without its SFD is ignored. Latency: two cycles from
    a word on the pins to its frame bytes on ``run``.
    """

    def __init__(self):
        super().__init__({"xgmii_rxd": In(64), "xgmii_rxc": In(8), "run": Out(RunLayout(8))})

    def elaborate(self, platform):
        m = Module()
        d = Signal(64)
        c = Signal(8)
        m.d.sync += [d.eq(self.xgmii_rxd), c.eq(self.xgmii_rxc)]
        run = self.run
        m.d.sync += [run.n.eq(0), run.end.eq(0), run.err.eq(0)]
        err = Signal()  # an /E/ seen earlier in the frame
        in_frame = Signal()  # inside a frame, after its SFD
        start4 = Signal()  # the previous word had /S/ in lane 4

        def frame_bytes(first):
            """Frame bytes from lane ``first`` up to the first control character."""
            lanes = Const(0xFF & ~((1 << first) - 1), 8)
            errors = Cat(c[j] & (_lane(d, j) == ERROR) for j in range(8)) & lanes
            ctrl = c & lanes & ~errors
            n = Signal(range(9), name=f"n{first}")
            stop = Signal(8, name=f"stop{first}")  # the lane of the first control character
            m.d.comb += [n.eq(8 - first), stop.eq(0)]
            for j in reversed(range(first, 8)):
                with m.If(ctrl[j]):
                    m.d.comb += [n.eq(j - first), stop.eq(_lane(d, j))]
            end = ctrl.any()
            bad = err | errors.any()
            m.d.sync += [run.data.eq(d >> 8 * first), run.n.eq(n), run.end.eq(end),
                         run.err.eq(end & (bad | (stop != TERMINATE))), err.eq(bad & ~end)]
            with m.If(end):
                m.d.sync += in_frame.eq(0)

        with m.If(in_frame):
            frame_bytes(0)
        with m.Elif(start4):
            m.d.sync += start4.eq(0)
            with m.If(~c[3] & (_lane(d, 3) == _SFD)):
                m.d.sync += in_frame.eq(1)
                frame_bytes(4)
        with m.Elif(c[0] & (_lane(d, 0) == START) & ~c[7] & (_lane(d, 7) == _SFD)):
            m.d.sync += in_frame.eq(1)
        with m.Elif(c[4] & (_lane(d, 4) == START)):
            m.d.sync += start4.eq(1)
        return m


class XgmiiTx(wiring.Component):
    """XGMII transmit encoder: :func:`~.fcs.LineLayout` records to ``xgmii_txd/txc`` through
    one register. /S/ replaces lane 0 of the ``sop`` word, /T/ follows the frame's last byte
    (in the next word when the last word is full), /I/ fills every other unused lane."""

    def __init__(self):
        super().__init__({"line": In(LineLayout(8)), "xgmii_txd": Out(64),
                          "xgmii_txc": Out(8)})

    def elaborate(self, platform):
        m = Module()
        line = self.line
        in_frame = Signal()  # the previous word was a full word of a frame
        framed = in_frame | line.sop
        m.d.sync += in_frame.eq(framed & (line.keep == 0xFF))
        lanes, ctrl = [], []
        for j in range(8):
            # keep is contiguous from lane 0: lane j is the first free one when keep[j-1] is set.
            first_free = ~line.keep[j] & (line.keep[j - 1] if j else 1)
            is_ctrl = ~line.keep[j] | (line.sop if j == 0 else 0)
            char = Mux(line.keep[j], Mux(line.sop, START, _lane(line.data, j)) if j == 0
                       else _lane(line.data, j),
                       Mux(framed & first_free, TERMINATE, IDLE))
            lanes.append(char)
            ctrl.append(is_ctrl)
        txd = Signal(64, init=int.from_bytes(bytes([IDLE] * 8), "little"))
        txc = Signal(8, init=0xFF)
        m.d.sync += [txd.eq(Cat(lanes)), txc.eq(Cat(ctrl))]
        m.d.comb += [self.xgmii_txd.eq(txd), self.xgmii_txc.eq(txc)]
        return m


class XgmiiMac(MacComponent):
    """The 10 Gb/s MAC: :class:`~.fcs.TxFramer` and :class:`~.fcs.RxChecker` at
    ``data_bytes=8`` behind XGMII. See :class:`~.mac.MacComponent` for the ports and contracts.

    TX starts every frame in lane 0 and rounds the gap up to whole words (at least 12 bytes, /T/
    included; no deficit idle count): a frame of ``L`` bytes (without FCS, ``L >= 60``) takes
    ``1 + ceil((L + 4 + 12) / 8)`` cycles, against ``(L + 24) / 8`` at the ideal line rate (7.85
    against 7.875 bytes per cycle for 1514-byte frames). RX takes any legal start and gap and
    keeps up with a deficit-idle-count source (measured: 7.875). Latency: 8 cycles from a beat
    accepted on ``i`` to its bytes on ``xgmii_txd``; 8 cycles from the word with a frame's last
    FCS byte on ``xgmii_rxd`` to its last beat on ``o`` (9 when those 4 bytes and the last
    beat's straddle a beat boundary).
    """

    def __init__(self, *, max_frame=MAX_FRAME):
        super().__init__(8, XgmiiRx(), XgmiiTx(), max_frame=max_frame)

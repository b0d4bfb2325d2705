"""IEEE 802.3 clause 35 (reconciliation sublayer and GMII): the 1 Gb/s MAC, 8 bits at 125 MHz.

Clause 35.2.2 signals: ``TXD<7:0>``, ``TX_EN``, ``TX_ER`` out of the MAC; ``RXD<7:0>``, ``RX_DV``,
``RX_ER`` into it. A frame is the preamble, SFD, frame bytes and FCS with ``*_EN``/``*_DV`` high;
``RX_ER`` high during a frame reports a PHY error (clause 35.2.2.8).
"""

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .fcs import MAX_FRAME, PREAMBLE, LineLayout, RunLayout
from .mac import MacComponent

__all__ = ["GmiiRx", "GmiiTx", "GmiiMac"]

_SFD = PREAMBLE[-1]


class GmiiRx(wiring.Component):
    """GMII receive decoder: ``gmii_rxd/rx_dv/rx_er`` to :func:`~.fcs.RunLayout` records.

    The inputs are registered, then the bytes after the first SFD (0xD5) while ``rx_dv`` is high
    are frame bytes (preamble bytes before it are not checked, a PHY may shorten the preamble);
    ``end`` follows the cycle ``rx_dv`` falls, with ``err`` if ``rx_er`` was high in between.
    Latency: two cycles from a byte on the pins to it on ``run``.
    """

    def __init__(self):
        super().__init__({"gmii_rxd": In(8), "gmii_rx_dv": In(1), "gmii_rx_er": In(1),
                          "run": Out(RunLayout(1))})

    def elaborate(self, platform):
        m = Module()
        rxd = Signal(8)
        dv = Signal()
        er = Signal()
        m.d.sync += [rxd.eq(self.gmii_rxd), dv.eq(self.gmii_rx_dv), er.eq(self.gmii_rx_er)]
        in_frame = Signal()
        err = Signal()
        m.d.sync += [self.run.n.eq(0), self.run.end.eq(0), self.run.err.eq(0),
                     self.run.data.eq(rxd)]
        with m.If(in_frame):
            with m.If(dv):
                m.d.sync += [self.run.n.eq(1), err.eq(err | er)]
            with m.Else():
                m.d.sync += [self.run.end.eq(1), self.run.err.eq(err), in_frame.eq(0)]
        with m.Elif(dv & (rxd == _SFD)):
            m.d.sync += [in_frame.eq(1), err.eq(er)]
        return m


class GmiiTx(wiring.Component):
    """GMII transmit encoder: :func:`~.fcs.LineLayout` records to ``gmii_txd/tx_en/tx_er``,
    through one register. ``tx_er`` is never driven high (a bad frame goes out with a bad FCS)."""

    def __init__(self):
        super().__init__({"line": In(LineLayout(1)),
                          "gmii_txd": Out(8), "gmii_tx_en": Out(1), "gmii_tx_er": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.gmii_txd.eq(self.line.data), self.gmii_tx_en.eq(self.line.keep[0])]
        return m


class GmiiMac(MacComponent):
    """The 1 Gb/s MAC: :class:`~.fcs.TxFramer` and :class:`~.fcs.RxChecker` at ``data_bytes=1``
    behind GMII. See :class:`~.mac.MacComponent` for the ports and contracts.

    Line rate is one byte per cycle: a frame of ``L`` bytes (without FCS, ``L >= 60``) takes
    ``L + 4 + 8 + 12`` cycles on the line, preamble and gap included, and TX and RX keep that
    pace (measured: 0.9844 bytes per cycle for 1514-byte frames). Latency: 5 cycles from a beat
    accepted on ``i`` to its byte on ``gmii_txd``; 6 cycles from the last FCS byte on
    ``gmii_rxd`` to the frame's last beat on ``o``.
    """

    def __init__(self, *, max_frame=MAX_FRAME):
        super().__init__(1, GmiiRx(), GmiiTx(), max_frame=max_frame)

"""IEEE 802.3 clause 4 (media access control): a MAC, its PHY interface left to a subclass.

Clock domain: a MAC runs entirely in the domain it is elaborated in, ``sync``, which must be the
PHY's clock (GMII ``GTX_CLK``/``RX_CLK`` at 125 MHz, XGMII at 156.25 MHz; RX and TX clocks are
taken to be one, as on FPGA PHY cores with a shared recovered clock). Rename it with
``DomainRenamer("mac")`` where it sits in a design. The crossing into the core clock is an
``amaranth.lib.fifo.AsyncFIFO`` of beats on each side: after ``o`` (it must be drained at the
line rate; a full FIFO is an overflow, see :class:`~.fcs.RxChecker`) and, as a packet FIFO that
releases a frame only once it holds it whole, before ``i`` (see the underrun rule of
:class:`~.fcs.TxFramer`).
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BeatStream
from .fcs import MAX_FRAME, RxChecker, TxFramer, check_mac_width

__all__ = ["MacComponent", "RX_COUNTERS", "TX_COUNTERS"]

#: Counter outputs (32 bits, wrapping) by port name, and the checker/framer port they show.
RX_COUNTERS = {"rx_frames_ok": "frames_ok", "rx_bad_fcs": "bad_fcs", "rx_runts": "runts",
               "rx_oversize": "oversize", "rx_phy_errors": "phy_errors",
               "rx_overflows": "overflows"}
TX_COUNTERS = {"tx_frames": "frames", "tx_underruns": "underruns"}


class MacComponent(wiring.Component):
    """A MAC: ``i`` to the line through :class:`~.fcs.TxFramer`, the line to ``o`` through
    :class:`~.fcs.RxChecker`, and the counters of :data:`RX_COUNTERS` and :data:`TX_COUNTERS`.

    * ``i`` (TX) and ``o`` (RX): ``BeatStream(data_bytes, err=True)``, frames from the
      destination address on, without FCS. Contracts (latency, back-pressure, bad input) are
      those of the framer and the checker, plus the PHY decoder's and encoder's registers.
    * ``rx_phy`` turns PHY pins into a ``run`` record, ``tx_phy`` a ``line`` record into PHY
      pins; their other members become the MAC's own pins, under the same names.
    """

    def __init__(self, data_bytes, rx_phy, tx_phy, *, max_frame=MAX_FRAME):
        self.data_bytes = check_mac_width(data_bytes)
        self.max_frame = max_frame
        self._rx = RxChecker(data_bytes, max_frame=max_frame)
        self._tx = TxFramer(data_bytes)
        self._phys = {"run": rx_phy, "line": tx_phy}
        self._pins = {name: (phy, member)
                      for record, phy in self._phys.items()
                      for name, member in phy.signature.members.items() if name != record}
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(BeatStream(data_bytes, err=True)),
            **{name: member for name, (_, member) in self._pins.items()},
            **{name: Out(32) for name in (*RX_COUNTERS, *TX_COUNTERS)},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = self._rx
        m.submodules.tx = tx = self._tx
        m.submodules.phy_rx = self._phys["run"]
        m.submodules.phy_tx = self._phys["line"]
        for name, (phy, member) in self._pins.items():
            outer, inner = getattr(self, name), getattr(phy, name)
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        m.d.comb += [rx.run.eq(self._phys["run"].run), self._phys["line"].line.eq(tx.line)]
        wiring.connect(m, wiring.flipped(self.i), tx.i)
        wiring.connect(m, rx.o, wiring.flipped(self.o))
        for port, name in RX_COUNTERS.items():
            m.d.comb += getattr(self, port).eq(getattr(rx, name))
        for port, name in TX_COUNTERS.items():
            m.d.comb += getattr(self, port).eq(getattr(tx, name))
        return m

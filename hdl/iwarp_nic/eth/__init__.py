"""The Ethernet MAC (IEEE 802.3 clause 4) for GMII (clause 35, 1G) and XGMII (clause 46, 10G).

* :mod:`.fcs`: the width-generic framer (TX) and checker (RX): preamble, padding, FCS, gap,
  length and FCS checks, counters.
* :mod:`.gmii`, :mod:`.xgmii`: the PHY encoders/decoders and the MACs :class:`GmiiMac`
  (``data_bytes=1``) and :class:`XgmiiMac` (``data_bytes=8``).
* :mod:`.mac`: the common MAC component and where its clock-domain crossing goes.
"""

from .fcs import IFG, MAX_FRAME, MIN_FRAME, PREAMBLE, RxChecker, TxFramer
from .gmii import GmiiMac
from .mac import RX_COUNTERS, TX_COUNTERS, MacComponent
from .xgmii import XgmiiMac

__all__ = ["IFG", "MAX_FRAME", "MIN_FRAME", "PREAMBLE", "RxChecker", "TxFramer", "GmiiMac",
           "XgmiiMac", "MacComponent", "RX_COUNTERS", "TX_COUNTERS"]

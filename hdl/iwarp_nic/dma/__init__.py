"""DMA to host memory: an AXI4 manager (ARM IHI 0022) that writes byte streams to host memory
and reads them back, for several clients.

* :class:`DmaWriter` (:mod:`.write`): write commands and their data as INCR bursts, one
  :data:`DmaDone` per command once every burst is acknowledged;
* :class:`DmaReader` (:mod:`.read`): read commands, each returned as one packet;
* :class:`BurstSplitter` (:mod:`.split`): the 4 KiB / ``max_burst`` cut both use;
* :class:`LanePad` (:mod:`.align`): the write data shifted to its address's lane;
* :class:`WriteArbiter`, :class:`ReadArbiter` (:mod:`.arbiter`): round-robin sharing;
* :class:`DmaMaster` (:mod:`.master`): all of it behind one ``m_axi`` port;
* :class:`ReadReserve` (:mod:`.reserve`): a read client's data buffer, reserved before each
  read, so that a client whose data waits on others never holds up their reads.
"""

from .align import LanePad, StrobeLayout
from .arbiter import ReadArbiter, WriteArbiter
from .master import DmaMaster
from .read import DmaReader
from .reserve import ReadReserve
from .split import DATA_BYTES, BurstLayout, BurstSplitter, DmaCommand, DmaDone
from .write import DmaWriter

__all__ = ["DATA_BYTES", "DmaCommand", "DmaDone", "BurstLayout", "BurstSplitter", "LanePad",
           "StrobeLayout", "DmaWriter", "DmaReader", "WriteArbiter", "ReadArbiter",
           "DmaMaster", "ReadReserve"]

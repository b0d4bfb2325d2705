"""The NIC's host interface, described once: its control/status registers (a
:class:`~.regmap.RegisterMap`), the commands written through its mailbox, and the events it
reports. The gateware (:class:`~.control.HostControl`), the Python driver and the C header
(``python -m iwarp_nic header``) all take them from here.

How the host drives the NIC
---------------------------
* **Commands.** The driver writes a command's fields into ``cmd_args`` (16 words, 512 bits, the
  command's layout from bit 0 of word 0) and then its :class:`CommandOp` into ``command``. The
  write of ``command`` completes once the block the command is for has taken it, so the next
  command may be written at once. Each command is one transfer to one block:

  ==============  =====================================================================
  ``MR_WRITE``    a STag table entry (register, deregister: RFC 5040 section 6, RFC 5042)
  ``CQ_OPEN``     a completion queue made afresh: its ring in host memory
  ``QP_OPEN``     a queue pair's send queue ring, its receive queue ring or the shared
                  receive queue it takes its receives from, and its completion queues
  ``SRQ_OPEN``    a shared receive queue made afresh: its ring in host memory
  ``ENGINE_OPEN`` a connection's iWARP engine context, with what its MPA exchange settled
  ``GATHER``      the MPA receive side: ``START`` (a startup frame comes) or ``FPDUS``
  ``TCP``         a TCP command: listen, connect, close, abort
  ``FRAME``       send ``length`` octets written into ``frame_data`` on a connection (this
                  end's MPA request or reply, RFC 5044 section 7)
  ==============  =====================================================================

* **Doorbells.** ``sq_doorbell``, ``rq_doorbell`` (the index after the last entry posted, per
  queue pair), ``srq_doorbell`` (the same, per shared receive queue) and ``cq_head`` (the
  index after the last entry read, per completion queue).
* **Events.** The NIC queues an :data:`NicEvent` for each TCP event, each startup frame
  received (its octets in ``startup_data``), each connection's first protocol violation, each
  Terminate received and each completion queue entry written. ``event0``/``event1`` show the
  oldest (``kind`` 0 when there is none); writing ``event_pop`` drops it. ``irq_status.event``
  is set as each is queued.
* **Counters.** From ``0x400``, one ``RO`` word each, 32 bits wrapping (:data:`COUNTERS`): the
  counters of the node's MAC (``mac_`` and the names of :data:`~iwarp_nic.eth.RX_COUNTERS`
  and :data:`~iwarp_nic.eth.TX_COUNTERS`: frames received good and dropped by reason, frames
  sent), then its IP stack's (``ip_`` and the names of :data:`~iwarp_nic.ip.stack.COUNTERS`:
  Ethernet, IPv4, ARP and ICMP, each block's packets and drops), then its TCP engine's
  (``tcp_`` and the names of :data:`~iwarp_nic.tcp.engine.COUNTERS`: segments, drops,
  retransmissions, resets), in those lists' order. Each reads a total kept in a memory
  (:class:`~iwarp_nic.counters.CounterMemory`), at most 80 cycles behind its events.
"""

import enum

from amaranth.lib.data import StructLayout

from ..ddp.stag import StagWrite
from ..engine import EngineOpen
from ..eth import RX_COUNTERS as MAC_RX_COUNTERS
from ..eth import TX_COUNTERS as MAC_TX_COUNTERS
from ..ip.stack import COUNTERS as IP_COUNTERS
from ..mpa.gather import GatherCommand
from ..tcp.engine import COUNTERS as TCP_COUNTERS
from ..tcp.layouts import ChunkHeader, Command, conn_bits, with_conn
from .completion import QueuePairCqs
from .regmap import PULSE, RO, RW, W1C, Field, Register, RegisterMap
from .rings import ReceiveRing, Ring

__all__ = ["MAGIC", "VERSION", "MAILBOX_WORDS", "COUNTERS_OFFSET", "COUNTERS", "CommandOp",
           "NicEventKind", "NicEvent", "TcpEventData", "QueuePairRings", "command_layouts",
           "header_layouts", "nic_map"]

#: ``id``: "iWAR" in ASCII.
MAGIC = 0x69574152
VERSION = 1
MAILBOX_WORDS = 16
#: The byte offset of the first counter register.
COUNTERS_OFFSET = 0x400
#: The counter registers in address order, each with the counter port it reads of the NIC's
#: :class:`~iwarp_nic.node.TcpNode` (``{register: port}``; see Counters above).
COUNTERS = {**{f"mac_{name}": name for name in (*MAC_RX_COUNTERS, *MAC_TX_COUNTERS)},
            **{f"ip_{name}": name for name in IP_COUNTERS},
            **{f"tcp_{name}": f"tcp_{name}" for name in TCP_COUNTERS}}


class CommandOp(enum.IntEnum):
    """The commands of ``command`` (0 is none: ignored)."""
    MR_WRITE = 1
    CQ_OPEN = 2
    QP_OPEN = 3
    ENGINE_OPEN = 4
    GATHER = 5
    TCP = 6
    FRAME = 7
    SRQ_OPEN = 8


class NicEventKind(enum.IntEnum):
    """:data:`NicEvent` ``kind``."""
    NONE = 0        # no event queued
    TCP = 1         # code: the TCP EventKind; data: remote_ip, remote_port, local_port
    STARTUP = 2     # code: the gather's ReleaseKind; data: the octets, in startup_data
    FAULT = 3       # code: the Terminate code (layer, etype, ecode) this end sent
    TERMINATE = 4   # code: the Terminate code the peer sent
    CQ = 5          # conn: the completion queue; code: 1 overflow, 2 a write failed


#: One event: ``kind``, the connection (or completion queue) ``conn``, and two fields whose
#: meaning depends on the kind (:class:`NicEventKind`). 128 bits: ``event0`` and ``event1``.
NicEvent = StructLayout({"kind": 4, "conn": 12, "code": 16, "data": 96})

#: The data of a TCP event.
TcpEventData = StructLayout({"remote_ip": 32, "remote_port": 16, "local_port": 16})


def QueuePairRings(conns, cqs, srqs):
    """``QP_OPEN``: queue pair ``conn``'s completion queues, its send queue ring and its
    receives (a ring of its own or one of ``srqs`` shared receive queues: each ring made
    afresh, nothing posted)."""
    return StructLayout({"cqs": QueuePairCqs(conns, cqs), "sq": Ring, "rq": ReceiveRing(srqs)})


def command_layouts(*, conns, cqs, srqs, pd_bits, stag_entries):
    """``{CommandOp: layout}``: what each command's mailbox holds, from bit 0."""
    return {
        CommandOp.MR_WRITE: StagWrite(pd_bits, stag_entries.bit_length() - 1),
        CommandOp.CQ_OPEN: with_conn(Ring, cqs),
        CommandOp.QP_OPEN: QueuePairRings(conns, cqs, srqs),
        CommandOp.ENGINE_OPEN: EngineOpen(conns, pd_bits),
        CommandOp.GATHER: GatherCommand(conns),
        CommandOp.TCP: Command(conns),
        CommandOp.FRAME: ChunkHeader(conns),
        CommandOp.SRQ_OPEN: with_conn(Ring, srqs),
    }


def header_layouts(*, conns, cqs, srqs, pd_bits, stag_entries):
    """``{name: layout}`` of everything in memory or in the mailbox the C header describes:
    the descriptors, the event, and each command's arguments (``cmd_<op>``)."""
    from .formats import Cqe, RqWqe, SqWqe
    layouts = {"sq_wqe": SqWqe, "rq_wqe": RqWqe, "cqe": Cqe, "event": NicEvent,
               "tcp_event": TcpEventData}
    for op, layout in command_layouts(conns=conns, cqs=cqs, srqs=srqs, pd_bits=pd_bits,
                                      stag_entries=stag_entries).items():
        layouts[f"cmd_{op.name.lower()}"] = layout
    return layouts


def nic_map(*, conns, cqs, srqs):
    """The register map of a NIC of ``conns`` queue pairs (connections), ``cqs`` completion
    queues and ``srqs`` shared receive queues."""
    if conn_bits(conns) > 12 or conn_bits(cqs) > 12 or conn_bits(srqs) > 12:
        raise ValueError("at most 4096 queue pairs, completion queues and shared receive "
                         "queues")
    return RegisterMap("iwarp_nic", [
        Register("id", 0x000, RO, doc="MAGIC: 'iWAR'"),
        Register("version", 0x004, RO),
        Register("features", 0x008, RO, [Field("conns", 0, 13), Field("cqs", 13, 13),
                                          Field("data_bytes", 26, 6)]),
        Register("scratch", 0x00C, RW),
        Register("mac", 0x010, RW, width=48, doc="this NIC's Ethernet address"),
        Register("ip", 0x018, RW, doc="this NIC's IPv4 address"),
        Register("hash_key", 0x01C, RW, doc="the TCP connection lookup's hash key"),
        Register("isn_key_lo", 0x020, RW, width=64, doc="the TCP ISN function's key, bits 0-63"),
        Register("isn_key_hi", 0x028, RW, width=64, doc="its bits 64-127"),
        Register("irq_status", 0x030, W1C, [Field("event", 0)], width=1, enable="irq_enable"),
        Register("irq_enable", 0x034, RW, width=1),
        Register("limits", 0x038, RO, [Field("ird", 0, 8), Field("ord", 8, 8),
                                        Field("srqs", 16, 13)],
                 doc="the largest IRD and ORD a queue pair may be opened with; the shared "
                     "receive queues"),
        Register("command", 0x040, PULSE, [Field("op", 0, 8)]),
        Register("frame_data", 0x044, PULSE, doc="four octets of a frame, lane 0 first"),
        Register("event_pop", 0x048, PULSE),
        Register("startup_pop", 0x04C, PULSE),
        Register("event0", 0x050, RO, width=64, doc="NicEvent bits 0-63"),
        Register("event1", 0x058, RO, width=64, doc="NicEvent bits 64-127"),
        Register("startup_data", 0x060, RO, doc="four octets of a startup frame"),
        Register("cmd_args", 0x080, RW, count=MAILBOX_WORDS, stride=4),
        *(Register(name, COUNTERS_OFFSET + 4 * k, RO) for k, name in enumerate(COUNTERS)),
        Register("sq_doorbell", 0x1000, PULSE, [Field("tail", 0, 16)], count=conns, stride=4),
        Register("rq_doorbell", 0x2000, PULSE, [Field("tail", 0, 16)], count=conns, stride=4),
        Register("cq_head", 0x3000, PULSE, [Field("tail", 0, 16)], count=cqs, stride=4),
        Register("srq_doorbell", 0x4000, PULSE, [Field("tail", 0, 16)], count=srqs, stride=4),
    ], addr_width=16)

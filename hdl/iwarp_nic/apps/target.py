"""A memory target's host, planned: what a board with no CPU writes into NicCore's registers
(``iwarp_nic.host.nicmap``) and into its block RAM (``iwarp_nic.axi_ram.AxiRam``, host memory
at address 0) to register memory, accept connections and serve Linux ``rping`` (RFC 5040
sections 5 and 6: work requests and completions; RFC 5044 section 7 and RFC 6581: the MPA
exchange, answered by the host), while any peer may RDMA Write and Read its data region.

Everything here is fixed at elaboration, so the gateware that plays the host is a sequencer
of constant register writes, a few words patched per ping, and a poll of one completion
queue; ``tb/iwarp_tb/target.py`` runs the same plan in Python against the simulated NIC.

:class:`TargetPlan` gives:

* the RAM's layout (:data:`CQ`, :data:`RQ`, :data:`RECV`, :data:`ZEROS`, :data:`SQ`,
  :data:`DATA`) and :meth:`~TargetPlan.image`, its initial contents: four receive entries that
  never change, and the four send entries of a ping (a Read, a fenced 16-octet Send, a Write,
  a 16-octet Send) with every field that does not depend on the ping;
* register programs, lists of ``(offset, word)`` 32-bit register writes: :meth:`~TargetPlan.start`
  (addresses, TCP keys, two memory regions, the completion queue), :meth:`~TargetPlan.arm`
  (the queue pair's rings, its receives, a listen on :data:`RPING_PORT`),
  :meth:`~TargetPlan.accept` (the answer to the peer's MPA Request: ``ENGINE_OPEN``, ``GATHER``
  and the Reply), :meth:`~TargetPlan.end` (close or abort);
* the words a ping patches: :meth:`~TargetPlan.read_patch` (the Read of the client's start
  buffer, from its first 16-octet message) and :meth:`~TargetPlan.write_patch` (the Write into
  its second buffer).

rping's server, per ping: a receive completes with 16 octets naming the client's buffer
(address, STag, size: big-endian); the server Reads that many octets into its buffer, then
Sends 16 octets (rping's client only checks their length); a second receive names the
client's other buffer; the server Writes its buffer there, then Sends 16 octets again.
"""

import enum
from dataclasses import dataclass

from amaranth import Const

from ..host.formats import RQ_WQE_BYTES, SQ_INLINE_OFFSET, SQ_WQE_BYTES, RqWqe, SqFlags, SqWqe
from ..host.nicmap import MAILBOX_WORDS, CommandOp, command_layouts, nic_map
from ..mpa.gather import GatherOp
from ..mpa.negotiate import Rtr
from ..mpa.startup import KEY_REPLY, KEY_REQUEST, MAX_PRIVATE_DATA
from ..tcp.layouts import CommandOp as TcpOp

__all__ = ["RPING_PORT", "CQ", "CQ_LOG2", "RQ", "RQ_LOG2", "RECV", "RECV_BYTES", "ZEROS", "SQ",
           "SQ_LOG2", "Slot", "DATA", "PD", "RECV_STAG", "DATA_STAG", "IRD", "ORD",
           "MAX_ULPDU", "BadRequest", "TargetPlan"]

#: rping's port (librdmacm's example).
RPING_PORT = 7174
#: The RAM's layout (octet offsets; the RAM is host memory from address 0): the completion
#: queue (16 entries of 32 octets), the receive ring (4 entries) and its four 64-octet
#: buffers, 32 zero octets (the Sends' payload, and a Read RTR's header were the target to
#: send one), the send ring (4 entries of 128 octets), and from 4 KiB on the data region.
CQ, CQ_LOG2 = 0x000, 4
RQ, RQ_LOG2 = 0x200, 2
RECV, RECV_BYTES = 0x280, 64
ZEROS = 0x380
SQ, SQ_LOG2 = 0x400, 2
DATA = 0x1000
#: The protection domain of both regions, and their STags (index 1 and 2, key 0x5A): the
#: receive buffers (local write only) and the data region (local write, remote write and
#: read). The rings are in no region: no peer reaches them.
PD = 1
RECV_STAG = 1 << 8 | 0x5A
DATA_STAG = 2 << 8 | 0x5A
#: The IRD the target offers (NicCore's largest: a peer may keep 8 Reads outstanding) and
#: its ORD (it has one Read outstanding at a time).
IRD, ORD = 8, 1
#: The largest ULPDU the target sends: a 1460-octet MSS less MPA's 6 octets (RFC 5044).
MAX_ULPDU = 1454
#: Access rights (``iwarp_nic.ddp.stag``): local write, remote write, remote read.
_LOCAL_WRITE, _REMOTE_WRITE, _REMOTE_READ = 1, 2, 4


class Slot(enum.IntEnum):
    """The send ring's entries, in the order a ping uses them."""
    READ, GO_A, WRITE, GO_B = range(4)


class BadRequest(ValueError):
    """An MPA Request the target does not take (it aborts the connection)."""


def _pack(layout, fields):
    return Const.cast(layout.const(fields)).value


@dataclass(frozen=True)
class TargetPlan:
    """The plan for a NicCore of ``conns``, ``cqs``, ``srqs`` and ``stag_entries`` (its
    register map and command layouts) with ``ram_bytes`` of RAM (a power of two, 8 KiB or
    more)."""

    ram_bytes: int = 32768
    conns: int = 16
    cqs: int = 16
    srqs: int = 4
    stag_entries: int = 4096

    def __post_init__(self):
        if self.ram_bytes < 2 * DATA or self.ram_bytes & (self.ram_bytes - 1):
            raise ValueError(f"ram_bytes must be a power of two of at least {2 * DATA}")

    @property
    def map(self):
        return nic_map(conns=self.conns, cqs=self.cqs, srqs=self.srqs)

    @property
    def layouts(self):
        return command_layouts(conns=self.conns, cqs=self.cqs, srqs=self.srqs, pd_bits=16,
                               stag_entries=self.stag_entries)

    # -- the RAM -------------------------------------------------------------------------

    def image(self):
        """The RAM's first :data:`DATA` octets: zeros, the receive entries and the send
        entries' fixed fields (the Read's sink, the Sends' payload, the Write's source)."""
        ram = bytearray(DATA)
        for k in range(1 << RQ_LOG2):
            entry = _pack(RqWqe, {"addr": RECV + RECV_BYTES * k, "lkey": RECV_STAG,
                                  "length": RECV_BYTES, "sges": 1})
            at = RQ + RQ_WQE_BYTES * k
            ram[at:at + RQ_WQE_BYTES] = entry.to_bytes(RQ_WQE_BYTES, "little")
        go = {"opcode": 3, "length": 16, "source": ZEROS}
        entries = {
            Slot.READ: {"opcode": 1, "flags": SqFlags.SIGNALED, "length": 28,
                        "source": self.slot(Slot.READ) + SQ_INLINE_OFFSET,
                        "sink_stag": DATA_STAG, "sink_to": DATA},
            Slot.GO_A: {**go, "flags": SqFlags.FENCE | SqFlags.SIGNALED},
            Slot.WRITE: {"opcode": 0, "flags": SqFlags.SIGNALED, "source": DATA},
            Slot.GO_B: {**go, "flags": SqFlags.SIGNALED},
        }
        for slot, fields in entries.items():
            value = _pack(SqWqe, fields).to_bytes(SqWqe.size // 8, "little")
            ram[self.slot(slot):self.slot(slot) + len(value)] = value
        header = DATA_STAG.to_bytes(4, "big") + DATA.to_bytes(8, "big")
        inline = self.slot(Slot.READ) + SQ_INLINE_OFFSET
        ram[inline:inline + len(header)] = header
        return bytes(ram)

    @staticmethod
    def slot(slot):
        """The RAM offset of send entry ``slot``."""
        return SQ + SQ_WQE_BYTES * slot

    @staticmethod
    def read_patch(info):
        """``[(offset, 8 octets)]`` that turn the Read entry into the Read of the buffer
        ``info`` names (rping's 16 octets: address, STag, size, big-endian): the entry's
        ``size`` and the Read Request's size, source STag and source offset (RFC 5040 section
        4.4, after its sink STag and offset)."""
        size = info[12:16]
        inline = TargetPlan.slot(Slot.READ) + SQ_INLINE_OFFSET
        return [(TargetPlan.slot(Slot.READ) + 32, DATA_STAG.to_bytes(4, "little")
                 + int.from_bytes(size, "big").to_bytes(4, "little")),
                (inline + 8, DATA.to_bytes(8, "big")[4:] + size),
                (inline + 16, info[8:12] + info[0:4]),
                (inline + 24, info[4:8] + bytes(4))]

    @staticmethod
    def write_patch(info, size):
        """``[(offset, 8 octets)]`` that turn the Write entry into a Write of ``size``
        octets of the data region to the buffer ``info`` names."""
        entry = TargetPlan.slot(Slot.WRITE)
        first = _pack(SqWqe, {"opcode": 0, "flags": SqFlags.SIGNALED, "length": size})
        return [(entry, first.to_bytes(8, "little")),
                (entry + 8, info[8:12][::-1] + bytes(4)),
                (entry + 16, info[0:8][::-1])]

    # -- register programs ---------------------------------------------------------------

    def write(self, name, value, index=0):
        """The writes of ``value`` into register ``name`` (element ``index``), a 32-bit word
        at a time, the low word first (as a 64-bit register wants)."""
        offset, width = self.map.offset(name, index), self.map[name].width
        return [(offset + k // 8, value >> k & 0xFFFF_FFFF) for k in range(0, width, 32)]

    def command(self, op, fields):
        """The writes that issue command ``op`` with ``fields``: its mailbox words, then
        ``command``."""
        layout = self.layouts[op]
        value = _pack(layout, fields)
        words = min(MAILBOX_WORDS, -(-layout.size // 32))
        return [w for k in range(words) for w in self.write("cmd_args", value >> 32 * k
                                                            & 0xFFFF_FFFF, k)] \
            + self.write("command", int(op))

    def start(self, *, mac, ip, keys):
        """Addresses (``mac`` and ``ip`` as integers), the TCP keys (``keys``: 160 random
        bits, RFC 6528), both memory regions, and the completion queue."""
        def region(index, addr, length, access):
            return self.command(CommandOp.MR_WRITE, {"index": index, "entry": {
                "present": 1, "key": 0x5A, "valid": 1, "pd": PD, "access": access,
                "iova": addr, "length": length, "host_addr": addr}})
        return [*self.write("mac", mac), *self.write("ip", ip),
                *self.write("hash_key", keys & 0xFFFF_FFFF),
                *self.write("isn_key_lo", keys >> 32 & (1 << 64) - 1),
                *self.write("isn_key_hi", keys >> 96 & (1 << 64) - 1),
                *region(RECV_STAG >> 8, RECV, RECV_BYTES << RQ_LOG2, _LOCAL_WRITE),
                *region(DATA_STAG >> 8, DATA, self.ram_bytes - DATA,
                        _LOCAL_WRITE | _REMOTE_WRITE | _REMOTE_READ),
                *self.command(CommandOp.CQ_OPEN, {"conn": 0, "base": CQ,
                                                  "log2_entries": CQ_LOG2})]

    def arm(self, conn, port=RPING_PORT):
        """Connection ``conn``'s queue pair (fresh rings on completion queue 0), its four
        receives posted, and a listen on ``port``."""
        return [*self.command(CommandOp.QP_OPEN, {
                    "cqs": {"conn": conn, "send_cq": 0, "recv_cq": 0},
                    "sq": {"base": SQ, "log2_entries": SQ_LOG2},
                    "rq": {"base": RQ, "log2_entries": RQ_LOG2, "srq": 0}}),
                *self.write("rq_doorbell", 1 << RQ_LOG2, conn),
                *self.command(CommandOp.GATHER, {"op": GatherOp.START, "conn": conn}),
                *self.command(CommandOp.TCP, {"op": TcpOp.LISTEN, "conn": conn,
                                              "local_port": port})]

    def accept(self, conn, request):
        """The answer to the MPA Request ``request`` (its octets) on ``conn``: the engine
        opened and the Reply sent. The Reply takes the Request's revision, sets CRCs (RFC
        5044 section 7.1.2: used if either end asks), and with revision 2 and RFC 6581's
        data offers :data:`IRD` and an ORD of at most the peer's IRD, taking the peer's RTR
        (Write, Read, Send: first offered) if it asked for the peer-to-peer model.
        :class:`BadRequest` for a Request it does not take: a wrong key, revision or length,
        markers, or a peer-to-peer Request with no RTR type."""
        if len(request) < 20 or request[:16] != KEY_REQUEST:
            raise BadRequest(f"not an MPA Request: {request[:20].hex()}")
        flags, revision, pd_length = request[16], request[17], int.from_bytes(request[18:20],
                                                                              "big")
        if revision not in (1, 2) or pd_length > MAX_PRIVATE_DATA \
                or len(request) != 20 + pd_length:
            raise BadRequest(f"MPA Request: revision {revision}, PD_Length {pd_length}, "
                             f"{len(request)} octets")
        if flags & 0x80:
            raise BadRequest("MPA Request asks for markers (the target sends none)")
        enhanced = revision == 2 and bool(flags & 0x10)
        if enhanced and pd_length < 4:
            raise BadRequest("MPA Request: S set with no room for RFC 6581's data")
        ird_word = int.from_bytes(request[20:22], "big") if enhanced else 0
        ord_word = int.from_bytes(request[22:24], "big") if enhanced else 0
        peer_ird, p2p = ird_word & 0x3FFF, bool(ird_word & 0x8000)
        rtr, reply_ird, reply_ord = Rtr.NONE, IRD, min(ORD, peer_ird) if enhanced else ORD
        if p2p:
            offered = {Rtr.WRITE: ord_word & 0x8000, Rtr.READ: ord_word & 0x4000,
                       Rtr.SEND: ird_word & 0x4000}
            rtr = next((r for r, on in offered.items() if on), None)
            if rtr is None:
                raise BadRequest("peer-to-peer MPA Request with no RTR type")
            reply_ird |= 0x8000 | (0x4000 if rtr == Rtr.SEND else 0)
            reply_ord |= {Rtr.WRITE: 0x8000, Rtr.READ: 0x4000}.get(rtr, 0)
        data = reply_ird.to_bytes(2, "big") + reply_ord.to_bytes(2, "big") if enhanced else b""
        reply = (KEY_REPLY + bytes([0x40 | (0x10 if enhanced else 0), revision])
                 + len(data).to_bytes(2, "big") + data)
        return [*self.command(CommandOp.ENGINE_OPEN, {
                    "conn": conn, "pd": PD, "ird": IRD, "ord": reply_ord & 0x3FFF,
                    "initiator": 0, "rtr": rtr, "rtr_source": ZEROS, "max_ulpdu": MAX_ULPDU,
                    "crc": 1, "markers": 0}),
                *self.command(CommandOp.GATHER, {"op": GatherOp.FPDUS, "conn": conn,
                                                 "markers": 0, "crc": 1}),
                *[w for k in range(0, len(reply), 4) for w in self.write(
                    "frame_data", int.from_bytes(reply[k:k + 4].ljust(4, b"\0"), "little"))],
                *self.command(CommandOp.FRAME, {"conn": conn, "length": len(reply)})]

    def end(self, conn, *, abort):
        """Close ``conn`` in order (a FIN after the data), or abort it (an RST)."""
        return self.command(CommandOp.TCP, {"op": TcpOp.ABORT if abort else TcpOp.CLOSE,
                                            "conn": conn})

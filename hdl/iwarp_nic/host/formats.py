"""The descriptors the host and the NIC share in host memory: send and receive work queue
entries, and completion queue entries. Their content is RFC 5040's (sections 5 and 6: the
RDMAP messages a work request asks for, and what a completion reports) with RFC 7306's atomics
and Immediate Data; their layout is this project's.

Every descriptor is little-endian: a :class:`~amaranth.lib.data.StructLayout` packs its first
field from bit 0, so bit ``k`` of the layout's value is bit ``k % 8`` of octet ``k // 8`` in
memory (``value.to_bytes(size // 8, "little")``). Each layout is a whole number of 64-bit
words, and each field lies within one aligned word, so C code reads
the fields with the shifts and masks of the exported header (``build/include/iwarp_nic.h``)
and the NIC's DMA takes a descriptor in whole beats.

* :data:`SqWqe`, the first 64 of an entry's 128 octets: one RDMAP message to send. The driver
  maps a verbs work request to one or two entries (a Write with Immediate Data is a Write,
  then an Immediate Data message) as the model's engine would send them. The NIC reads the
  first 64 octets; the last 64 are the driver's: for a Read Request, an Atomic Request or
  Immediate Data, the message's payload is its RDMAP header or its 8 octets of data, which the
  driver writes there in wire order and names by ``source`` like any payload.
* :data:`RqWqe`, 32 octets: a receive buffer for one untagged message (a Send or Immediate
  Data).
* :data:`Cqe`, 32 octets: one completion. ``owner`` is in the last octet written, and is 1
  on the ring's first pass, 0 on its second, and so on: the host sees a new entry without
  reading a register.

A completion names its work request by queue and index (``wqe``), not by a 64-bit ``wr_id``:
the driver keeps the ``wr_id`` of each entry it posted, as other rNIC drivers do.
"""

from amaranth.lib.data import StructLayout

__all__ = ["SqWqe", "SQ_WQE_BYTES", "SQ_INLINE_OFFSET", "RqWqe", "RQ_WQE_BYTES", "Cqe",
           "CQE_BYTES", "SqFlags", "CqeKind", "CqeFlags"]


class SqFlags:
    """Bits of :data:`SqWqe` ``flags``: ``FENCE``, wait until the Reads and atomics before it
    have completed (the verbs' ``IBV_SEND_FENCE``); ``SIGNALED``, report its completion
    (``IBV_SEND_SIGNALED``)."""
    FENCE, SIGNALED = 1, 2


class CqeKind:
    """:data:`Cqe` ``kind``: which queue the work request was posted on."""
    SEND, RECV = 0, 1


class CqeFlags:
    """Bits of :data:`Cqe` ``flags``: the values of the verbs' ``IBV_WC_WITH_IMM`` and
    ``IBV_WC_WITH_INV``, and ``SOLICITED`` (a receive completed by a message with the
    Solicited Event bit)."""
    WITH_IMM, WITH_INV, SOLICITED = 2, 8, 0x80


#: One send queue entry: the message to send, as the :data:`~iwarp_nic.rdmap.WorkRequest`
#: the send queue engine gives the issuer (its ``id`` is the entry's index in its ring).
#:
#: * ``opcode``: the RDMAP opcode (RFC 5040 section 4.3, RFC 7306 section 10.2): Write 0, Read
#:   Request 1, Send 3, Send with Invalidate 4, Send with Solicited Event 5 (and Invalidate 6),
#:   Immediate Data 8 (with Solicited Event 9), Atomic Request 10.
#: * ``length``: its payload octets (for a Read or Atomic Request, its header's 28 or 52;
#:   for Immediate Data, 8); ``source``: the host address of the first of them.
#: * ``stag``, ``to``: a Write's Data Sink STag and Tagged Offset; ``inv_stag``: the STag a Send
#:   with Invalidate invalidates (zero for every other message).
#: * ``sink_stag``, ``sink_to``, ``size``: a Read's or atomic's local sink (an STag of this
#:   end, checked when the answer comes) and its length (8 for an atomic); ``request_id``: an
#:   Atomic Request's Request Identifier, as in its header.
SqWqe = StructLayout({
    "opcode": 4, "_reserved0": 4, "flags": 8, "_reserved1": 16, "length": 32,
    "stag": 32, "inv_stag": 32,
    "to": 64,
    "source": 64,
    "sink_stag": 32, "size": 32,
    "sink_to": 64,
    "request_id": 32, "_reserved3": 32,
    "_reserved4": 64,
})
#: The octets of a send queue entry: :data:`SqWqe`, then the driver's.
SQ_WQE_BYTES = 128
#: Where an entry's driver-owned octets start (for a header or Immediate Data).
SQ_INLINE_OFFSET = SqWqe.size // 8

#: One receive queue entry: ``length`` octets at ``addr`` of the region ``lkey``, its one
#: SGE; with ``sges`` 0 it has no buffer (it takes only empty messages and Immediate Data).
#: It is the :data:`~iwarp_nic.ddp.placement.PostedReceive` the receive queue engine answers
#: with, its ``id`` the entry's index in its ring.
RqWqe = StructLayout({
    "addr": 64,
    "lkey": 32, "length": 32,
    "sges": 8, "_reserved0": 56,
    "_reserved1": 64,
})
RQ_WQE_BYTES = RqWqe.size // 8

#: One completion: the work request ``wqe`` of queue pair ``qp``'s send queue (``kind``
#: :attr:`CqeKind.SEND`) or receive queue (:attr:`CqeKind.RECV`) ended with ``status`` (the
#: verbs' ``enum ibv_wc_status``). A receive's ``byte_len`` is the octets received; its
#: ``imm_data`` and ``invalidated`` are valid with the ``flags`` that say so. The driver makes
#: the verbs' work completion from it and from the work request it posted (its opcode, a
#: Read's length).
Cqe = StructLayout({
    "wqe": 16, "qp": 16, "kind": 8, "status": 8, "flags": 8, "_reserved0": 8,
    "byte_len": 32, "invalidated": 32,
    "imm_data": 64,
    "_reserved1": 63, "owner": 1,
})
CQE_BYTES = Cqe.size // 8

"""The model's STag table mirrored into the gateware's: host addresses, entries and answers.

:class:`HostTable` wraps a model ``MrTable`` (sim/iwarp_model/mr.py), gives each index a host
address, turns a region into the :data:`~iwarp_nic.ddp.stag.Entry` fields the
:class:`~iwarp_nic.ddp.stag.StagTable` stores, and answers a check or an invalidation the way
that table must: a :class:`~iwarp_nic.ddp.stag.Fault` and the host address of the TO.
"""

import random

from iwarp_model.engine import _TAGGED_CODES, _code_of
from iwarp_model.mr import Access, AccessError, MrTable, stag_index, stag_key
from iwarp_model.wire.errors import WireError
from iwarp_model.wire.rdmap import QUEUE_OF, Opcode, Queue, decode_segment
from iwarp_model.wire.terminate import error_code_for
from iwarp_nic.ddp.stag import Fault

__all__ = ["HostTable", "FAULT_OF", "load_table"]

#: The fault the gateware reports for each of the model's exceptions.
FAULT_OF = {"InvalidStag": Fault.INVALID_STAG, "StagInvalidated": Fault.INVALIDATED,
            "StagNotAssociated": Fault.NOT_ASSOCIATED, "TaggedOffsetWrap": Fault.TO_WRAP,
            "BaseBoundsViolation": Fault.BASE_BOUNDS,
            "AccessRightsViolation": Fault.ACCESS_RIGHTS}


class HostTable:
    """A model table of ``size`` indices with ``pds`` protection domains, or the existing
    ``table`` (a device's, with its own PDs); ``rng`` picks each index's host address."""

    def __init__(self, rng: random.Random, size: int = 64, pds: int = 3, *,
                 table: MrTable | None = None):
        self.rng = rng
        self.table = MrTable(size) if table is None else table
        self.pds = [self.table.alloc_pd() for _ in range(pds)]
        self.by_handle = {pd.handle: pd for pd in self.pds}
        self.host = {}

    def entry(self, region=None) -> dict:
        """The gateware entry of ``region`` (None: no region)."""
        if region is None:
            return {"present": 0, "key": 0, "valid": 0, "invalidatable": 0, "pd": 0,
                    "access": 0, "iova": 0, "length": 0, "host_addr": 0}
        return {"present": 1, "key": stag_key(region.stag), "valid": int(region.valid),
                "invalidatable": int(region.invalidatable), "pd": region.pd.handle,
                "access": int(region.access), "iova": region.iova, "length": region.length,
                "host_addr": self.host_addr(region.stag)}

    def host_addr(self, stag):
        """The host address of the region at ``stag``'s index (picked the first time)."""
        return self.host.setdefault(stag_index(stag), self.rng.getrandbits(60))

    def write(self, region, *, removed=False) -> dict:
        """The ``StagWrite`` fields that store ``region`` (or clear its index)."""
        return {"index": stag_index(region.stag),
                "entry": self.entry(None if removed else region)}

    def _pd(self, handle):
        return self.by_handle.get(handle) or object()

    def check(self, stag, to, length, access, pd_handle):
        """(fault, host address of ``to``; 0 with a fault)."""
        try:
            region = self.table.check(stag, to, length, Access(access), self._pd(pd_handle))
        except AccessError as error:
            return FAULT_OF[type(error).__name__], 0
        return Fault.NONE, (self.host_addr(stag) + to - region.iova) % (1 << 64)

    def invalidate(self, stag, pd_handle):
        """(fault, 0), invalidating in the model where there is none."""
        try:
            self.table.invalidate(stag, self._pd(pd_handle))
        except AccessError as error:
            return FAULT_OF[type(error).__name__], 0
        return Fault.NONE, 0

    def receive(self, pd_handle, ulpdus):
        """What the model's engine does with the segments ``ulpdus`` of a stream of PD
        ``pd_handle``, up to the first error: ``(placed, forwarded, fault)``, with ``placed``
        the (host address, payload) of each RDMA Write, ``forwarded`` the (opcode, payload or
        None) of each other segment, and ``fault`` None or the (Terminate code, ULPDU) of the
        first violation (the engine's ``_TAGGED_CODES`` for a failed check). The stream has
        no queue 0 segment and no Read Response: those need posted receives or outstanding
        Reads, and the engine itself as the oracle."""
        placed, forwarded = [], []
        for ulpdu in ulpdus:
            try:
                segment = decode_segment(ulpdu)
            except WireError as error:
                return placed, forwarded, (error_code_for(error), ulpdu)
            assert QUEUE_OF.get(segment.opcode) != Queue.SEND and \
                segment.opcode != Opcode.READ_RESPONSE, "this segment needs the engine"
            if segment.opcode != Opcode.WRITE:
                forwarded.append((int(segment.opcode),
                                  segment.payload if segment.header is None else None))
                continue
            if not segment.payload:
                continue            # the engine neither checks nor places a zero-length Write
            try:
                self.table.check(segment.stag, segment.to, len(segment.payload),
                                 Access.REMOTE_WRITE, self._pd(pd_handle))
            except AccessError as error:
                return placed, forwarded, (_code_of(_TAGGED_CODES, error), ulpdu)
            placed.append((self.check(segment.stag, segment.to, len(segment.payload),
                                      Access.REMOTE_WRITE, pd_handle)[1], segment.payload))
        return placed, forwarded, None


async def load_table(ctx, port, writes):
    """Make the :meth:`HostTable.write` ``writes`` through the gateware table's ``i_write``
    ``port``, one per cycle (the table takes writes at once)."""
    for write in writes:
        ctx.set(port.payload.index, write["index"])
        for name, value in write["entry"].items():
            ctx.set(port.payload.entry[name], value)
        ctx.set(port.valid, 1)
        await ctx.tick()
    ctx.set(port.valid, 0)

"""Protection domains and memory registration: the STag table (RFC 5040 sections 2.1 and 6,
RFC 5041 section 3, RFC 5042 sections 5 and 6).

An STag is 32 bits: a 24-bit *index* into the table and an 8-bit *key* the consumer may change
on each fast registration, so a stale STag (old key) is refused. Every check that RFC 5040/5041
and RFC 5042 require before data is placed or read is made by :meth:`MrTable.check`, which
raises one specific :class:`AccessError` subclass per fault. The caller (DDP placement, the RDMA
Read responder, the atomic responder) turns the fault into the Terminate code of its layer.

Memory is a Python ``bytearray`` (or a writable ``memoryview`` of one) lent by the consumer: the
model's "host memory". Tagged offsets are virtual addresses: an MR covers
``[iova, iova + length)``.
"""

from dataclasses import dataclass, field
from enum import IntFlag

__all__ = ["Access", "ProtectionDomain", "MemoryRegion", "MrTable", "AccessError", "InvalidStag",
           "StagInvalidated", "BaseBoundsViolation", "AccessRightsViolation",
           "StagNotAssociated", "TaggedOffsetWrap", "stag_index", "stag_key", "make_stag"]

INDEX_BITS = 24
KEY_BITS = 8
TO_LIMIT = 1 << 64


class Access(IntFlag):
    """Access rights, with the values of rdma-core's ``IBV_ACCESS_*``."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


def make_stag(index: int, key: int) -> int:
    if not 0 <= index < 1 << INDEX_BITS or not 0 <= key < 1 << KEY_BITS:
        raise ValueError(f"STag index {index} or key {key} out of range")
    return index << KEY_BITS | key


def stag_index(stag: int) -> int:
    return stag >> KEY_BITS


def stag_key(stag: int) -> int:
    return stag & ((1 << KEY_BITS) - 1)


class AccessError(Exception):
    """A tagged access refused before any byte moved. ``stag``, ``to`` and ``length`` say what
    was asked for."""

    def __init__(self, message, *, stag, to, length):
        super().__init__(f"{message} (STag {stag:#010x}, TO {to:#x}, length {length})")
        self.stag, self.to, self.length = stag, to, length


class InvalidStag(AccessError):
    """No such STag: unknown index, or a key that is not the current one."""


class StagInvalidated(InvalidStag):
    """The STag exists but was invalidated (locally or by a Send with Invalidate)."""


class BaseBoundsViolation(AccessError):
    """``[to, to + length)`` is not inside the region."""


class AccessRightsViolation(AccessError):
    """The region does not grant the access asked for."""


class StagNotAssociated(AccessError):
    """The region belongs to another protection domain than the stream's."""


class TaggedOffsetWrap(AccessError):
    """``to + length`` passes 2**64."""


@dataclass(eq=False)
class ProtectionDomain:
    """A protection domain: QPs and MRs may work together only within one PD."""

    handle: int


@dataclass(eq=False)
class MemoryRegion:
    pd: ProtectionDomain
    stag: int
    iova: int
    length: int
    access: Access
    memory: memoryview = field(repr=False)
    valid: bool = True
    #: Fast-registered regions may be invalidated, locally or remotely; reg_mr ones may not.
    invalidatable: bool = False

    @property
    def lkey(self) -> int:
        return self.stag

    @property
    def rkey(self) -> int:
        return self.stag

    def view(self, to: int, length: int) -> memoryview:
        """The bytes at tagged offset ``to`` (already checked)."""
        start = to - self.iova
        return self.memory[start:start + length]


class MrTable:
    """The STag table of one device: registration, fast registration, invalidation, checks.

    ``size`` is the number of indices (the hardware sizes its block RAM the same way).
    """

    def __init__(self, size: int = 1 << 12):
        if not 1 <= size <= 1 << INDEX_BITS:
            raise ValueError(f"MR table size must be 1..2**24, not {size}")
        self.size = size
        self._regions: dict[int, MemoryRegion] = {}  # by index
        self._keys: dict[int, int] = {}  # next key per index
        self._pds = 0

    def alloc_pd(self) -> ProtectionDomain:
        self._pds += 1
        return ProtectionDomain(self._pds)

    def _free_index(self) -> int:
        # Index 0 is never used: an STag of 0 is refused everywhere (RFC 5042 section 5.2 asks
        # that STags be hard to guess; a zero STag is the likeliest guess).
        for index in range(1, self.size):
            if index not in self._regions:
                return index
        raise MemoryError(f"MR table full ({self.size} entries)")

    def _next_key(self, index: int) -> int:
        key = self._keys.get(index, 0x5A)
        self._keys[index] = (key + 0x47) & 0xFF
        return key

    def reg_mr(self, pd: ProtectionDomain, memory, access: Access, *, iova: int = 0,
               length: int = None) -> MemoryRegion:
        """Register ``memory`` (a bytearray or writable memoryview) at ``iova``."""
        view = memoryview(memory).cast("B")
        if view.readonly:
            raise ValueError("registered memory must be writable (a bytearray)")
        length = len(view) if length is None else length
        if not 0 <= length <= len(view) or not 0 <= iova <= TO_LIMIT - length:
            raise ValueError(f"bad region: iova {iova:#x}, length {length}")
        index = self._free_index()
        region = MemoryRegion(pd, make_stag(index, self._next_key(index)), iova, length,
                              Access(access), view[:length])
        self._regions[index] = region
        return region

    def alloc_mr(self, pd: ProtectionDomain) -> MemoryRegion:
        """An invalid, fast-registrable region (``ibv_alloc_mr``); see :meth:`fast_reg`."""
        index = self._free_index()
        region = MemoryRegion(pd, make_stag(index, self._next_key(index)), 0, 0, Access(0),
                              memoryview(bytearray()), valid=False, invalidatable=True)
        self._regions[index] = region
        return region

    def fast_reg(self, stag: int, memory, access: Access, *, iova: int = 0) -> MemoryRegion:
        """Make an allocated, invalid region valid over ``memory`` under STag ``stag`` (whose
        key the consumer chooses, RFC 5040 section 6.2 Fast-Register)."""
        region = self._regions.get(stag_index(stag))
        if region is None or not region.invalidatable:
            raise ValueError(f"STag {stag:#010x} was not allocated for fast registration")
        if region.valid:
            raise ValueError(f"STag {stag:#010x} is still valid: invalidate it first")
        view = memoryview(memory).cast("B")
        if view.readonly or not 0 <= iova <= TO_LIMIT - len(view):
            raise ValueError("fast registration needs writable memory inside the 64-bit TO")
        region.stag, region.iova, region.length = stag, iova, len(view)
        region.access, region.memory, region.valid = Access(access), view, True
        return region

    def invalidate(self, stag: int, pd: ProtectionDomain = None) -> MemoryRegion:
        """Invalidate ``stag`` (local invalidate, or remote by Send with Invalidate, in which
        case ``pd`` is the stream's PD and must match). Raises :class:`AccessError`s."""
        region = self._lookup(stag, 0, 0)
        if pd is not None and region.pd is not pd:
            raise StagNotAssociated("STag belongs to another PD", stag=stag, to=0, length=0)
        if not region.invalidatable:
            raise AccessRightsViolation("STag of a region that cannot be invalidated",
                                        stag=stag, to=0, length=0)
        region.valid = False
        return region

    def dereg_mr(self, region: MemoryRegion) -> None:
        if self._regions.get(stag_index(region.stag)) is not region:
            raise ValueError(f"STag {region.stag:#010x} is not registered")
        del self._regions[stag_index(region.stag)]

    def _lookup(self, stag, to, length) -> MemoryRegion:
        region = self._regions.get(stag_index(stag))
        if region is None or region.stag != stag:
            raise InvalidStag("no region has this STag", stag=stag, to=to, length=length)
        if not region.valid:
            raise StagInvalidated("STag invalidated", stag=stag, to=to, length=length)
        return region

    def check(self, stag: int, to: int, length: int, access: Access,
              pd: ProtectionDomain) -> MemoryRegion:
        """Every check before a tagged access of ``length`` bytes at ``to``, in the order the
        RFCs list them: STag valid and current, same PD, TO wrap, base and bounds, rights."""
        region = self._lookup(stag, to, length)
        if region.pd is not pd:
            raise StagNotAssociated("STag belongs to another PD", stag=stag, to=to,
                                    length=length)
        if to + length > TO_LIMIT:
            raise TaggedOffsetWrap("tagged offset wraps", stag=stag, to=to, length=length)
        if to < region.iova or to + length > region.iova + region.length:
            raise BaseBoundsViolation("outside the region", stag=stag, to=to, length=length)
        if access & ~region.access:
            raise AccessRightsViolation(f"region grants {region.access!r}, not {access!r}",
                                        stag=stag, to=to, length=length)
        return region

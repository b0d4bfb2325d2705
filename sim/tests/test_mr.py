"""The STag table: each RFC 5040/5041/5042 check refuses exactly its own fault."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_model.mr import (
    Access,
    AccessRightsViolation,
    BaseBoundsViolation,
    InvalidStag,
    MrTable,
    StagInvalidated,
    StagNotAssociated,
    TaggedOffsetWrap,
    make_stag,
    stag_index,
    stag_key,
)

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


@pytest.fixture
def table():
    return MrTable(64)


def test_register_and_access(table):
    pd = table.alloc_pd()
    memory = bytearray(range(256)) * 4
    mr = table.reg_mr(pd, memory, RW, iova=0x10000)
    assert stag_index(mr.stag) != 0
    region = table.check(mr.stag, 0x10000 + 100, 50, Access.REMOTE_READ, pd)
    assert bytes(region.view(0x10000 + 100, 50)) == bytes(memory[100:150])
    region.view(0x10000, 4)[:] = b"abcd"
    assert memory[:4] == b"abcd"  # the view writes through to the consumer's memory


@pytest.mark.parametrize("fault, args", [
    (InvalidStag, lambda mr, pd: (mr.stag ^ 0x1, 0x1000, 4, Access.REMOTE_READ, pd)),
    (InvalidStag, lambda mr, pd: (make_stag(63, 0), 0x1000, 4, Access.REMOTE_READ, pd)),
    (BaseBoundsViolation, lambda mr, pd: (mr.stag, 0x0FFF, 4, Access.REMOTE_READ, pd)),
    (BaseBoundsViolation, lambda mr, pd: (mr.stag, 0x1000 + 1021, 4, Access.REMOTE_READ, pd)),
    (AccessRightsViolation, lambda mr, pd: (mr.stag, 0x1000, 4, Access.REMOTE_ATOMIC, pd)),
])
def test_each_fault(table, fault, args):
    pd = table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(1024), RW, iova=0x1000)
    with pytest.raises(fault) as info:
        table.check(*args(mr, pd))
    assert type(info.value) is fault


def test_foreign_pd(table):
    pd, other = table.alloc_pd(), table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(64), RW)
    with pytest.raises(StagNotAssociated):
        table.check(mr.stag, 0, 8, Access.REMOTE_WRITE, other)


def test_to_wrap(table):
    pd = table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(64), RW, iova=(1 << 64) - 64)
    table.check(mr.stag, (1 << 64) - 8, 8, Access.REMOTE_READ, pd)
    with pytest.raises(TaggedOffsetWrap):
        table.check(mr.stag, (1 << 64) - 8, 16, Access.REMOTE_READ, pd)


def test_read_only_region_refuses_write(table):
    pd = table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(64), Access.REMOTE_READ)
    with pytest.raises(AccessRightsViolation):
        table.check(mr.stag, 0, 8, Access.REMOTE_WRITE, pd)


def test_fast_register_invalidate_and_stale_key(table):
    pd = table.alloc_pd()
    mr = table.alloc_mr(pd)
    with pytest.raises(StagInvalidated):
        table.check(mr.stag, 0, 1, Access.REMOTE_READ, pd)
    first = make_stag(stag_index(mr.stag), 0x11)
    table.fast_reg(first, bytearray(32), RW, iova=0x2000)
    table.check(first, 0x2000, 32, Access.REMOTE_WRITE, pd)
    table.invalidate(first, pd)
    with pytest.raises(StagInvalidated):
        table.check(first, 0x2000, 1, Access.REMOTE_READ, pd)
    second = make_stag(stag_index(mr.stag), 0x12)
    table.fast_reg(second, bytearray(32), RW, iova=0x2000)
    with pytest.raises(InvalidStag):  # the old key no longer opens the region
        table.check(first, 0x2000, 1, Access.REMOTE_READ, pd)
    table.check(second, 0x2000, 1, Access.REMOTE_READ, pd)


def test_reg_mr_regions_cannot_be_invalidated_remotely(table):
    pd = table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(8), RW)
    with pytest.raises(AccessRightsViolation):
        table.invalidate(mr.stag, pd)
    with pytest.raises(StagNotAssociated):
        table.invalidate(mr.stag, table.alloc_pd())


def test_table_full_and_bad_arguments():
    table = MrTable(3)
    pd = table.alloc_pd()
    table.reg_mr(pd, bytearray(1), RW)
    table.reg_mr(pd, bytearray(1), RW)
    with pytest.raises(MemoryError):
        table.reg_mr(pd, bytearray(1), RW)
    with pytest.raises(ValueError):
        table.reg_mr(pd, b"read-only", RW)
    with pytest.raises(ValueError):
        MrTable(0)


@given(st.integers(0, (1 << 24) - 1), st.integers(0, 255))
def test_stag_fields(index, key):
    stag = make_stag(index, key)
    assert (stag_index(stag), stag_key(stag)) == (index, key) and stag < 1 << 32


@given(st.integers(0, 2000), st.integers(0, 2000))
def test_bounds_property(to, length):
    table = MrTable(4)
    pd = table.alloc_pd()
    mr = table.reg_mr(pd, bytearray(1000), RW, iova=500)
    inside = 500 <= to and to + length <= 1500
    if inside:
        assert table.check(mr.stag, to, length, Access.REMOTE_READ, pd) is mr
    else:
        with pytest.raises(BaseBoundsViolation):
            table.check(mr.stag, to, length, Access.REMOTE_READ, pd)

"""The model's CRCs: RFC 3720 appendix B.4 vectors, check values, zlib, incremental use."""

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iwarp_model import crc32, crc32c

# RFC 3720 B.4 prints each CRC in wire order (least significant byte first); these are the values.
ISCSI_READ_10_PDU = bytes.fromhex(
    "01c00000 00000000 00000000 00000000 14000000 00000400 00000014 00000018"
    "28000000 00000000 02000000 00000000".replace(" ", ""))

RFC3720_B4 = [
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (ISCSI_READ_10_PDU, 0xD9963A56),
]


@pytest.mark.parametrize("data, expected", RFC3720_B4)
def test_crc32c_rfc3720_vectors(data, expected):
    assert crc32c(data) == expected


def test_check_values():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32(b"123456789") == 0xCBF43926
    assert crc32c(b"") == crc32(b"") == 0


@given(st.binary(max_size=600), st.integers(0, 0xFFFF_FFFF))
def test_crc32_agrees_with_zlib(data, start):
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)


@pytest.mark.parametrize("crc", [crc32c, crc32])
@given(a=st.binary(max_size=200), b=st.binary(max_size=200))
def test_incremental(crc, a, b):
    assert crc(b, crc(a)) == crc(a + b)

"""The two CRC-32s of the stack, as table-driven reference functions.

* :func:`crc32c`: CRC32c (Castagnoli, generator 0x1EDC6F41), the iSCSI digest of RFC 3720
  (section 12.1, examples in appendix B.4) that MPA uses for its FPDU CRC (RFC 5044 section 4).
* :func:`crc32`: the Ethernet frame check sequence of IEEE 802.3 clause 3.2.9 (generator
  0x04C11DB7), the same value as ``zlib.crc32``.

Both are reflected (bit 0 of each byte enters first; the result's bit 0 is the coefficient of
x^31), start from all ones and complement the result. The ``crc`` argument continues a previous
result, so ``crc32c(b, crc32c(a)) == crc32c(a + b)``.
"""

__all__ = ["crc32c", "crc32"]

_MASK = 0xFFFF_FFFF


def _table(poly: int) -> tuple[int, ...]:
    """The 256-entry byte table of the reflected CRC with generator ``poly`` (normal form)."""
    rpoly = int(f"{poly:032b}"[::-1], 2)
    table = []
    for byte in range(256):
        reg = byte
        for _ in range(8):
            reg = (reg >> 1) ^ (rpoly if reg & 1 else 0)
        table.append(reg)
    return tuple(table)


def _crc(table: tuple[int, ...], data: bytes, crc: int) -> int:
    reg = crc ^ _MASK
    for byte in data:
        reg = table[(reg ^ byte) & 0xFF] ^ (reg >> 8)
    return reg ^ _MASK


_CRC32C_TABLE = _table(0x1EDC6F41)
_CRC32_TABLE = _table(0x04C11DB7)


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32c of ``data`` (RFC 3720 B.4: 32 zero bytes give 0x8A9136AA), continuing ``crc``."""
    return _crc(_CRC32C_TABLE, data, crc)


def crc32(data: bytes, crc: int = 0) -> int:
    """IEEE 802.3 CRC-32 (the FCS value, as ``zlib.crc32``) of ``data``, continuing ``crc``."""
    return _crc(_CRC32_TABLE, data, crc)

"""SipHash-2-4, the keyed pseudorandom function of J.-P. Aumasson and D. J. Bernstein,
"SipHash: a fast short-input PRF", INDOCRYPT 2012 (section 2 of the paper).

A 128-bit key ``k0 | k1`` (each half read little-endian from the 16 key bytes) initialises four
64-bit words; the message, padded with zeros to a multiple of 8 bytes minus one and ended by its
length modulo 256, is absorbed one little-endian 64-bit word ``m`` at a time (``v3 ^= m``, c = 2
SipRounds, ``v0 ^= m``); finalisation is ``v2 ^= 0xff``, d = 4 SipRounds and the XOR of the four
words. The result is the 64-bit integer whose little-endian bytes are the paper's 8-byte output.

RFC 6528 keyed initial sequence numbers use it as the function F of the connection 4-tuple (see
the gateware ``iwarp_nic.tcp.isn``).
"""

__all__ = ["siphash24", "sipround"]

_MASK64 = (1 << 64) - 1

# "somepseudorandomlygeneratedbytes", the initialisation constants of section 2.
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """One SipRound (figure 2.1 of the paper) on the four 64-bit state words."""
    v0 = (v0 + v1) & _MASK64
    v2 = (v2 + v3) & _MASK64
    v1 = _rotl(v1, 13) ^ v0
    v3 = _rotl(v3, 16) ^ v2
    v0 = _rotl(v0, 32)
    v2 = (v2 + v1) & _MASK64
    v0 = (v0 + v3) & _MASK64
    v1 = _rotl(v1, 17) ^ v2
    v3 = _rotl(v3, 21) ^ v0
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, message: bytes) -> int:
    """SipHash-2-4 of ``message`` under the 16-byte ``key``, as a 64-bit integer (the output's
    8 bytes read little-endian)."""
    if len(key) != 16:
        raise ValueError(f"SipHash needs a 16-byte key, not {len(key)} bytes")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v = [k0 ^ _INIT[0], k1 ^ _INIT[1], k0 ^ _INIT[2], k1 ^ _INIT[3]]
    padded = message + bytes(7 - len(message) % 8) + bytes([len(message) & 0xFF])
    for offset in range(0, len(padded), 8):
        m = int.from_bytes(padded[offset:offset + 8], "little")
        v[3] ^= m
        for _ in range(2):
            v = list(sipround(*v))
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        v = list(sipround(*v))
    return v[0] ^ v[1] ^ v[2] ^ v[3]

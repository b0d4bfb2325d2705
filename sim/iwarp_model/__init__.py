"""The Python reference model of the iWARP stack (standard library only).

Every gateware block is checked against this model; it runs on its own as a software peer too.
"""

from .crc import crc32, crc32c

__all__ = ["crc32c", "crc32"]

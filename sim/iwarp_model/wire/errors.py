"""Exceptions of the wire codecs (RFC 5044 section 8, RFC 5041 section 7, RFC 5040 section 7).

Every decoder raises one of these instead of returning a half-parsed object. They are specific
enough for a protocol layer to pick the Terminate code to send: :func:`~.terminate.error_code_for`
maps each of them to an entry of the RFC 6580 registry. All are ``ValueError`` subclasses, so
constructors that reject out-of-range field values raise them too.
"""

__all__ = [
    "WireError",
    "TruncatedError",
    "BadFieldError",
    "BadVersionError",
    "BadOpcodeError",
    "BadKeyError",
    "OversizeError",
    "CrcError",
    "MarkerError",
]


class WireError(ValueError):
    """Base class: these bytes are not a valid frame, header or segment.

    ``delivered`` is set by stream decoders (:class:`~.fpdu.Deframer`): the ULPDUs that were
    complete and good before the bad one, within the same call.
    """

    delivered: tuple[bytes, ...] = ()


class TruncatedError(WireError):
    """Fewer bytes than the structure needs: ``needed`` bytes were required, ``got`` present."""

    def __init__(self, what: str, needed: int, got: int):
        super().__init__(f"{what}: needs {needed} bytes, got {got}")
        self.what, self.needed, self.got = what, needed, got


class BadFieldError(WireError):
    """A field (named as in its RFC) holds a value the protocol does not allow.

    ``tagged`` tells, for DDP-level errors, whether the offending DDP segment was tagged (the
    Terminate error type depends on it); ``None`` where it does not apply or is unknown.
    """

    def __init__(self, field: str, value, reason: str = "", *, tagged: bool | None = None):
        text = f"{field}={value!r}" + (f": {reason}" if reason else "")
        super().__init__(text)
        self.field, self.value, self.reason, self.tagged = field, value, reason, tagged


class BadVersionError(BadFieldError):
    """A version field (MPA ``Rev``, DDP ``DV``, RDMAP ``RV``) holds an unsupported value."""


class BadOpcodeError(BadFieldError):
    """An RDMAP opcode (or RFC 7306 atomic subcode) that is reserved or not understood."""


class BadKeyError(BadFieldError):
    """The 16-byte key of an MPA Request/Reply frame is not the expected one."""


class OversizeError(BadFieldError):
    """A length above its limit (private data over 512 bytes, ULPDU over MULPDU, ...)."""


class CrcError(WireError):
    """The CRC32c of an FPDU does not match (RFC 5044 section 8, error 2)."""

    def __init__(self, position: int, expected: int, received: int):
        super().__init__(
            f"FPDU at stream offset {position}: CRC32c {received:#010x}, expected {expected:#010x}"
        )
        self.position, self.expected, self.received = position, expected, received


class MarkerError(WireError):
    """A marker's FPDU pointer disagrees with the FPDU framing (RFC 5044 section 8, error 3)."""

    def __init__(self, position: int, expected: int, received: int):
        super().__init__(
            f"marker at stream offset {position}: FPDUPTR {received:#06x}, expected {expected:#06x}"
        )
        self.position, self.expected, self.received = position, expected, received

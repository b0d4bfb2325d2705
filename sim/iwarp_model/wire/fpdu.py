"""MPA Full Operation Phase: FPDUs, markers and the CRC, RFC 5044 sections 4, 5, 6 and 8.

FPDU (RFC 5044 4.1): ``ULPDU_Length (2) | ULPDU | PAD (0-3, zero) | CRC (4)``. The pad makes
``2 + ULPDU_Length + pad`` a multiple of 4. The CRC field is always present; without CRCs it is
sent as zero and not checked.

Markers (RFC 5044 4.2, 4.3): ``RESERVED (16, zero) | FPDUPTR (16)``, 4 bytes placed in the TCP
stream at every 512th octet counted from SeqStart, the first octet of Full Operation (the first
byte after the MPA Request or Reply): at stream offset ``o`` where ``o % 512 == 0``, whatever the
FPDU and TCP segment boundaries. Stream offsets in this module count from SeqStart, markers
included. A marker inside an FPDU points back to that FPDU's ULPDU_Length field (FPDUPTR is the
distance in stream octets); a marker that falls exactly between two FPDUs belongs to the next one
and holds 0, so the very first FPDU starts with the marker 0x00000000. A receiver ignores the
reserved half and the two low bits of FPDUPTR.

CRC (RFC 5044 4.4): CRC32c over the FPDU from its first octet (its leading marker, if any) to the
end of the pad, markers inside included, and a marker immediately after the pad too; the CRC
field's own bytes (and a marker that splits them) are not covered.

CRC byte order on the wire: the CRC is :func:`iwarp_model.crc32c` (the reflected CRC of RFC 3720)
sent least significant byte first. RFC 5044 says only "in the manner described in [iSCSI]";
RFC 3720 12.1 describes the bit mapping in words that read as most significant first, but its
appendix B.4 examples (32 zero bytes give ``aa 36 91 8a``, the value 0x8A9136AA) are
little-endian, and so are RFC 5044's own worked FPDUs: figure 5 ends in ``52 23 99 83`` and figure
6 in ``84 92 58 98``, which are crc32c values 0x83992352 and 0x98589284 in that order (the tests
rebuild both). Linux siw and Wireshark agree. So: ``crc32c(covered).to_bytes(4, "little")``.

MULPDU (RFC 5044 4.5): the largest ULPDU whose FPDU fits an EMSS, see :func:`mulpdu`.
"""

import struct

from ..crc import crc32c
from .errors import CrcError, MarkerError, OversizeError, WireError

__all__ = [
    "MARKER_INTERVAL",
    "MARKER_SIZE",
    "MAX_ULPDU",
    "MIN_MULPDU",
    "crc_field",
    "pad_length",
    "fpdu_length",
    "wire_length",
    "mulpdu",
    "Framer",
    "Deframer",
]

MARKER_INTERVAL = 512
MARKER_SIZE = 4
HEADER_SIZE = 2  # ULPDU_Length
CRC_SIZE = 4
MAX_ULPDU = 0xFFFF
MIN_MULPDU = 128  # RFC 5044 4.5: MULPDU never shrinks below this
_FPDUPTR_MASK = 0xFFFC  # the two low bits are treated as zero at the receiver
_LENGTH = struct.Struct("!H")
_MARKER = struct.Struct("!HH")


def crc_field(covered: bytes) -> bytes:
    """The 4 CRC octets, in wire order, of an FPDU whose covered octets are ``covered``."""
    return crc32c(covered).to_bytes(CRC_SIZE, "little")


def pad_length(ulpdu_length: int) -> int:
    """Pad octets after a ULPDU of this length."""
    return -(HEADER_SIZE + ulpdu_length) % 4


def fpdu_length(ulpdu_length: int) -> int:
    """Octets of the FPDU without markers: header, ULPDU, pad and CRC."""
    return HEADER_SIZE + ulpdu_length + pad_length(ulpdu_length) + CRC_SIZE


def _check_position(position: int) -> None:
    """Every FPDU and marker is a multiple of 4 octets long, so FPDUs start at such offsets."""
    if position < 0 or position % 4:
        raise ValueError(f"stream offset {position} of an FPDU must be a multiple of 4")


def _raw_span(position: int, logical: int) -> int:
    """Stream octets that ``logical`` FPDU octets take from ``position``, with the markers among
    them (a marker right after the last of them belongs to the next FPDU and is not counted)."""
    span = 0
    while logical > 0:
        if (position + span) % MARKER_INTERVAL == 0:
            span += MARKER_SIZE
        run = min(logical, MARKER_INTERVAL - (position + span) % MARKER_INTERVAL)
        span += run
        logical -= run
    return span


def wire_length(ulpdu_length: int, *, position: int = 0, markers: bool = False) -> int:
    """Stream octets of the FPDU carrying ``ulpdu_length`` octets when it starts at ``position``."""
    _check_position(position)
    n = fpdu_length(ulpdu_length)
    return _raw_span(position, n) if markers else n


def mulpdu(emss: int, *, markers: bool) -> int:
    """MULPDU for an effective MSS (RFC 5044 4.5), never below 128 nor above 65535.

    With markers: ``EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)``, the worst case number of
    markers; without: ``EMSS - (6 + EMSS mod 4)``.
    """
    if emss <= 0:
        raise ValueError(f"EMSS {emss} must be positive")
    overhead = HEADER_SIZE + CRC_SIZE + emss % 4
    if markers:
        overhead += MARKER_SIZE * -(-emss // MARKER_INTERVAL)
    return min(MAX_ULPDU, max(MIN_MULPDU, emss - overhead))


class Framer:
    """Turn ULPDUs into FPDU stream bytes, one FPDU per :meth:`frame` call.

    ``position`` is the stream offset (from SeqStart) of the next octet, kept up to date.
    ``emss`` bounds the ULPDU to :func:`mulpdu`; without it a ULPDU may take the full 65535.
    """

    def __init__(self, *, crc: bool, markers: bool, emss: int | None = None, position: int = 0):
        _check_position(position)
        self.crc, self.markers, self.position = crc, markers, position
        self.max_ulpdu = MAX_ULPDU if emss is None else mulpdu(emss, markers=markers)

    def frame(self, ulpdu: bytes) -> bytes:
        if len(ulpdu) > self.max_ulpdu:
            raise OversizeError("ULPDU_Length", len(ulpdu), f"MULPDU is {self.max_ulpdu}")
        start = self.position
        leading = self.markers and start % MARKER_INTERVAL == 0
        header_at = start + (MARKER_SIZE if leading else 0)
        out = bytearray()
        pos = start

        def marker() -> None:
            nonlocal pos
            pointer = 0 if pos == start else pos - header_at
            if pointer > MAX_ULPDU:
                raise OversizeError("FPDUPTR", pointer, "FPDU too long for markers")
            out.extend(_MARKER.pack(0, pointer))
            pos += MARKER_SIZE

        def emit(chunk: bytes) -> None:
            nonlocal pos
            done = 0
            while done < len(chunk):
                if self.markers and pos % MARKER_INTERVAL == 0:
                    marker()
                run = len(chunk) - done
                if self.markers:
                    run = min(run, MARKER_INTERVAL - pos % MARKER_INTERVAL)
                out.extend(chunk[done : done + run])
                pos += run
                done += run

        emit(_LENGTH.pack(len(ulpdu)) + bytes(ulpdu) + bytes(pad_length(len(ulpdu))))
        if self.markers and pos % MARKER_INTERVAL == 0:
            marker()  # right after the pad: this one is covered by the CRC
        emit(crc_field(bytes(out)) if self.crc else bytes(CRC_SIZE))
        self.position = pos
        return bytes(out)


class Deframer:
    """Recover ULPDUs from FPDU stream bytes delivered in any pieces.

    :meth:`feed` returns the ULPDUs completed by the new bytes, markers stripped, after checking
    the CRC (when ``crc``), then every marker's FPDUPTR (when ``markers``), and the length
    against ``max_ulpdu``. On a bad FPDU it raises the specific :class:`~.errors.WireError`, whose
    ``delivered`` holds the good ULPDUs that preceded it in the same call; as RFC 5044 section 8
    requires, nothing is delivered after an error (every later call raises it again).
    """

    def __init__(
        self, *, crc: bool, markers: bool, position: int = 0, max_ulpdu: int = MAX_ULPDU
    ):
        _check_position(position)
        self.crc, self.markers, self.position, self.max_ulpdu = crc, markers, position, max_ulpdu
        self._buf = bytearray()
        self._need = 0  # stream octets of the FPDU in progress, once its length is known
        self._error: WireError | None = None

    @property
    def buffered(self) -> int:
        """Octets received but not yet part of a delivered FPDU."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise self._error
        self._buf += data
        ulpdus: list[bytes] = []
        try:
            while (ulpdu := self._next()) is not None:
                ulpdus.append(ulpdu)
        except WireError as error:
            error.delivered = tuple(ulpdus)
            self._error = error
            raise
        return ulpdus

    def _next(self) -> bytes | None:
        """The next ULPDU, or None until its FPDU is complete in the buffer."""
        if not self._need:
            head = _raw_span(self.position, HEADER_SIZE) if self.markers else HEADER_SIZE
            if len(self._buf) < head:
                return None
            length = _LENGTH.unpack_from(self._buf, head - HEADER_SIZE)[0]
            if length > self.max_ulpdu:
                raise OversizeError("ULPDU_Length", length, f"at most {self.max_ulpdu}")
            self._need = wire_length(length, position=self.position, markers=self.markers)
        if len(self._buf) < self._need:
            return None
        raw = bytes(self._buf[: self._need])
        logical, markers, crc_at = self._split(raw)
        if self.crc:
            expected = crc32c(raw[:crc_at])
            received = int.from_bytes(logical[-CRC_SIZE:], "little")
            if received != expected:
                raise CrcError(self.position, expected, received)
        self._check_markers(markers)
        del self._buf[: self._need]
        self.position += self._need
        self._need = 0
        length = _LENGTH.unpack_from(logical)[0]
        return bytes(logical[HEADER_SIZE : HEADER_SIZE + length])

    def _split(self, raw: bytes) -> tuple[bytearray, list[tuple[int, int]], int]:
        """FPDU octets without markers, the markers as (stream offset, FPDUPTR), and the index
        in ``raw`` of the CRC field's first octet."""
        if not self.markers:
            return bytearray(raw), [], len(raw) - CRC_SIZE
        logical, markers = bytearray(), []
        crc_logical = len(raw) - CRC_SIZE - MARKER_SIZE * self._markers_within(len(raw))
        crc_at = len(raw)
        index = 0
        while index < len(raw):
            pos = self.position + index
            if pos % MARKER_INTERVAL == 0:
                markers.append((pos, _MARKER.unpack_from(raw, index)[1]))
                index += MARKER_SIZE
                continue
            run = min(len(raw) - index, MARKER_INTERVAL - pos % MARKER_INTERVAL)
            if len(logical) <= crc_logical < len(logical) + run:
                crc_at = index + crc_logical - len(logical)
            logical += raw[index : index + run]
            index += run
        return logical, markers, crc_at

    def _markers_within(self, span: int) -> int:
        first = -self.position % MARKER_INTERVAL
        return 0 if first >= span else 1 + (span - 1 - first) // MARKER_INTERVAL

    def _check_markers(self, markers: list[tuple[int, int]]) -> None:
        start = self.position
        header_at = start + (MARKER_SIZE if start % MARKER_INTERVAL == 0 else 0)
        for pos, pointer in markers:
            expected = 0 if pos == start else pos - header_at
            if pointer & _FPDUPTR_MASK != expected:
                raise MarkerError(pos, expected, pointer)

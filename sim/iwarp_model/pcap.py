"""Classic libpcap capture files (the format tcpdump and Wireshark read), standard library only.

Every transport of the model, and every testbench, records its frames through :class:`PcapWriter`.
Timestamps are nanoseconds (magic 0xA1B23C4D), since simulated links run at 1-10 Gb/s.
"""

import struct

__all__ = ["PcapWriter", "LINKTYPE_ETHERNET", "read_pcap"]

LINKTYPE_ETHERNET = 1
_FCS_PRESENT = 1 << 28  # link-type field: the F bit, with the FCS length (16-bit words) above it
_MAGIC_NS = 0xA1B23C4D


class PcapWriter:
    """Write Ethernet frames to ``path``.

    ``fcs=True`` declares that each frame ends with its 4-byte FCS, so Wireshark checks it instead
    of showing it as trailer bytes. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path, *, fcs=False, snaplen=65535):
        self._file = open(path, "wb")
        linktype = LINKTYPE_ETHERNET | ((_FCS_PRESENT | (2 << 29)) if fcs else 0)
        self._file.write(struct.pack("<IHHiIII", _MAGIC_NS, 2, 4, 0, 0, snaplen, linktype))
        self.frames = 0

    def write(self, frame: bytes, time_ns: int) -> None:
        seconds, ns = divmod(int(time_ns), 1_000_000_000)
        self._file.write(struct.pack("<IIII", seconds, ns, len(frame), len(frame)))
        self._file.write(frame)
        self.frames += 1

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_pcap(path):
    """``(linktype, [(time_ns, frame), ...])`` from a file :class:`PcapWriter` wrote."""
    with open(path, "rb") as f:
        raw = f.read()
    magic, _major, _minor, _zone, _sig, _snap, linktype = struct.unpack_from("<IHHiIII", raw)
    if magic != _MAGIC_NS:
        raise ValueError(f"{path}: not a nanosecond little-endian pcap (magic {magic:#x})")
    frames, offset = [], 24
    while offset < len(raw):
        seconds, ns, caplen, _length = struct.unpack_from("<IIII", raw, offset)
        offset += 16
        frames.append((seconds * 1_000_000_000 + ns, raw[offset:offset + caplen]))
        offset += caplen
    return linktype, frames

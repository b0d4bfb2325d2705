# amaranth: UnusedElaboratable=no
"""StartupReader and StartupWriter against the model's ``MpaFrameReader`` and
``MpaFrame.encode`` at 1, 8 and 64 bytes.

Random Requests and Replies (Rev 1 and 2, every flag, with and without the RFC 6581 data, every
IRD/ORD and RTR combination, private data of 0 to 508 octets) are followed by FPDU octets and
cut into chunks of random sizes, as TCP delivers them; the gateware reads them with random
idles and stalls. It must give the frame the model decodes (every field), its private data,
and every octet after the frame, in order. Bad frames (a wrong key octet anywhere, Rev 0 or 3,
PD_Length over 512, the S flag with Rev 1 or with PD_Length below 4) must give the error the
model raises, and nothing after it. The writer, given a frame's fields and private data, must
write the octets of the model's encoding, and tshark must read its Request and Reply at the
head of a TCP stream with those fields.
"""

import random
import struct

import pytest

from iwarp_model.wire.errors import (
    BadFieldError,
    BadKeyError,
    BadVersionError,
    OversizeError,
    WireError,
)
from iwarp_model.wire.mpa import EnhancedData, MpaFrame, MpaFrameReader
from iwarp_nic.mpa.startup import StartupReader, StartupWriter
from iwarp_tb.amsim import run
from iwarp_tb.startup import ERROR_OF, fields
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    recv_packets,
    send,
    send_packets,
    tcp_chunks,
    until_quiet,
)

IDLE = STALL = 0.25


def random_frame(rng, reply):
    revision = rng.choice([1, 2])
    enhanced = None
    if revision == 2 and rng.random() < 0.7:
        p2p = rng.random() < 0.5
        enhanced = EnhancedData(rng.randrange(1 << 14), rng.randrange(1 << 14), p2p,
                                *(p2p and rng.random() < 0.5 for _ in range(3)))
    room = 512 - (4 if enhanced else 0)
    length = rng.choice([0, 1, room, rng.randrange(room + 1)])
    return MpaFrame(reply=reply, markers=rng.random() < 0.5, crc=rng.random() < 0.5,
                    reject=reply and rng.random() < 0.3, revision=revision, enhanced=enhanced,
                    private_data=rng.randbytes(length))


def expect(reply, chunks):
    """The model's reading: (frame or the error class, private data, octets after it)."""
    reader = MpaFrameReader(reply=reply)
    for k, chunk in enumerate(chunks):
        try:
            frame = reader.feed(chunk)
        except WireError as error:
            return type(error), b"", []
        if frame is not None:
            rest = [reader.leftover] if reader.leftover else []
            return frame, frame.private_data, rest + list(chunks[k + 1:])
    raise AssertionError("the frame never completed")


def simulate(n, reply, octets, *, seed):
    rng = random.Random(seed)
    chunks = tcp_chunks(rng, octets, sizes=(1, 3, 20, 64, 700, 1460))
    frame, private, rest = expect(reply, chunks)
    dut = StartupReader(n)
    got = {}
    outputs = [dut.o_frame, dut.o_private, dut.o]

    async def source(ctx):
        ctx.set(dut.reply, reply)
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), chunks, n,
                           rng=random.Random(seed + 1), idle=IDLE)
        await until_quiet(ctx, outputs, 200)

    run(dut, source, monitors=[
        collector(got, "frames", dut.o_frame, rng=random.Random(seed + 2), stall=STALL),
        collector(got, "private", dut.o_private, data_bytes=n, rng=random.Random(seed + 3),
                  stall=STALL),
        collector(got, "rest", dut.o, data_bytes=n, rng=random.Random(seed + 4), stall=STALL)],
        name=f"mpa_startup_w{n}")
    (got_frame,) = got["frames"]
    assert [bytes(p) for p in got["private"]] == ([private] if private else [])
    assert [bytes(p) for p in got["rest"]] == rest
    if isinstance(frame, type):
        assert got_frame["error"] == ERROR_OF[frame]
        return frame
    assert got_frame == fields(frame)
    return frame


@pytest.mark.parametrize("n", [1, 8, 64])
def test_frames(n):
    """Requests and Replies of every kind, then FPDU octets: read as the model reads them."""
    rng = random.Random(n)
    for k in range(6 if n == 1 else 12):
        reply = bool(k % 2)
        octets = random_frame(rng, reply).encode() + rng.randbytes(rng.choice([0, 1, 900]))
        assert isinstance(simulate(n, reply, octets, seed=k), MpaFrame)


def _bad(rng, kind, reply):
    good = random_frame(rng, reply)
    octets = bytearray(good.encode())
    if kind == "key":
        at = rng.randrange(16)
        octets[at] ^= 1 << rng.randrange(8)
    elif kind == "revision":
        octets[17] = rng.choice([0, 3, 255])
    elif kind == "pd_length":
        octets[18:20] = struct.pack("!H", rng.choice([513, 600, 65535]))
    elif kind == "s_rev1":
        octets[16] |= 0x10
        octets[17] = 1
    else:
        assert kind == "s_short"
        pd = rng.randrange(4)
        octets = bytearray(octets[:20] + rng.randbytes(pd))
        octets[16] |= 0x10
        octets[17] = 2
        octets[18:20] = struct.pack("!H", pd)
    return bytes(octets) + rng.randbytes(100)


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("kind, error", [("key", BadKeyError), ("revision", BadVersionError),
                                         ("pd_length", OversizeError),
                                         ("s_rev1", BadFieldError), ("s_short", BadFieldError)])
def test_bad_frames(n, kind, error):
    """Each error the model finds in a startup frame, and nothing passed on after it."""
    rng = random.Random(sum(map(ord, kind)) + n)
    for k in range(2):
        reply = bool(k % 2)
        assert simulate(n, reply, _bad(rng, kind, reply), seed=k) is error


def test_wrong_kind():
    """A Request where a Reply is expected (and the reverse) is a wrong key."""
    rng = random.Random(5)
    for reply in (False, True):
        octets = random_frame(rng, not reply).encode()
        assert simulate(8, reply, octets, seed=int(reply)) is BadKeyError


def write(n, reply, frames, *, seed):
    """The packets the writer gives for ``frames``."""
    rng = random.Random(seed)
    dut = StartupWriter(n)
    got = {}

    async def source(ctx):
        ctx.set(dut.reply, reply)
        bus = AmaranthBus(ctx)
        for frame in frames:
            written = {k: v for k, v in fields(frame).items() if k not in ("error", "pd_length")}
            await send(bus, StreamPort.amaranth(dut.i_frame), [written])
            if frame.private_data:
                await send_packets(bus, StreamPort.amaranth(dut.i_private),
                                   [frame.private_data], n, rng=rng, idle=IDLE)

    async def sink(ctx):
        got["frames"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                           len(frames), n, rng=random.Random(seed + 1),
                                           stall=STALL)

    run(dut, source, sink, name=f"mpa_startup_writer_w{n}")
    return [bytes(p) for p in got["frames"]]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_writer(n):
    """Frames of every kind written as the model encodes them, back to back."""
    rng = random.Random(40 + n)
    for reply in (False, True):
        frames = [random_frame(rng, reply) for _ in range(4 if n == 1 else 8)]
        assert write(n, reply, frames, seed=n) == [f.encode() for f in frames]


@pytest.mark.tshark
@pytest.mark.parametrize("n", [1, 8, 64])
def test_tshark_writer(tmp_path, n):
    """tshark reads the writer's Request and Reply at the head of a TCP stream with the fields
    they were given (Wireshark 4.0 shows S as a reserved bit and the RFC 6581 data as private
    data)."""
    from iwarp_model.capture import StreamCapture
    from iwarp_tb.tshark import decode, fields

    rng = random.Random(70 + n)
    for k in range(3):
        request, reply = random_frame(rng, False), random_frame(rng, True)
        (request_octets,) = write(n, False, [request], seed=k)
        (reply_octets,) = write(n, True, [reply], seed=k + 10)
        path = tmp_path / f"startup_w{n}_{k}.pcap"
        with StreamCapture(path, ("10.0.0.1", 40000), ("10.0.0.2", 5000)) as capture:
            capture.sent(request_octets)
            capture.received(reply_octets)
        root, _ = decode(path)
        assert len(fields(root, "iwarp_mpa.key.req")) == len(fields(root, "iwarp_mpa.key.rep")) == 1
        for name, get in (("marker_flag", lambda f: int(f.markers)),
                          ("crc_flag", lambda f: int(f.crc)),
                          ("rej_flag", lambda f: int(f.reject)),
                          ("res", lambda f: f"0x{0x10 if f.enhanced else 0:02x}"),
                          ("rev", lambda f: f.revision), ("pdlength", lambda f: f.pd_length)):
            shown = [f.get("show") for f in fields(root, f"iwarp_mpa.{name}")]
            assert shown == [str(get(request)), str(get(reply))], name
        private = [bytes.fromhex(f.get("show").replace(":", ""))
                   for f in fields(root, "iwarp_mpa.privatedata")]
        assert private == [o[20:] for o in (request_octets, reply_octets) if len(o) > 20]

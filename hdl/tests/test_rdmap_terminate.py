# amaranth: UnusedElaboratable=no
"""TerminateEmitter against the model, bit-exact, at widths 1, 8 and 64.

For every RFC 6580 code and offending segments of every kind (none, each RDMAP opcode tagged
and untagged, Read Requests long enough for the R copy or not, segments shorter than their DDP
header, a first octet with T set on an untagged opcode), the ULPDU must be the model's
``Segment(TERMINATE, msn=msn, header=Terminate.for_error(code, offending)).encode()`` and
``o_length`` its length; random idles and stalls.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_model.wire.rdmap import Opcode, ReadRequest, Segment
from iwarp_model.wire.terminate import ErrorCode, Terminate
from iwarp_nic.rdmap import TerminateEmitter
from iwarp_nic.rdmap.terminate import OFFENDING_BYTES
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send
from iwarp_tb.tshark import decode, fields

IDLE = STALL = 0.3


def offending_segments(rng):
    """Offending ULPDUs of every shape (None: the error is about no segment)."""
    read = Segment(Opcode.READ_REQUEST, msn=rng.getrandbits(32),
                   header=ReadRequest(1, 2, 3, 4, 5)).encode()
    out = [None, b"", read, read[:45], read[:18], read[:17], read + b"junk"]
    out += [Segment(Opcode.WRITE, rng.randbytes(k), stag=7, to=9).encode()[:14 + k]
            for k in (0, 3)]
    out.append(Segment(Opcode.WRITE, b"", stag=7, to=9).encode()[:13])
    out += [Segment(Opcode.SEND, rng.randbytes(40), msn=5).encode(),
            Segment(Opcode.SEND_INVALIDATE, rng.randbytes(9), inv_stag=3).encode()]
    out.append(bytes([0x80 | 0x41]) + rng.randbytes(60))       # T set, garbage after
    out.append(bytes([0x41, 0x41]) + rng.randbytes(50))        # untagged, RDMAP opcode 1
    return out


def cases(rng):
    out = []
    for code in ErrorCode:
        for offending in offending_segments(rng):
            out.append((code, offending, rng.getrandbits(32)))
    # A code outside the registry, sent as given.
    out.append(((0, 1, 0x77), offending_segments(rng)[2], 1))
    return out


def expected(code, offending, msn):
    terminate = (Terminate.for_error(code, offending) if isinstance(code, ErrorCode)
                 else Terminate(*code, len(offending), offending[:18], offending[18:46]))
    return Segment(Opcode.TERMINATE, msn=msn, header=terminate).encode()


def request(code, offending, msn):
    layer, etype, ecode = code.value if isinstance(code, ErrorCode) else code
    head = (offending or b"")[:OFFENDING_BYTES]
    return {"layer": layer, "etype": etype, "ecode": ecode, "msn": msn,
            "offending": int.from_bytes(head + bytes(OFFENDING_BYTES - len(head)), "little"),
            "offending_length": len(offending or b"")}


def simulate(n, items, *, seed, idle=IDLE, stall=STALL):
    dut = TerminateEmitter(n)
    got = {}

    async def source(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                   [request(*item) for item in items], rng=random.Random(seed), idle=idle)

    async def sink(ctx):
        got["ulpdus"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                           len(items), n, rng=random.Random(seed + 1),
                                           stall=stall)

    async def lengths(ctx):
        got["lengths"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_length),
                                    len(items), rng=random.Random(seed + 2), stall=stall)

    run(dut, source, sink, lengths, name=f"rdmap_terminate_w{n}")
    return [bytes(p) for p in got["ulpdus"]], [t["data"] for t in got["lengths"]]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_against_model(n):
    items = cases(random.Random(n))
    ulpdus, lengths = simulate(n, items, seed=n)
    assert len(ulpdus) == len(items)
    for item, ulpdu, length in zip(items, ulpdus, lengths):
        want = expected(*item)
        assert ulpdu == want, item
        assert length == len(want), item


@pytest.mark.parametrize("n", [1, 8, 64])
def test_full_rate(n):
    """Back to back with no idle or stall: one beat per cycle, no gap between Terminates."""
    items = cases(random.Random(100 + n))[:20]
    ulpdus, _ = simulate(n, items, seed=n, idle=0, stall=0)
    assert ulpdus == [expected(*item) for item in items]


def tshark_agrees(terminate):
    """Whether tshark sizes the Terminate's DDP header copy as RFC 5040 4.8 does: tshark 4.0
    takes 14 octets for error type 1 and 18 otherwise (packet-iwarp-ddp-rdmap.c), the RFC the
    copy's own T bit."""
    return not terminate.ddp_header or (terminate.etype == 1) == bool(
        terminate.ddp_header[0] & 0x80)


@pytest.mark.tshark
def test_tshark(tmp_path):
    """tshark reads each Terminate's layer, code and copied DDP header as they were sent: every
    case whose copy tshark sizes as the RFC does (the ULPDUs framed by the model). The Read
    Request copy (R) is never among them (error type 1 on an untagged segment): only the model
    checks it."""
    from iwarp_model.capture import StreamCapture
    from iwarp_model.wire.fpdu import Framer
    from iwarp_model.wire.mpa import MpaFrame

    items = [item for item in cases(random.Random(5))
             if tshark_agrees(Terminate.decode(expected(*item)[18:]))]
    ulpdus, _ = simulate(8, items, seed=5, idle=0, stall=0)
    path = tmp_path / "terminate.pcap"
    framer = Framer(crc=True, markers=False)
    with StreamCapture(path, ("10.0.0.1", 40000), ("10.0.0.2", 5000)) as capture:
        capture.sent(MpaFrame(reply=False, crc=True, revision=1).encode())
        capture.received(MpaFrame(reply=True, crc=True, revision=1).encode())
        for ulpdu in ulpdus:
            capture.sent(framer.frame(ulpdu))
    root, _ = decode(path)
    sent = [Terminate.decode(u[18:]) for u in ulpdus]
    assert sum(bool(t.ddp_header) for t in sent) >= 50
    assert [int(f.get("show"), 0) for f in fields(root, "iwarp_rdma.term_layer")] == [
        t.layer for t in sent]
    assert [int(f.get("show"), 0) for f in root.iter("field")
            if f.get("name", "").startswith("iwarp_rdma.term_errcode")] == [
        t.ecode for t in sent]
    assert [f.get("value") for f in fields(root, "iwarp_rdma.term_ddp_h")] == [
        t.ddp_header.hex() for t in sent if t.ddp_header]
    assert not fields(root, "_ws.malformed")


@pytest.mark.parametrize("n", [1, 8, 64])
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "terminate.v"
    path.write_text(verilog.convert(TerminateEmitter(n), name="terminate"))
    assert lint(path) == ""

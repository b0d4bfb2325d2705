# amaranth: UnusedElaboratable=no
"""TerminateEmitter and TerminateParser against the model, bit-exact, at widths 1, 8 and 64.

For every RFC 6580 code and offending segments of every kind (none, each RDMAP opcode tagged
and untagged, Read Requests long enough for the R copy or not, segments shorter than their DDP
header, a first octet with T set on an untagged opcode), the ULPDU must be the model's
``Segment(TERMINATE, msn=msn, header=Terminate.for_error(code, offending)).encode()`` and
``o_length`` its length; random idles and stalls. Every Terminate header the parser is given
(well-formed ones of every flag combination, the same cut short or with octets after them,
random octets) must decode to the model's ``Terminate.decode`` fields, or be ``bad`` where the
model raises.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_model.wire.errors import WireError
from iwarp_model.wire.rdmap import Opcode, ReadRequest, Segment
from iwarp_model.wire.terminate import ErrorCode, Terminate
from iwarp_nic.rdmap import TerminateEmitter, TerminateParser
from iwarp_nic.rdmap.terminate import OFFENDING_BYTES
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets
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


def terminate_headers(rng):
    """Terminate headers to decode: the emitter's cases, random well-formed ones with every
    combination of M, D (tagged or untagged copy, a Read Request's or not) and R, then each
    of them cut short or with octets after it, and random octets."""
    good = [expected(*item)[18:] for item in cases(rng)[::7]]
    for _ in range(60):
        copy = b""
        if rng.random() < 0.6:
            tagged = rng.random() < 0.5
            copy = bytes([0xC1 if tagged else 0x41, 0x41 if rng.random() < 0.5 else 0x43])
            copy += rng.randbytes((14 if tagged else 18) - 2)
        rdma = rng.randbytes(28) if rng.random() < 0.5 else b""
        good.append(Terminate(rng.randrange(16), rng.randrange(16), rng.randrange(256),
                              rng.randrange(1 << 16) if rng.random() < 0.7 else None,
                              copy, rdma if not copy or copy[1] & 0xF == 1 else b"").encode())
    out = list(good)
    for header in good[:40]:
        out.append(header[:rng.randrange(len(header))])
        out.append(header + rng.randbytes(rng.randint(1, 30)))
    out += [rng.randbytes(rng.randint(0, 60)) for _ in range(40)]
    out += [bytes([0, 0, flags, 0]) + rng.randbytes(k) for flags in (0x80, 0x40, 0x20, 0xE0)
            for k in (0, 1, 2, 5, 20, 24, 48)]
    return out


def decoded(header):
    """The model's reading of ``header``: the DUT's fields, or None where it raises."""
    try:
        t = Terminate.decode(header)
    except WireError:
        return None
    return {"layer": t.layer, "etype": t.etype, "ecode": t.ecode,
            "m": int(t.ddp_segment_length is not None),
            "segment_length": t.ddp_segment_length or 0, "ddp_header": t.ddp_header,
            "rdma_header": t.rdma_header}


def parse(n, headers, *, seed, idle=IDLE, stall=STALL, conns=None):
    """The parser's output for ``headers``; with ``conns``, ``headers`` are (conn, header)."""
    dut = TerminateParser(n, conns=conns)
    got = {}
    tagged = [(None, h) for h in headers] if conns is None else headers
    headers = [h for _, h in tagged]

    async def lengths(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_length),
                   [{"data": len(h)} if c is None else {"length": len(h), "conn": c}
                    for c, h in tagged], rng=random.Random(seed), idle=idle)

    async def octets(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                           [h for h in headers if h], n, rng=random.Random(seed + 1), idle=idle)

    async def results(ctx):
        got["out"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(headers),
                                rng=random.Random(seed + 2), stall=stall)

    run(dut, lengths, octets, results, name=f"rdmap_terminate_parser_w{n}")
    return got["out"]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_parser_against_model(n):
    """Each Terminate header decoded as the model's ``Terminate.decode`` does, or ``bad``
    where it raises (truncated, trailing octets)."""
    headers = terminate_headers(random.Random(n))
    check_decoded(headers, parse(n, headers, seed=n))


def check_decoded(headers, outputs):
    """Each output the model's decoding of its header, or ``bad``; plenty of each kind."""
    assert len(outputs) == len(headers)
    verdicts = []
    for header, out in zip(headers, outputs):
        want = decoded(header)
        verdicts.append(want is None)
        assert out["bad"] == (want is None), header.hex()
        if want is None:
            continue
        ddp = out["ddp_header"].to_bytes(18, "little")[:out["ddp_size"]]
        rdma = out["rdma_header"].to_bytes(28, "little") if out["rdma"] else b""
        got = {"layer": out["layer"], "etype": out["etype"], "ecode": out["ecode"],
               "m": out["m"], "segment_length": out["segment_length"] if out["m"] else 0,
               "ddp_header": ddp, "rdma_header": rdma}
        assert got == want, header.hex()
    assert 50 < sum(verdicts) < len(verdicts) - 50      # both kinds, plenty of each


@pytest.mark.parametrize("n", [1, 8, 64])
def test_parser_connections(n):
    """With ``conns``, each Terminate's decoded header names the connection its length named,
    and is decoded as with one stream."""
    rng = random.Random(70 + n)
    headers = terminate_headers(rng)
    tags = [rng.randrange(16) for _ in headers]
    outputs = parse(n, list(zip(tags, headers)), seed=n, conns=16)
    assert [out["conn"] for out in outputs] == tags
    check_decoded(headers, outputs)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_parser_lint(n, tmp_path):
    toolchain.setup()
    path = tmp_path / "terminate_parser.v"
    path.write_text(verilog.convert(TerminateParser(n), name="terminate_parser"))
    assert lint(path) == ""

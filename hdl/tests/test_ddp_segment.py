# amaranth: UnusedElaboratable=no
"""SegmentParser against the model's ``decode_segment`` and ``error_code_for``, at 1, 8, 64 bytes.

Segments of every opcode (payloads of 0 octets to 64 KiB, every RDMAP header, good and bad
Terminate headers), then the same with fields changed (DV, RV, opcode, T, QN, L, MO, AOpCode),
cut short or made longer, random octets and FPDUs the deframer marked bad, with random idles
and stalls. Each header must carry the model's verdict (its Terminate code where it raises) and,
where the segment is good, the model's fields; the payload packets must be the octets after the
DDP header of the segments that carry one.
"""

import random
import struct
from types import SimpleNamespace

import pytest
from amaranth import Module, Signal
from amaranth.back import verilog
from amaranth.sim import Simulator

from iwarp_model.wire.errors import WireError
from iwarp_model.wire.rdmap import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    ReadRequest,
    Segment,
    decode_segment,
)
from iwarp_model.wire.terminate import ErrorCode, Terminate, error_code_for
from iwarp_nic.ddp.segment import (
    HEAD_BYTES,
    SegmentHeader,
    SegmentParser,
    tagged_fields,
    untagged_fields,
)
from iwarp_nic.errors import TerminateCode
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet, to_beats
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.25
CARRIES = {Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE,
           Opcode.TERMINATE}


def good_segments(rng, *, longest):
    """One or more well-formed segments of every opcode."""
    def size():
        return rng.choice([0, 1, 2, 3, 7, 8, 9, 63, 64, 65, rng.randrange(min(2000, longest)),
                           rng.randrange(longest + 1)])

    out = []
    for _ in range(3):
        out += [Segment(op, rng.randbytes(size()), rng.random() < 0.7,
                        stag=rng.getrandbits(32), to=rng.getrandbits(64))
                for op in (Opcode.WRITE, Opcode.READ_RESPONSE)]
        out += [Segment(op, rng.randbytes(size()), rng.random() < 0.7, msn=rng.getrandbits(32),
                        mo=rng.getrandbits(32),
                        inv_stag=rng.getrandbits(32) if op in (4, 6) else 0)
                for op in (Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE,
                           Opcode.SEND_SE_INVALIDATE)]
        msn = rng.getrandbits(32)
        out += [
            Segment(Opcode.READ_REQUEST, msn=msn, header=ReadRequest(
                *(rng.getrandbits(b) for b in (32, 64, 32, 32, 64)))),
            Segment(Opcode.IMMEDIATE_DATA, msn=msn, header=ImmediateData(rng.randbytes(8))),
            Segment(Opcode.IMMEDIATE_DATA_SE, msn=msn, header=ImmediateData(rng.randbytes(8))),
            Segment(Opcode.ATOMIC_REQUEST, msn=msn, header=AtomicRequest(
                rng.choice([0, 2]), *(rng.getrandbits(b) for b in (32, 32, 64, 64, 64, 64, 64)))),
            Segment(Opcode.ATOMIC_RESPONSE, msn=msn, header=AtomicResponse(
                rng.getrandbits(32), rng.getrandbits(64))),
            Segment(Opcode.TERMINATE, msn=msn, header=Terminate.for_error(
                rng.choice(list(ErrorCode)), rng.randbytes(rng.randrange(60)))),
        ]
    return [s.encode() for s in out]


def mutated(rng, ulpdu):
    """``ulpdu`` with one thing wrong (or, by chance, still right)."""
    b = bytearray(ulpdu)
    what = rng.randrange(10)
    if what == 0 and b:
        b[0] ^= rng.choice([0x01, 0x02, 0x03, 0x80, 0x40])      # DV, T, L
    elif what == 1 and len(b) > 1:
        b[1] ^= rng.choice([0x40, 0x80, 0xC0])                  # RV
    elif what == 2 and len(b) > 1:
        b[1] = (b[1] & 0xF0) | rng.randrange(16)                 # opcode
    elif what == 3 and len(b) > 9:
        b[6:10] = struct.pack("!I", rng.choice([0, 1, 2, 3, 4, rng.getrandbits(32)]))  # QN
    elif what == 4 and len(b) > 17:
        b[14:18] = struct.pack("!I", rng.choice([1, rng.getrandbits(32)]))  # MO
    elif what == 5 and len(b) > 21:
        b[21] = rng.randrange(16)                                # AOpCode
    elif what == 6:
        del b[rng.randrange(len(b) + 1):]                        # cut short
    elif what == 7:
        b += rng.randbytes(rng.randint(1, 20))                   # longer
    elif b:
        k = rng.randrange(min(len(b), 80))
        b[k] ^= 1 << rng.randrange(8)                            # any bit
    return bytes(b)


def segments(rng, count, *, longest=3000):
    good = good_segments(rng, longest=longest)
    out = list(good)
    while len(out) < count:
        pick = rng.random()
        if pick < 0.7:
            out.append(mutated(rng, rng.choice(good)))
        elif pick < 0.9:
            out.append(rng.randbytes(rng.randrange(90)))
        else:
            out.append(rng.choice(good))
    rng.shuffle(out)
    return out


def longest(n):
    """The longest good segment of the random mixes at ``n`` octets a beat: shorter at the
    narrow widths, where each octet is a cycle of the simulator and checks nothing more."""
    return {1: 200, 8: 1000}.get(n, 3000)


def trim_count(ulpdu):
    """Octets of the packet (ULPDU_Length field included) before its payload; None: none."""
    tagged = bool(ulpdu[0] & 0x80) if ulpdu else False
    opcode = ulpdu[1] & 0xF if len(ulpdu) > 1 else 0
    if tagged:
        return 16
    return 20 if opcode in CARRIES else None


def expected(ulpdu, err):
    """The header the DUT must give for this packet, as a dict of the fields it defines."""
    count = trim_count(ulpdu)
    has_payload = count is not None and count < len(ulpdu) + 2
    want = {"fpdu_bad": int(err), "ulpdu_length": len(ulpdu), "has_payload": int(has_payload),
            "head": ulpdu[:HEAD_BYTES] + bytes(HEAD_BYTES - len(ulpdu[:HEAD_BYTES]))}
    if err:
        return want, (ulpdu[count - 2:] if has_payload else None)
    try:
        segment = decode_segment(ulpdu)
    except WireError as error:
        segment = None
        code = error_code_for(error)
        if len(ulpdu) >= 18 and ulpdu[1] & 0xF == Opcode.TERMINATE and (
                code is ErrorCode.RDMAP_CATASTROPHIC_STREAM):
            # Only the Terminate header is malformed: that is the TerminateParser's finding.
            try:
                Terminate.decode(ulpdu[18:])
            except WireError:
                segment = SimpleNamespace(opcode=Opcode.TERMINATE, last=True)
        if segment is None:
            layer, etype, ecode = code.value
            want.update(ok=0, code=layer << 12 | etype << 8 | ecode)
    if segment is not None:
        tagged = segment.opcode in (Opcode.WRITE, Opcode.READ_RESPONSE)
        want.update(ok=1, opcode=int(segment.opcode), tagged=int(tagged), last=int(segment.last),
                    length=len(ulpdu) - (14 if tagged else 18))
    return want, (ulpdu[count - 2:] if has_payload else None)


def simulate(n, packets, *, seed, idle=IDLE, stall=STALL, conns=None):
    """Parse ``packets``; with ``conns``, each from a random one of that many connections,
    whose number its header must carry."""
    dut = SegmentParser(n, conns=conns)
    wants = [expected(bytes(p), p.err) for p in packets]
    payloads = [p for _, p in wants if p is not None]
    owners = [random.Random(seed + k).randrange(conns) if conns else None
              for k in range(len(packets))]
    if conns:
        for (want, _), owner in zip(wants, owners):
            want["conn"] = owner
    got = {}

    async def source(ctx):
        framed = [Packet(len(p).to_bytes(2, "big") + bytes(p), err=p.err) for p in packets]
        if conns:
            beats = ({**beat._asdict(), "conn": owner} for packet, owner in zip(framed, owners)
                     for beat in to_beats(packet, n))
            await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i), beats,
                       rng=random.Random(seed), idle=idle)
        else:
            await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), framed, n,
                               rng=random.Random(seed), idle=idle)

    async def headers(ctx):
        got["headers"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_header),
                                    len(packets), rng=random.Random(seed + 1), stall=stall)

    async def payload(ctx):
        got["payloads"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o_payload),
                                             len(payloads), n, rng=random.Random(seed + 2),
                                             stall=stall)

    run(dut, source, headers, payload, name=f"ddp_segment_w{n}")
    for packet, (want, _), header in zip(packets, wants, got["headers"]):
        header = dict(header)
        header["head"] = header["head"].to_bytes(HEAD_BYTES, "little")
        header["code"] = TerminateCode(header["code"]).value
        assert {k: header[k] for k in want} == want, (bytes(packet).hex(), packet.err)
    assert [bytes(p) for p in got["payloads"]] == payloads
    return wants


def test_field_views():
    """``tagged_fields`` and ``untagged_fields`` give, from a header's ``head``, the DDP fields
    the model decodes from the same octets (its consumers read them there)."""
    hdr = Signal(SegmentHeader)
    views = {True: tagged_fields(hdr), False: untagged_fields(hdr)}
    names = {True: ("stag", "to"), False: ("inv_stag", "qn", "msn", "mo")}
    ulpdus = good_segments(random.Random(5), longest=100)
    checked = []

    async def bench(ctx):
        for ulpdu in ulpdus:
            segment = decode_segment(ulpdu)
            tagged = segment.opcode in (Opcode.WRITE, Opcode.READ_RESPONSE)
            head = ulpdu[:HEAD_BYTES].ljust(HEAD_BYTES, b"\0")
            ctx.set(hdr.head, int.from_bytes(head, "little"))
            got = {name: ctx.get(getattr(views[tagged], name)) for name in names[tagged]}
            assert got == {name: getattr(segment, name) for name in names[tagged]}, ulpdu.hex()
            checked.append(tagged)

    sim = Simulator(Module())
    sim.add_testbench(bench)
    sim.run()
    assert set(checked) == {True, False}


@pytest.mark.parametrize("n", [1, 8, 64])
def test_against_model(n):
    rng = random.Random(n)
    # At one octet a beat, short payloads: the beats of a long one add nothing but time.
    packets = [Packet(s, err=rng.random() < 0.03)
               for s in segments(rng, 400, longest=longest(n))]
    wants = simulate(n, packets, seed=n)
    # The cases cover every verdict the parser can give.
    seen = {w.get("code") for w, _ in wants if w.get("ok") == 0}
    codes = {ErrorCode.RDMAP_CATASTROPHIC_STREAM, ErrorCode.DDP_TAGGED_INVALID_VERSION,
             ErrorCode.DDP_UNTAGGED_INVALID_VERSION, ErrorCode.RDMAP_INVALID_VERSION,
             ErrorCode.RDMAP_UNEXPECTED_OPCODE, ErrorCode.DDP_UNTAGGED_INVALID_QN,
             ErrorCode.DDP_UNTAGGED_INVALID_MO}
    assert seen >= {c.value[0] << 12 | c.value[1] << 8 | c.value[2] for c in codes}
    assert sum(w.get("ok") == 1 for w, _ in wants) > 100


@pytest.mark.parametrize("n", [1, 8, 64])
def test_connections(n):
    """Packets of 16 connections interleaved: each header as the model says, naming its own
    packet's connection; the payloads in the headers' order."""
    rng = random.Random(30 + n)
    packets = [Packet(s, err=rng.random() < 0.03) for s in segments(rng, 150,
                                                                    longest=longest(n))]
    simulate(n, packets, seed=n, conns=16)


@pytest.mark.parametrize("n", [8, 64])
def test_longest(n):
    """Payloads of 64 KiB less the DDP header, at full rate."""
    rng = random.Random(7)
    packets = [Packet(Segment(Opcode.WRITE, rng.randbytes(65535 - 14), stag=1, to=2).encode()),
               Packet(Segment(Opcode.SEND, rng.randbytes(65535 - 18), msn=3).encode()),
               Packet(Segment(Opcode.WRITE, b"", stag=1, to=2).encode())]
    simulate(n, packets, seed=n, idle=0, stall=0)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_full_rate(n):
    """Short segments back to back with no idle or stall, one per beat at 64 bytes."""
    rng = random.Random(20 + n)
    packets = [Packet(s) for s in segments(rng, 120, longest=100)]
    simulate(n, packets, seed=n, idle=0, stall=0)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "segment.v"
    path.write_text(verilog.convert(SegmentParser(n), name="segment"))
    assert lint(path) == ""

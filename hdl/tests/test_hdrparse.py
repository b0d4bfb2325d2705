# amaranth: UnusedElaboratable=no
"""HeaderParser and HeaderEmitter against scapy, at every width, with random idle and stall."""

import ipaddress
import random

import pytest
from amaranth import Module, Value
from amaranth.back import verilog
from amaranth.lib import wiring
from scapy.layers.inet import IP
from scapy.layers.inet import TCP as ScapyTCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from iwarp_nic.hdrparse import HeaderEmitter, HeaderParser
from iwarp_nic.headers import ETHERNET, IPV4, TCP, Field, Gap, HeaderFormat
from iwarp_nic.stream import DATA_BYTES
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, Packet, from_beats, to_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.3


# --- scapy packets and the field values we expect for them -----------------------------------

def random_packet(rng, payload_len):
    """An Ether/IP/TCP packet with every header field random and set explicitly."""
    def mac():
        return ":".join(f"{rng.getrandbits(8):02x}" for _ in range(6))

    def addr():
        return str(ipaddress.IPv4Address(rng.getrandbits(32)))

    pkt = (Ether(dst=mac(), src=mac(), type=rng.getrandbits(16))
           / IP(version=rng.getrandbits(4), ihl=rng.getrandbits(4), tos=rng.getrandbits(8),
                len=rng.getrandbits(16), id=rng.getrandbits(16), flags=rng.getrandbits(3),
                frag=rng.getrandbits(13), ttl=rng.getrandbits(8), proto=rng.getrandbits(8),
                chksum=rng.getrandbits(16), src=addr(), dst=addr())
           / ScapyTCP(sport=rng.getrandbits(16), dport=rng.getrandbits(16),
                      seq=rng.getrandbits(32), ack=rng.getrandbits(32),
                      dataofs=rng.getrandbits(4), reserved=rng.getrandbits(3),
                      flags=rng.getrandbits(9), window=rng.getrandbits(16),
                      chksum=rng.getrandbits(16), urgptr=rng.getrandbits(16)))
    if payload_len:
        pkt = pkt / Raw(bytes(rng.getrandbits(8) for _ in range(payload_len)))
    return pkt


def eth_fields(pkt):
    e = pkt[Ether]
    return {"dst": int(e.dst.replace(":", ""), 16), "src": int(e.src.replace(":", ""), 16),
            "ethertype": e.type}


def ip_fields(pkt):
    p = pkt[IP]
    return {"version": p.version, "ihl": p.ihl, "dscp": p.tos >> 2, "ecn": p.tos & 3,
            "total_length": p.len, "identification": p.id, "flags": int(p.flags),
            "fragment_offset": p.frag, "ttl": p.ttl, "protocol": p.proto, "checksum": p.chksum,
            "src": int(ipaddress.IPv4Address(p.src)), "dst": int(ipaddress.IPv4Address(p.dst))}


def tcp_fields(pkt):
    t = pkt[ScapyTCP]
    flags = int(t.flags)  # scapy: 9 flag bits, the first (NS/AE) is our lowest reserved bit
    return {"src_port": t.sport, "dst_port": t.dport, "seq": t.seq, "ack": t.ack,
            "data_offset": t.dataofs, "reserved": t.reserved << 1 | flags >> 8,
            "flags": flags & 0xFF, "window": t.window, "checksum": t.chksum,
            "urgent_pointer": t.urgptr}


def payload_of(pkt):
    return bytes(pkt[Raw].load) if Raw in pkt else b""


def sizes(n):
    """(packet count, largest payload) per width: width 1 simulates a cycle per byte."""
    return {1: (16, 60), 2: (24, 120), 4: (40, 200)}.get(n, (60, 200))


def payload_lengths(rng, n):
    count, most = sizes(n)
    fixed = [0, 1, 0, n, n + 1]
    return fixed + [rng.choice([0, rng.randint(1, most)]) if rng.random() < 0.15
                    else rng.randint(1, most) for _ in range(count - len(fixed))]


# --- stream helpers --------------------------------------------------------------------------

def header_port(iface):
    """A header stream as one packed value: transfers are ints of the HeaderStream layout."""
    return StreamPort(iface.valid, iface.ready, {"bits": Value.cast(iface.payload)})


def header_bits(iface, fields, has_payload):
    return iface.payload.shape().const({"fields": fields, "has_payload": has_payload}) \
        .as_value().value


def header_value(iface, fmt, bits):
    c = iface.payload.shape().from_bits(bits)
    return {name: c.fields[name] for name, _ in fmt.layout}, c.has_payload


def watch_order(parser, n_headers, n_payloads, state):
    """Check, every cycle, that a payload packet starts only once its header has been offered,
    and that ``drop`` never strobes; stop after ``n_headers`` headers and ``n_payloads``
    payload packets have been taken."""
    hdr, pl = parser.o_header, parser.o_payload

    async def tb(ctx):
        offered = taken = started = done = 0
        current_counted = in_packet = False
        while taken < n_headers or done < n_payloads:
            _, _, hv, hr, hp, pv, pr, last, drop = await ctx.tick().sample(
                hdr.valid, hdr.ready, hdr.payload.has_payload, pl.valid, pl.ready,
                pl.payload.last, parser.drop)
            assert not drop, "unexpected drop"
            if hv and hp and not current_counted:
                offered += 1
                current_counted = True
            if hv and hr:
                taken += 1
                current_counted = False
            if pv and not in_packet:
                started += 1
                in_packet = True
                assert offered >= started, "payload offered before its header"
            if pv and pr and last:
                in_packet = False
                done += 1
        state["watched"] = True
    return tb


# --- round trip against scapy ----------------------------------------------------------------

def with_err(rng, data):
    return Packet(data, err=bool(data) and rng.random() < 0.2)


@pytest.mark.parametrize("n", DATA_BYTES)
def test_parse_chain_against_scapy(n):
    rng = random.Random(1000 + n)
    pkts = [random_packet(rng, length) for length in payload_lengths(rng, n)]
    wires = [with_err(rng, bytes(p)) for p in pkts]
    errs = [w.err for w in wires]
    # An err on a packet with no TCP payload makes the TCP parser drop it (header only, bad).
    kept = [p for p, e in zip(pkts, errs, strict=True) if payload_of(p) or not e]

    m = Module()
    m.submodules.eth = eth = HeaderParser(ETHERNET, n, err=True)
    m.submodules.ip = ip = HeaderParser(IPV4, n, err=True)
    m.submodules.tcp = tcp = HeaderParser(TCP, n, err=True)
    wiring.connect(m, eth.o_payload, ip.i)
    wiring.connect(m, ip.o_payload, tcp.i)

    expected_payloads = [Packet(payload_of(p), e)
                         for p, e in zip(pkts, errs, strict=True) if payload_of(p)]
    state = {}

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(eth.i), wires, n,
                           rng=random.Random(rng.random()), idle=IDLE)

    def headers(parser, fmt, expect):
        async def tb(ctx):
            got = await recv(AmaranthBus(ctx), header_port(parser.o_header), len(expect),
                             rng=random.Random(rng.random()), stall=STALL)
            for i, (transfer, (fields, has_payload)) in enumerate(zip(got, expect, strict=True)):
                assert header_value(parser.o_header, fmt, transfer["bits"]) == \
                    (fields, has_payload), f"{fmt.name} header {i}"
        return tb

    async def tcp_drops(ctx):
        # The TCP parser strobes drop once per header-only packet with err, and never otherwise.
        count = 0
        while "payloads" not in state:
            _, _, drop = await ctx.tick().sample(tcp.drop)
            count += drop
        assert count == len(pkts) - len(kept)

    async def payloads(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(tcp.o_payload),
                                 len(expected_payloads), n, rng=random.Random(rng.random()),
                                 stall=STALL)
        assert [(bytes(p), p.err) for p in got] == \
            [(bytes(p), p.err) for p in expected_payloads]
        for _ in range(4):
            await ctx.tick()
        state["payloads"] = True

    run(m, source, payloads, tcp_drops,
        headers(eth, ETHERNET, [(eth_fields(p), 1) for p in pkts]),
        headers(ip, IPV4, [(ip_fields(p), 1) for p in pkts]),
        headers(tcp, TCP, [(tcp_fields(p), int(bool(payload_of(p)))) for p in kept]),
        watch_order(eth, len(pkts), len(pkts), state),
        watch_order(ip, len(pkts), len(pkts), state),
        name=f"parse_chain_{n}")
    assert state["watched"]


@pytest.mark.parametrize("n", DATA_BYTES)
def test_emit_chain_against_scapy(n):
    rng = random.Random(2000 + n)
    pkts = [random_packet(rng, length) for length in payload_lengths(rng, n)]
    payloads = [with_err(rng, payload_of(p)) for p in pkts]

    m = Module()
    m.submodules.tcp = tcp = HeaderEmitter(TCP, n, err=True)
    m.submodules.ip = ip = HeaderEmitter(IPV4, n, err=True)
    m.submodules.eth = eth = HeaderEmitter(ETHERNET, n, err=True)
    wiring.connect(m, tcp.o, ip.i_payload)
    wiring.connect(m, ip.o, eth.i_payload)

    def headers(emitter, fields_of, has_payload):
        async def tb(ctx):
            transfers = [{"bits": header_bits(emitter.i_header, fields_of(p), has_payload(p))}
                         for p in pkts]
            await send(AmaranthBus(ctx), header_port(emitter.i_header), transfers,
                       rng=random.Random(rng.random()), idle=IDLE)
        return tb

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(tcp.i_payload),
                           [p for p in payloads if p], n, rng=random.Random(rng.random()),
                           idle=IDLE)

    async def sink(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(eth.o), len(pkts), n,
                                 rng=random.Random(rng.random()), stall=STALL)
        for i, (p, pl, g) in enumerate(zip(pkts, payloads, got, strict=True)):
            assert (bytes(g), g.err) == (bytes(p), pl.err), f"packet {i}"

    run(m, source, sink,
        headers(tcp, tcp_fields, lambda p: int(bool(payload_of(p)))),
        headers(ip, ip_fields, lambda p: 1),
        headers(eth, eth_fields, lambda p: 1),
        name=f"emit_chain_{n}")


@pytest.mark.parametrize("n", DATA_BYTES)
def test_emit_header_then_payload(n):
    """A producer that offers each header, waits for it to be taken, then offers its payload."""
    rng = random.Random(2500 + n)
    pkts = [random_packet(rng, length) for length in payload_lengths(rng, n)]
    payloads = [with_err(rng, payload_of(p)) for p in pkts]
    dut = HeaderEmitter(TCP, n, err=True)

    async def producer(ctx):
        bus, rng_source = AmaranthBus(ctx), random.Random(rng.random())
        for p, payload in zip(pkts, payloads, strict=True):
            bits = header_bits(dut.i_header, tcp_fields(p), int(bool(payload)))
            await send(bus, header_port(dut.i_header), [{"bits": bits}], rng=rng_source,
                       idle=IDLE)
            if payload:
                await send_packets(bus, StreamPort.amaranth(dut.i_payload), [payload], n,
                                   rng=rng_source, idle=IDLE)

    async def sink(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(pkts), n,
                                 rng=random.Random(rng.random()), stall=STALL)
        assert [(bytes(g), g.err) for g in got] == \
            [(bytes(p[ScapyTCP]), pl.err) for p, pl in zip(pkts, payloads, strict=True)]

    run(dut, producer, sink, name=f"emit_sequential_{n}")


# --- bad input: truncated, header-only, err --------------------------------------------------

def ip_cases(rng, n):
    """(wire packet, expected header or None if dropped, expected payload or None)."""
    cases = []
    count = 24 if n == 1 else 60
    for i in range(count):
        pkt = random_packet(rng, rng.randint(0, 60))
        wire = bytes(pkt[IP])
        kind = ["short", "header", "full"][i % 3]
        err = rng.random() < 0.4
        if kind == "short":
            cases.append((Packet(wire[:rng.randint(1, IPV4.length - 1)], err), None, None))
        elif kind == "header":
            header = None if err else (ip_fields(pkt), 0)
            cases.append((Packet(wire[:IPV4.length], err), header, None))
        else:
            cases.append((Packet(wire, err), (ip_fields(pkt), 1),
                          Packet(wire[IPV4.length:], err)))
    return cases


@pytest.mark.parametrize("n", DATA_BYTES)
def test_parse_drops_truncated_and_bad_header_only(n):
    rng = random.Random(3000 + n)
    cases = ip_cases(rng, n)
    dut = HeaderParser(IPV4, n, err=True)
    expect_headers = [h for _, h, _ in cases if h is not None]
    expect_payloads = [p for _, _, p in cases if p is not None]
    expect_drops = sum(h is None for _, h, _ in cases)
    state = {}

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), [w for w, _, _ in cases],
                           n, rng=random.Random(rng.random()), idle=IDLE)
        for _ in range(3):
            await ctx.tick()
        state["sent"] = True

    async def drops(ctx):
        count = 0
        while "sent" not in state:
            _, _, drop = await ctx.tick().sample(dut.drop)
            count += drop
        assert count == expect_drops

    async def consumer(ctx):
        # Take each header, then its payload, as a downstream layer would.
        bus, rng_sink = AmaranthBus(ctx), random.Random(rng.random())
        headers, payloads = [], []
        for _ in expect_headers:
            [transfer] = await recv(bus, header_port(dut.o_header), 1, rng=rng_sink, stall=STALL)
            headers.append(header_value(dut.o_header, IPV4, transfer["bits"]))
            if headers[-1][1]:
                payloads += await recv_packets(bus, StreamPort.amaranth(dut.o_payload), 1, n,
                                               rng=rng_sink, stall=STALL)
        assert headers == expect_headers
        assert [(bytes(p), p.err) for p in payloads] == \
            [(bytes(p), p.err) for p in expect_payloads]

    run(dut, source, drops, consumer, name=f"parse_bad_{n}")


# --- any header length: parser into emitter gives the packets back -------------------------

@pytest.mark.parametrize("n", DATA_BYTES)
@pytest.mark.parametrize("length", [1, 4, 8, 18, 64])
def test_loopback_any_header_length(length, n):
    """Parser -> emitter on a header of ``length`` bytes returns every packet that is not dropped,
    whether a beat holds part of the header, all of it or more."""
    rng = random.Random(6000 + 100 * length + n)
    fmt = HeaderFormat(f"h{length}", [Field(f"b{i}", i, 0, 8) for i in range(length)])
    count = 8 if n == 1 else 20
    wires = [Packet(bytes(rng.getrandbits(8) for _ in range(max(1, size))), rng.random() < 0.3)
             for size in [length - 1, length, length + 1, length + n]
             + [rng.randint(1, 2 * length + 3 * n) for _ in range(count)]]
    kept = [w for w in wires if len(w) > length or (len(w) == length and not w.err)]
    m = Module()
    m.submodules.parser = parser = HeaderParser(fmt, n, err=True)
    m.submodules.emitter = emitter = HeaderEmitter(fmt, n, err=True)
    wiring.connect(m, parser.o_header, emitter.i_header)
    wiring.connect(m, parser.o_payload, emitter.i_payload)

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(parser.i), wires, n,
                           rng=random.Random(rng.random()), idle=IDLE)

    async def sink(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(emitter.o), len(kept), n,
                                 rng=random.Random(rng.random()), stall=STALL)
        assert [(bytes(g), g.err) for g in got] == \
            [(bytes(w), w.err) for w in kept]

    run(m, source, sink, name=f"loopback_{length}_{n}")


# --- full rate -------------------------------------------------------------------------------

def table_fields(fmt, wire):
    """The field values of the header at the start of ``wire``, read by the table (the rate
    tests use random bytes, which scapy would dissect by their own length fields)."""
    number = int.from_bytes(wire[:fmt.length], "big")
    return {f.name: number >> (8 * (fmt.length - f.offset) - f.bit - f.width) & ((1 << f.width) - 1)
            for f in fmt.fields}


def rate_packets(rng, n, count):
    """Back-to-back packets for the rate tests: header only, one beat, and several beats."""
    lengths = [IPV4.length, max(IPV4.length, n), IPV4.length + 1]
    lengths += [rng.randint(IPV4.length, IPV4.length + 3 * n + 5) for _ in range(count)]
    if n >= 16:
        lengths += [4096, 4096, IPV4.length + n, 1500]
    return [bytes(rng.getrandbits(8) for _ in range(length)) for length in lengths]


@pytest.mark.parametrize("n", DATA_BYTES)
def test_parser_full_rate(n):
    """With ready outputs the parser takes an input beat on every cycle, packet after packet."""
    rng = random.Random(4000 + n)
    wires = rate_packets(rng, n, 10 if n == 1 else 40)
    beats = [b for w in wires for b in to_beats(w, n)]
    dut = HeaderParser(IPV4, n)
    with_payload = [w[IPV4.length:] for w in wires if len(w) > IPV4.length]

    async def source(ctx):
        port = StreamPort.amaranth(dut.i)
        ctx.set(port.valid, 1)
        for i, beat in enumerate(beats):
            for name in ("data", "keep", "last"):
                ctx.set(port.fields[name], getattr(beat, name))
            _, _, ready = await ctx.tick().sample(port.ready)
            assert ready, f"input stalled at beat {i}"
        ctx.set(port.valid, 0)

    async def headers(ctx):
        await recv(AmaranthBus(ctx), header_port(dut.o_header), len(wires))

    async def payloads(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o_payload),
                                 len(with_payload), n)
        assert [bytes(p) for p in got] == with_payload

    run(dut, source, headers, payloads, name=f"parser_rate_{n}")


@pytest.mark.parametrize("n", DATA_BYTES)
def test_emitter_full_rate(n):
    """With inputs always offered and the output ready, the emitter sends a beat every cycle."""
    rng = random.Random(5000 + n)
    wires = rate_packets(rng, n, 10 if n == 1 else 40)
    total = sum(len(to_beats(w, n)) for w in wires)
    dut = HeaderEmitter(IPV4, n)

    async def header_source(ctx):
        transfers = [{"bits": header_bits(dut.i_header, table_fields(IPV4, w),
                                          int(len(w) > IPV4.length))} for w in wires]
        await send(AmaranthBus(ctx), header_port(dut.i_header), transfers)

    async def payload_source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_payload),
                           [w[IPV4.length:] for w in wires if len(w) > IPV4.length], n)

    async def sink(ctx):
        port = StreamPort.amaranth(dut.o)
        ctx.set(port.ready, 1)
        valid = []
        got = []
        while len(got) < total:
            _, _, v, data, keep, last = await ctx.tick().sample(
                port.valid, port.fields["data"], port.fields["keep"], port.fields["last"])
            valid.append(v)
            if v:
                got.append((data, keep, last))
        first = valid.index(1)
        assert all(valid[first:]), f"bubble in the output at cycle {valid.index(0, first)}"
        assert from_beats([Beat(*b) for b in got], n) == wires

    run(dut, header_source, payload_source, sink, name=f"emitter_rate_{n}")


# --- tables, parameters and conversion -------------------------------------------------------

def test_formats():
    assert (ETHERNET.length, IPV4.length, TCP.length) == (14, 20, 20)
    assert IPV4.layout.size == 20 * 8 and TCP.layout.size == 20 * 8
    fmt = HeaderFormat("x", [Field("a", 0, 0, 3), Field("b", 0, 5, 11)], gaps=[Gap(0, 3, 2)])
    assert fmt.length == 2 and fmt.layout.size == 14


@pytest.mark.parametrize("fields, gaps, message", [
    ([Field("a", 0, 0, 8), Field("b", 0, 4, 8)], (), "overlaps"),
    ([Field("a", 0, 0, 8), Field("b", 2, 0, 8)], (), "undeclared gap"),
    ([Field("a", 0, 0, 12)], (), "byte boundary"),
    ([Field("a", 1, 0, 8), Field("b", 0, 0, 8)], (), "wire order"),
    ([Field("a", 0, 0, 8), Field("a", 1, 0, 8)], (), "twice"),
    ([Field("a", 0, 8, 8)], (), "bit < 8"),
    ([Field("a", 0, 0, 4)], [Gap(0, 2, 4)], "overlaps"),
])
def test_format_errors(fields, gaps, message):
    with pytest.raises(ValueError, match=message):
        HeaderFormat("bad", fields, gaps=gaps)


def test_gap_is_zero_on_the_wire_and_ignored_when_parsed():
    fmt = HeaderFormat("x", [Field("a", 0, 0, 3), Field("b", 0, 5, 11)], gaps=[Gap(0, 3, 2)])
    n = 1
    parser, emitter = HeaderParser(fmt, n), HeaderEmitter(fmt, n)
    m = Module()
    m.submodules.p, m.submodules.e = parser, emitter

    async def emit(ctx):
        await send(AmaranthBus(ctx), header_port(emitter.i_header),
                   [{"bits": header_bits(emitter.i_header, {"a": 5, "b": 0x5A5}, 0)}])

    async def emitted(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(emitter.o), 1, n)
        assert bytes(got[0]) == bytes([0b101_00_101, 0xA5])

    async def parse(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(parser.i), [b"\xff\xff"], n)

    async def parsed(ctx):
        got = await recv(AmaranthBus(ctx), header_port(parser.o_header), 1)
        assert header_value(parser.o_header, fmt, got[0]["bits"]) == ({"a": 7, "b": 0x7FF}, 0)

    run(m, emit, emitted, parse, parsed)


def test_parameter_errors():
    with pytest.raises(ValueError, match="data_bytes"):
        HeaderParser(IPV4, 3)
    with pytest.raises(TypeError, match="HeaderFormat"):
        HeaderEmitter("ipv4", 8)
    with pytest.raises(TypeError, match="err"):
        HeaderParser(IPV4, 8, err=1)


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("cls", [HeaderParser, HeaderEmitter])
def test_converts_to_verilog(cls, n):
    for fmt in (ETHERNET, IPV4):
        assert "module" in verilog.convert(cls(fmt, n, err=True), name=f"{fmt.name}_{n}")

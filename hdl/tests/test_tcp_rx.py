# amaranth: UnusedElaboratable=no
"""TcpRx against scapy and a Python oracle, widths 1, 8 and 64, with random idle and stall
cycles on every stream.

Segments are built with scapy at IpStack's output level (IPv4 header fields on ``i_header``, the
TCP segment on ``i``) and checked field by field against scapy's dissection; the options against
an option walker written here from RFC 9293 3.1/3.2 and RFC 7323 2.2/2.3 (and against scapy's
option list where the options are well formed). Covered: data and zero-length segments mixed,
SYN with MSS + window scale, shifts above 14, options in odd orders with NOPs, unknown kinds and
malformed lengths, random option bytes, corrupted checksums (segment or pseudo-header), bad data
offsets, segments shorter than 20 bytes, truncated segments, input err, datagrams without a
segment. The ordering guarantee (o_seg offered only after its o_data packet's last beat) is
checked on every segment with payload; latency and throughput are measured.
"""

import ipaddress
import random

import pytest
from amaranth import Value
from scapy.layers.inet import IP, TCP, in4_chksum
from scapy.packet import Raw

from iwarp_nic.tcp.layouts import RxSegment
from iwarp_nic.tcp.rx import COUNTERS, TcpRx
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, Packet, from_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, send, send_packets

IDLE = STALL = 0.25
WIDTHS = (1, 2, 8, 64)  # 2: the ECPIX-5 server's width
PEER, US = "10.0.0.2", "10.0.0.1"
WELL_FORMED = [
    [],
    [("MSS", 1460)],
    [("NOP", None), ("NOP", None), ("Timestamp", (12345, 678))],
    [("MSS", 8960), ("NOP", None), ("WScale", 7), ("SAckOK", b""), ("EOL", None)],
    [("SAckOK", b""), ("Timestamp", (1, 2)), ("NOP", None), ("WScale", 2), ("MSS", 536)],
    [("WScale", 15)],                                     # clamped to 14
    [("WScale", 255), ("MSS", 1)],
    [("MSS", 100), ("MSS", 65535)],                       # the last one counts
    [("NOP", None)] * 7 + [("WScale", 3)],
    [("SAck", (1000, 2000, 3000, 4000))],
]
# Option areas scapy cannot build: (bytes, comment).
ODD = [
    (b"\x01\x01\x03\x03\x07\x02\x04\x05\xb4\x00\x00\x00", "NOPs, WS then MSS"),
    (b"\xfe\x06abcd\x02\x04\x01\x00\x01\x01", "unknown kind skipped by its length"),
    (b"\x02\x04\x05\xb4\x99\x00\x03\x03\x05\x00\x00\x00", "length 0 ends parsing"),
    (b"\x03\x03\x09\x05\x01\x02\x04\x12\x34\x00\x00\x00", "length 1 ends parsing"),
    (b"\x02\x04\x04\x00\x03\x09\x05\x00", "length past the area"),
    (b"\x01\x01\x01\x08", "kind without its length byte"),
    (b"\x00\x02\x04\x05\xb4\x03\x03\x04", "after EOL nothing counts"),
    (b"\x02\x03\x05\x03\x03\x02\x03\x03\x03\x04\x02\x01", "MSS len 3, WS len 2 and 4 skipped"),
    (b"\x01" * 37 + b"\x03\x03\x0e", "40 bytes, WS last"),
    (b"\x02\x04\xff\xff" * 10, "40 bytes of MSS"),
    (b"\x08\x0a" + bytes(8) + b"\x02\x04\x02\x18\x01\x00", "unknown 10 bytes, then MSS"),
    (b"\x04\x03\x00\x04\x02\x00\x00\x00", "SACK-permitted of length 3, then one of 2"),
    (b"\x04\x04\x00\x00\x00\x00\x00\x00", "SACK-permitted of length 4 only skipped"),
]


def ip_int(text):
    return int(ipaddress.IPv4Address(text))


def ip_text(value):
    return str(ipaddress.IPv4Address(value))


def walk_options(area):
    """(mss, ws, sack_ok) of an option area, the first two None when absent: RFC 9293 3.1/3.2,
    RFC 7323 2.2/2.3, RFC 2018 2. A kind without room for its length byte, a length below 2 or
    past the area ends the walk; the last MSS (kind 2, length 4) and window scale (kind 3,
    length 3) count; SACK-permitted is kind 4 length 2."""
    mss = ws = None
    sack_ok = False
    i = 0
    while i < len(area):
        kind = area[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(area) or area[i + 1] < 2 or i + area[i + 1] > len(area):
            break
        size = area[i + 1]
        if kind == 2 and size == 4:
            mss = int.from_bytes(area[i + 2:i + 4], "big")
        elif kind == 3 and size == 3:
            ws = min(area[i + 2], 14)
        elif kind == 4 and size == 2:
            sack_ok = True
        i += size
    return mss, ws, sack_ok


class Case:
    """One datagram as IpStack delivers it: IPv4 header fields and the segment (or none)."""

    def __init__(self, ip_fields, segment, has_payload=True, *, well_formed=False):
        self.ip = ip_fields
        self.segment = segment                  # a Packet (err flag), or None
        self.has_payload = has_payload
        self.well_formed = well_formed          # scapy's option list can be compared

    def header_bits(self, layout):
        return layout.const({"fields": self.ip, "has_payload": int(self.has_payload)}).as_bits()


def ipv4_fields(wire):
    ip = IP(wire)
    return {"version": ip.version, "ihl": ip.ihl, "dscp": ip.tos >> 2, "ecn": ip.tos & 3,
            "total_length": ip.len, "identification": ip.id, "flags": int(ip.flags),
            "fragment_offset": ip.frag, "ttl": ip.ttl, "protocol": ip.proto,
            "checksum": ip.chksum, "src": ip_int(ip.src), "dst": ip_int(ip.dst)}


def checksummed(segment, src=PEER, dst=US):
    """``segment`` with its checksum field set (by scapy's pseudo-header sum)."""
    seg = bytearray(segment)
    seg[16:18] = b"\x00\x00"
    ip = IP(src=src, dst=dst, len=20 + len(seg), ihl=5)
    seg[16:18] = in4_chksum(6, ip, bytes(seg)).to_bytes(2, "big")
    return bytes(seg)


def build(rng, *, options=None, raw=None, payload=b"", flags=None, data_offset=None):
    """A datagram from the peer to us carrying one TCP segment with a correct checksum: its
    wire bytes (IPv4 header + segment)."""
    opt = raw if raw is not None else bytes(TCP(options=options or []))[20:]
    assert len(opt) % 4 == 0 and len(opt) <= 40
    head = TCP(sport=rng.randrange(1024, 65536), dport=rng.randrange(1024, 65536),
               seq=rng.getrandbits(32), ack=rng.getrandbits(32),
               flags=rng.getrandbits(8) if flags is None else flags,
               window=rng.getrandbits(16), urgptr=rng.getrandbits(16),
               dataofs=5 + len(opt) // 4 if data_offset is None else data_offset, options=[])
    segment = checksummed(bytes(head)[:20] + opt + payload)
    return bytes(IP(src=PEER, dst=US, proto=6, id=rng.getrandbits(16)) / Raw(segment))


def case_of(wire, *, err=False, cut=None, well_formed=False):
    """The Case for datagram ``wire``; ``cut`` keeps only that many segment bytes."""
    segment = wire[20:] if cut is None else wire[20:20 + cut]
    return Case(ipv4_fields(wire), Packet(segment, err), well_formed=well_formed)


def payload_of(rng, n):
    most = 3 * n + 40
    length = rng.choice([0, 0, 1, n - 1 or 1, n, n + 1, rng.randint(2, most)])
    return bytes(rng.getrandbits(8) for _ in range(length))


def mixed_cases(rng, n, count):
    """Good segments of every kind, and every kind of bad one, shuffled."""
    cases = []
    for _ in range(count):
        opts = rng.choice(WELL_FORMED)
        cases.append(case_of(build(rng, options=opts, payload=payload_of(rng, n)),
                             well_formed=True))
    # SYN and SYN-ACK with MSS + window scale.
    cases.append(case_of(build(rng, flags="S", options=[("MSS", 1460), ("NOP", None),
                                                         ("WScale", 7)]), well_formed=True))
    cases.append(case_of(build(rng, flags="SA", options=[("MSS", 9000), ("SAckOK", b""),
                                                          ("WScale", 20)]), well_formed=True))
    for raw, _ in ODD:
        cases.append(case_of(build(rng, raw=raw, payload=payload_of(rng, n))))
    for _ in range(6):                                      # random option bytes
        raw = bytes(rng.getrandbits(8) for _ in range(4 * rng.randint(1, 10)))
        cases.append(case_of(build(rng, raw=raw, payload=payload_of(rng, n))))
    # Corrupted checksums: a flipped bit anywhere in the segment, or another source address.
    for _ in range(6):
        wire = bytearray(build(rng, options=rng.choice(WELL_FORMED), payload=payload_of(rng, n)))
        bit = rng.randrange(8 * (len(wire) - 20))
        wire[20 + bit // 8] ^= 1 << bit % 8
        cases.append(case_of(bytes(wire)))
    other = case_of(build(rng, payload=b"data" * 5))
    other.ip["src"] ^= 0x100
    cases.append(other)
    # Bad data offsets (checksums correct): below 5, and beyond the segment.
    for doff, payload in [(0, b"x" * 30), (4, b""), (2, b"abc"), (6, b""), (15, b"y" * 39),
                          (9, b"z" * 11)]:
        wire = build(rng, payload=payload, data_offset=doff)
        cases.append(case_of(wire))
    # Segments shorter than 20 bytes (the IPv4 length agrees).
    for length in (1, 12, 13, 19):
        wire = bytes(IP(src=PEER, dst=US, proto=6) / Raw(build(rng)[20:20 + length]))
        cases.append(case_of(wire))
    # Input err: with payload, without, exactly 20 bytes; truncated (err, as Ipv4Rx marks it).
    cases.append(case_of(build(rng, payload=payload_of(rng, n) + b"!"), err=True))
    cases.append(case_of(build(rng, options=[("MSS", 1)]), err=True))
    cases.append(case_of(build(rng), err=True))
    for _ in range(3):
        wire = build(rng, options=rng.choice(WELL_FORMED), payload=payload_of(rng, n) + b"!!")
        cases.append(case_of(wire, err=True, cut=rng.randrange(1, len(wire) - 20)))
    # Lengths that disagree with the IPv4 header without err.
    wire = build(rng, payload=b"0123456789")
    cases.append(case_of(wire, cut=len(wire) - 20 - 3))
    longer = case_of(wire)
    longer.ip["total_length"] -= 2
    cases.append(longer)
    # No segment at all.
    empty = IP(src=PEER, dst=US, proto=6)
    cases.append(Case(ipv4_fields(bytes(empty)), None, has_payload=False))
    rng.shuffle(cases)
    return cases


class Expected:
    """The oracle's view of a case: the counter it lands in, its o_seg record (good ones), and
    its o_data packet (bytes, err) if it has one."""

    def __init__(self, case):
        self.record = self.data = None
        if not case.has_payload:
            self.kind = "bad_header"
            return
        ip, seg = case.ip, case.segment
        tcp_length = ip["total_length"] - 4 * ip["ihl"]
        doff = seg[12] >> 4 if len(seg) > 12 else 0
        offset_ok = doff >= 5 and 4 * doff <= tcp_length
        pseudo = IP(src=ip_text(ip["src"]), dst=ip_text(ip["dst"]), len=ip["total_length"],
                    ihl=ip["ihl"])
        if seg.err or len(seg) != tcp_length:
            self.kind = "discarded"
        elif len(seg) < 20 or not offset_ok:
            self.kind = "bad_header"
        elif in4_chksum(6, pseudo, bytes(seg)) != 0:
            self.kind = "bad_checksum"
        else:
            self.kind = "segments"
            self.record = self._record(case)
        if offset_ok and len(seg) > 4 * doff:
            self.data = (bytes(seg[4 * doff:]), self.kind != "segments")

    @staticmethod
    def _record(case):
        """scapy's view of a good segment, options by walk_options."""
        wire = bytes(IP(src=ip_text(case.ip["src"]), dst=US, proto=6) / Raw(bytes(case.segment)))
        ip = IP(wire)
        tcp = ip[TCP]
        mss, ws, sack_ok = walk_options(bytes(case.segment)[20:4 * tcp.dataofs])
        if case.well_formed:
            found = dict(tcp.options)          # the last of each kind
            assert (mss, ws, sack_ok) == (found.get("MSS"), None if "WScale" not in found
                                          else min(found["WScale"], 14), "SAckOK" in found)
        return {"src_ip": ip_int(ip.src), "src_port": tcp.sport, "dst_port": tcp.dport,
                "seq": tcp.seq, "ack": tcp.ack, "flags": int(tcp.flags), "window": tcp.window,
                "mss": mss or 0, "has_mss": int(mss is not None), "ws": ws or 0,
                "has_ws": int(ws is not None), "sack_ok": int(sack_ok),
                "length": ip.len - 4 * ip.ihl - 4 * tcp.dataofs}


def record_dict(bits):
    view = RxSegment.from_bits(bits)
    return {name: int(getattr(view, name)) for name, _ in RxSegment}


class Outputs:
    """Takes o_seg and o_data with random stalls and records, per cycle, when each record was
    first offered and when each o_data packet's last beat was transferred."""

    def __init__(self, dut, rng, stall):
        self.dut, self.rng, self.stall = dut, rng, stall
        self.records = []                       # (first offered cycle, bits)
        self.beats = []
        self.data_ends = []                     # cycle of each packet's last beat
        self.done = False

    async def run(self, ctx):
        seg, data = self.dut.o_seg, self.dut.o_data
        signals = [seg.valid, Value.cast(seg.payload), data.valid, data.payload.data,
                   data.payload.keep, data.payload.last, data.payload.err]
        cycle, offered = 0, None
        while not self.done:
            seg_ready = self.rng.random() >= self.stall
            data_ready = self.rng.random() >= self.stall
            ctx.set(seg.ready, seg_ready)
            ctx.set(data.ready, data_ready)
            _, _, s_valid, s_bits, d_valid, d_data, d_keep, d_last, d_err = \
                await ctx.tick().sample(*signals)
            if s_valid:
                if offered is None:
                    offered = (cycle, s_bits)
                assert s_bits == offered[1], "o_seg payload changed while offered"
                if seg_ready:
                    self.records.append(offered)
                    offered = None
            if d_valid and data_ready:
                self.beats.append(Beat(d_data, d_keep, d_last, d_err))
                if d_last:
                    self.data_ends.append(cycle)
            cycle += 1

    def packets(self, n):
        return from_beats(self.beats, n)


def check(n, cases, *, seed, idle=IDLE, stall=STALL):
    """Run ``cases`` through TcpRx(n) and compare everything with the oracle."""
    rng = random.Random(seed)
    dut = TcpRx(n)
    expected = [Expected(c) for c in cases]
    records = [e.record for e in expected if e.record is not None]
    packets = [e.data for e in expected if e.data is not None]
    out = Outputs(dut, random.Random(rng.random()), stall)
    layout = dut.i_header.payload.shape()
    state = {}

    async def headers(ctx):
        port = StreamPort(dut.i_header.valid, dut.i_header.ready,
                          {"bits": Value.cast(dut.i_header.payload)})
        await send(AmaranthBus(ctx), port, [{"bits": c.header_bits(layout)} for c in cases],
                   rng=random.Random(rng.random()), idle=idle)

    async def segments(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                           [c.segment for c in cases if c.has_payload], n,
                           rng=random.Random(rng.random()), idle=idle)

    async def watch(ctx):
        for _ in range(200_000):
            if len(out.records) == len(records) and len(out.data_ends) == len(packets):
                break
            await ctx.tick()
        for _ in range(100):                    # anything extra would show now
            await ctx.tick()
        state["counters"] = {name: ctx.get(getattr(dut, name)) for name in COUNTERS}
        out.done = True

    run(dut, headers, segments, out.run, watch, name=f"tcp_rx_w{n}")

    got = out.packets(n)
    assert [(bytes(p), p.err) for p in got] == packets
    assert [record_dict(bits) for _, bits in out.records] == records
    # The ordering guarantee: each record with payload is first offered after the last beat of
    # its o_data packet was transferred.
    rec_index = pkt_index = 0
    for e in expected:
        if e.data is not None:
            if e.record is not None and e.record["length"]:
                assert out.records[rec_index][0] > out.data_ends[pkt_index], \
                    f"o_seg {rec_index} offered before its payload was out"
            pkt_index += 1
        if e.record is not None:
            rec_index += 1
    counts = {name: sum(e.kind == name for e in expected) for name in COUNTERS}
    assert state["counters"] == counts
    return counts


@pytest.mark.parametrize("n", WIDTHS)
def test_mixed(n):
    rng = random.Random(100 + n)
    counts = check(n, mixed_cases(rng, n, 40 if n == 1 else 80), seed=n)
    assert all(counts.values())                 # every outcome was exercised


@pytest.mark.parametrize("n", (2, 4, 16, 32))
def test_other_widths(n):
    rng = random.Random(200 + n)
    check(n, mixed_cases(rng, n, 20), seed=n)


def test_zero_length_and_data_back_to_back():
    """Pure ACKs between data segments, no idle, o_data stalled hard: records keep their order
    and each data record still waits for its payload."""
    rng = random.Random(5)
    cases = []
    for i in range(30):
        payload = b"" if i % 3 else bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 90)))
        cases.append(case_of(build(rng, options=rng.choice(WELL_FORMED), payload=payload),
                             well_formed=True))
    check(8, cases, seed=5, idle=0.0, stall=0.6)


def measure(n, cases, gap=0):
    """Run ``cases`` with no stall, ``gap`` idle cycles between segments; return, per segment,
    the cycles from its last input beat to its record offered (None for segments without a
    record), and the cycles from the first segment's last input beat to the last one's."""
    dut = TcpRx(n)
    layout = dut.i_header.payload.shape()
    expected = [Expected(c) for c in cases]
    ends, offers = [], []

    async def headers(ctx):
        port = StreamPort(dut.i_header.valid, dut.i_header.ready,
                          {"bits": Value.cast(dut.i_header.payload)})
        await send(AmaranthBus(ctx), port, [{"bits": c.header_bits(layout)} for c in cases])

    async def segments(ctx):
        for case in cases:
            await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), [case.segment], n)
            for _ in range(gap):
                await ctx.tick()

    async def watch(ctx):
        ctx.set(dut.o_seg.ready, 1)
        ctx.set(dut.o_data.ready, 1)
        first, cycle, offered = None, 0, False
        while len(offers) < sum(e.record is not None for e in expected):
            _, _, i_valid, i_ready, i_last, s_valid, s_ready = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.payload.last, dut.o_seg.valid, dut.o_seg.ready)
            if i_valid and i_ready:
                first = cycle if first is None else first
                if i_last:
                    ends.append(cycle)
            if s_valid and not offered:
                offers.append(cycle)
            offered = s_valid and not s_ready
            cycle += 1
            assert cycle < 100_000

    run(dut, headers, segments, watch, name=f"tcp_rx_measure_w{n}")
    offer = iter(offers)
    latency = [next(offer) - end if e.record else None for e, end in zip(expected, ends)]
    return latency, ends[-1] - ends[0]


TIMESTAMPS = [("NOP", None), ("NOP", None), ("Timestamp", (1, 2))]


@pytest.mark.parametrize("n", WIDTHS)
def test_latency(n):
    """From the last input beat to o_seg valid, one segment at a time: 4 cycles, or 3 plus one
    to start the walk and one per option walked when the options end in the last beat; 5 for a
    segment with payload, plus one
    for each tail beat (the parser's and the trim's, when the last beat's bytes do not fit the
    realigned beat; never at width 1), or the end of a walk still going."""
    rng = random.Random(9)
    exact = [  # (segment, latency)
        (dict(), 4),
        (dict(options=TIMESTAMPS), 3 + 3),
        (dict(options=WELL_FORMED[3], flags="S"), 3 + 5),   # MSS NOP WS SACK-OK EOL
    ]
    cases = [case_of(build(rng, **kw)) for kw, _ in exact]
    assert measure(n, cases, gap=20)[0] == [cycles for _, cycles in exact]
    # With payload: at width 1 a walk that started when the options were in can still be
    # going (started the cycle after the first payload byte, 3 options walked).
    shapes = [(options, walk, payload) for payload in range(1, 2 * n + 2)
              for options, walk in (([], 0), (TIMESTAMPS, 3 + 3 - payload))]
    cases = [case_of(build(rng, options=options, payload=bytes(payload)))
             for options, _, payload in shapes]
    for (options, walk, payload), latency in zip(shapes, measure(n, cases, gap=20)[0]):
        ok = latency == max(5, walk) if n == 1 else 5 <= latency <= 7
        assert ok, (payload, options, latency)


@pytest.mark.parametrize("n", (8, 64))
def test_throughput(n):
    """Back to back, no stall: 1448-byte segments with timestamps at one beat per cycle plus one
    cycle per segment; pure ACKs at 3 + beats cycles each, 5 + beats with timestamps (walked
    after the last beat)."""
    rng = random.Random(3)
    for kw, length, extra in [(dict(options=TIMESTAMPS, payload=bytes(1448)), 1480, 1),
                              (dict(), 20, 3), (dict(options=TIMESTAMPS), 32, 5)]:
        cases = [case_of(build(rng, **kw)) for _ in range(10)]
        _, cycles = measure(n, cases)
        assert cycles == 9 * (-(-length // n) + extra), (kw, cycles)

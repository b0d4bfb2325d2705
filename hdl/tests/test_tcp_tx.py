# amaranth: UnusedElaboratable=no
"""TcpTx reading a TxRing, against scapy and a bytearray copy of the rings, widths 1, 8, 64.

Random segments (data at random alignments and lengths, some beyond ``max_payload``; pure ACKs;
SYNs with options, some with a stray length; FIN and RST) with random idle and stall cycles on
every stream: each segment is parsed by scapy, every field and option checked, its payload
compared with the ring's bytes, and its checksum compared with scapy's and verified over the
pseudo-header; the IP requests, the ring reads (none for segments without payload) and the
segment counter are checked too. Then the sustained rate with 50 back-to-back 1460-byte
segments, and the Verilog lint.
"""

import ipaddress
import random
import subprocess

import pytest
from amaranth import Elaboratable, Module
from amaranth.back import verilog
from amaranth.lib import wiring
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import ARP, Ether

from iwarp_model.wire.net import internet_checksum, pseudo_header
from iwarp_nic.ip import IpStack
from iwarp_nic.tcp.layouts import ACK, FIN, PSH, RST, SYN
from iwarp_nic.tcp.ring import TxRing
from iwarp_nic.tcp.tx import TcpTx
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.3
WIDTHS = (1, 2, 8, 64)  # 2: the ECPIX-5 server's width
CONNS = 3
OUR_MAC, OUR_IP = "02:00:00:00:00:01", "10.0.0.1"
PEER_MAC, PEER_IP = "02:00:00:00:00:02", "10.0.0.2"


class RingAndTx(Elaboratable):
    """A TcpTx reading its payloads from a TxRing, as the engine joins them; with ``stack``,
    its segments go to an IpStack."""

    def __init__(self, n, ring_bytes, max_payload, *, stack=False):
        self.ring = TxRing(n, CONNS, ring_bytes)
        self.tx = TcpTx(n, CONNS, max_payload=max_payload)
        self.stack = IpStack(n, arp_entries=2) if stack else None

    def elaborate(self, platform):
        m = Module()
        m.submodules.ring = self.ring
        m.submodules.tx = self.tx
        wiring.connect(m, self.tx.o_read, self.ring.i_read)
        wiring.connect(m, self.ring.o_data, self.tx.i_data)
        if self.stack is not None:
            m.submodules.stack = self.stack
            wiring.connect(m, self.tx.o_header, self.stack.i_tcp_header)
            wiring.connect(m, self.tx.o, self.stack.i_tcp_payload)
            m.d.comb += self.tx.ip.eq(self.stack.ip)
        return m


def ip_int(text):
    return int(ipaddress.IPv4Address(text))


def random_record(rng, ring_bytes, max_payload):
    """A TxSegment record of a random kind, as a dict of its fields."""
    kind = rng.choice(["data", "data", "data", "ack", "sack", "syn", "fin", "rst"])
    record = {
        "conn": rng.randrange(CONNS), "dst_ip": rng.getrandbits(32),
        "src_port": rng.getrandbits(16), "dst_port": rng.getrandbits(16),
        "seq": rng.getrandbits(32), "ack": rng.getrandbits(32), "window": rng.getrandbits(16),
        "flags": ACK, "syn_opts": 0, "syn_ws": rng.getrandbits(1),
        "syn_sack": rng.getrandbits(1), "mss": rng.getrandbits(16), "ws": rng.getrandbits(4),
        "sack": 0, "sack_left": rng.getrandbits(32), "sack_right": rng.getrandbits(32),
        "length": 0,
    }
    if kind == "data":
        record["flags"] = rng.choice([ACK, ACK | PSH, ACK | FIN])
        most = min(ring_bytes, max_payload + 40)
        record["length"] = rng.choice([1, 2, rng.randint(1, most), most])
    elif kind == "syn":
        record["flags"] = rng.choice([SYN, SYN | ACK])
        record["syn_opts"] = rng.random() < 0.8
        record["sack"] = rng.random() < 0.2                          # SYN options win
        record["length"] = rng.choice([0, 0, rng.randint(1, 100)])   # ignored with options
    elif kind == "sack":
        record["sack"] = 1
        record["length"] = rng.choice([0, 0, rng.randint(1, 100)])   # ignored with options
    elif kind == "fin":
        record["flags"] = ACK | FIN
    elif kind == "rst":
        record["flags"] = rng.choice([RST, RST | ACK])
    return record


def payload_length(record, max_payload):
    return 0 if record["syn_opts"] or record["sack"] else min(record["length"], max_payload)


def check_segment(wire, record, payload):
    """``wire`` is the segment TcpTx sent for ``record`` with ``payload``: by scapy, field by
    field, and by its checksum (scapy's own, and the RFC 1071 sum over the pseudo-header)."""
    seg = TCP(wire)
    nop = ("NOP", None)
    window_scale = [("WScale", record["ws"])] if record["syn_ws"] else [nop] * 3
    sack_ok = [("SAckOK", b"")] if record["syn_sack"] else [nop] * 2
    if record["syn_opts"]:
        options = [("MSS", record["mss"]), nop, *window_scale, nop, nop, *sack_ok]
    elif record["sack"]:
        options = [nop, nop, ("SAck", (record["sack_left"], record["sack_right"]))]
    else:
        options = []
    assert (seg.sport, seg.dport, seg.seq, seg.ack, seg.dataofs, seg.reserved, int(seg.flags),
            seg.window, seg.urgptr, seg.options) == (
        record["src_port"], record["dst_port"], record["seq"], record["ack"],
        8 if options else 5, 0, record["flags"], record["window"], 0, options)
    assert bytes(seg.payload) == payload
    assert len(wire) == 4 * seg.dataofs + len(payload)
    dst = str(ipaddress.IPv4Address(record["dst_ip"]))
    again = TCP(wire)
    again.chksum = None
    assert IP(bytes(IP(src=OUR_IP, dst=dst) / again))[TCP].chksum == seg.chksum
    pseudo = pseudo_header(ipaddress.IPv4Address(OUR_IP).packed,
                           ipaddress.IPv4Address(dst).packed, 6, len(wire))
    assert internet_checksum(pseudo + wire) == 0


def fill_rings(rng, n, ring_bytes):
    """Random contents for every ring, and the write requests and packets that store them."""
    rings = [bytes(rng.getrandbits(8) for _ in range(ring_bytes)) for _ in range(CONNS)]
    requests, packets = [], []
    for conn, ring in enumerate(rings):
        # Two writes per ring, from a random point: both wrap-around and alignment vary.
        start = rng.randrange(ring_bytes)
        cut = rng.randint(1, ring_bytes - 1)
        for seq, length in ((start, cut), (start + cut, ring_bytes - cut)):
            requests.append({"conn": conn, "seq": seq % 2**32, "length": length})
            packets.append(bytes(ring[(seq + k) % ring_bytes] for k in range(length)))
    return rings, requests, packets


async def write_rings(ctx, ring, requests, packets, n, rng=None):
    bus = AmaranthBus(ctx)
    for req, packet in zip(requests, packets):
        await send(bus, StreamPort.amaranth(ring.i_write), [req], rng=rng, idle=IDLE)
        await send_packets(bus, StreamPort.amaranth(ring.i_data), [packet], n, rng=rng,
                           idle=IDLE)
        await recv(bus, StreamPort.amaranth(ring.o_written), 1)


async def watch(ctx, iface, out, state):
    """Record every transfer of ``iface`` until ``state['done']``."""
    names = ("conn", "seq", "length")
    while not state.get("done"):
        _, _, valid, ready, *values = await ctx.tick().sample(
            iface.valid, iface.ready, *(iface.payload[name] for name in names))
        if valid and ready:
            out.append(dict(zip(names, values)))


@pytest.mark.parametrize("n", WIDTHS)
def test_against_scapy(n):
    rng = random.Random(300 + n)
    ring_bytes, max_payload = (256, 120) if n == 1 else (1024, 300)
    dut = RingAndTx(n, ring_bytes, max_payload)
    tx = dut.tx
    rings, requests, packets = fill_rings(rng, n, ring_bytes)
    records = [random_record(rng, ring_bytes, max_payload) for _ in range(40 if n == 1 else 120)]
    records[:4] = [dict(records[0], syn_opts=1, flags=SYN, length=0),   # at least one of each
                   dict(records[1], syn_opts=0, sack=0, flags=ACK, length=0),
                   dict(records[2], syn_opts=0, sack=0, flags=ACK, length=max_payload + 7),
                   dict(records[3], syn_opts=0, sack=1, flags=ACK, length=0)]
    reads, state, got = [], {}, {}

    async def driver(ctx):
        ctx.set(tx.ip, ip_int(OUR_IP))
        await write_rings(ctx, dut.ring, requests, packets, n, rng)
        await send(AmaranthBus(ctx), StreamPort.amaranth(tx.i_seg), records, rng=rng,
                   idle=IDLE)

    async def headers(ctx):
        got["headers"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(tx.o_header),
                                    len(records), rng=rng, stall=STALL, timeout=100_000)

    async def segments(ctx):
        got["segments"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(tx.o),
                                             len(records), n, rng=rng, stall=STALL,
                                             timeout=100_000)
        for _ in range(20):
            await ctx.tick()
        state["done"] = True
        got["count"] = ctx.get(tx.segments)

    async def read_watch(ctx):
        await watch(ctx, tx.o_read, reads, state)

    run(dut, driver, headers, segments, read_watch, name=f"tcp_tx_w{n}")

    expected_reads = []
    for record, header, wire in zip(records, got["headers"], got["segments"], strict=True):
        length = payload_length(record, max_payload)
        ring = rings[record["conn"]]
        payload = bytes(ring[(record["seq"] + k) % ring_bytes] for k in range(length))
        assert not wire.err
        check_segment(bytes(wire), record, payload)
        assert header == {"dst": record["dst_ip"], "protocol": 6, "length": len(wire)}
        if length:
            expected_reads.append({"conn": record["conn"], "seq": record["seq"],
                                   "length": length})
    assert reads == expected_reads
    assert got["count"] == len(records)


def test_through_ip_stack():
    """Segments from TcpTx through IpStack: Ethernet frames that scapy decodes as IPv4/TCP to
    the peer, with valid IP and TCP checksums, and the segments unchanged."""
    n = 8
    rng = random.Random(77)
    ring_bytes, max_payload = 1024, 300
    dut = RingAndTx(n, ring_bytes, max_payload, stack=True)
    tx, stack = dut.tx, dut.stack
    rings, requests, packets = fill_rings(rng, n, ring_bytes)
    records = [dict(random_record(rng, ring_bytes, max_payload), dst_ip=ip_int(PEER_IP))
               for _ in range(30)]
    learn = bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP))
    learn += bytes(60 - len(learn))
    got = {}

    async def driver(ctx):
        ctx.set(stack.mac, int(OUR_MAC.replace(":", ""), 16))
        ctx.set(stack.ip, ip_int(OUR_IP))
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(stack.i), [learn], n)
        await write_rings(ctx, dut.ring, requests, packets, n, rng)
        await send(AmaranthBus(ctx), StreamPort.amaranth(tx.i_seg), records, rng=rng,
                   idle=IDLE)

    async def frames(ctx):
        got["frames"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(stack.o),
                                           1 + len(records), n, rng=rng, stall=STALL,
                                           timeout=100_000)

    run(dut, driver, frames, name="tcp_tx_ip_stack")
    arp_reply, *sent = got["frames"]
    assert ARP in Ether(bytes(arp_reply))
    for record, frame in zip(records, sent, strict=True):
        eth = Ether(bytes(frame))
        assert (eth.dst, eth.src) == (PEER_MAC, OUR_MAC)
        ip = eth[IP]
        assert (ip.src, ip.dst, ip.proto, ip.len) == (OUR_IP, PEER_IP, 6, len(eth) - 14)
        assert internet_checksum(bytes(frame)[14:34]) == 0
        length = payload_length(record, max_payload)
        ring = rings[record["conn"]]
        check_segment(bytes(ip.payload), record,
                      bytes(ring[(record["seq"] + k) % ring_bytes] for k in range(length)))


@pytest.mark.parametrize("n", WIDTHS)
def test_line_rate(n):
    """50 back-to-back 1460-byte segments at consecutive sequence numbers, the outputs always
    ready: output beats over the cycles from the first to the last must be at least 0.99."""
    rng = random.Random(400 + n)
    count, length = 50, 1460
    ring_bytes = 8192
    dut = RingAndTx(n, ring_bytes, 1460)
    tx = dut.tx
    rings, requests, packets = fill_rings(rng, n, ring_bytes)
    first = rng.getrandbits(32)
    records = [{"conn": 1, "dst_ip": ip_int("10.0.0.2"), "src_port": 4791, "dst_port": 5000,
                "seq": (first + k * length) % 2**32, "ack": 7, "flags": ACK, "window": 65535,
                "syn_opts": 0, "syn_ws": 0, "syn_sack": 0, "mss": 0, "ws": 0, "sack": 0,
                "sack_left": 0, "sack_right": 0, "length": length}
               for k in range(count)]
    beats = count * -(-(20 + length) // n)
    state, got = {}, {}

    async def driver(ctx):
        ctx.set(tx.ip, ip_int(OUR_IP))
        await write_rings(ctx, dut.ring, requests, packets, n)
        state["start"] = True
        await send(AmaranthBus(ctx), StreamPort.amaranth(tx.i_seg), records)

    async def headers(ctx):
        await recv(AmaranthBus(ctx), StreamPort.amaranth(tx.o_header), count, timeout=100_000)

    async def sink(ctx):
        ctx.set(tx.o.ready, 1)
        cycle, taken, first_beat, wires, current = 0, 0, None, [], bytearray()
        while taken < beats:
            _, _, valid, data, keep, last = await ctx.tick().sample(
                tx.o.valid, tx.o.payload.data, tx.o.payload.keep, tx.o.payload.last)
            if valid:
                first_beat = cycle if first_beat is None else first_beat
                taken += 1
                current += data.to_bytes(n, "little")[:keep.bit_length()]
                if last:
                    wires.append(bytes(current))
                    current = bytearray()
            cycle += 1
        got["cycles"] = cycle - first_beat
        got["wires"] = wires

    run(dut, driver, headers, sink, name=f"tcp_tx_rate_w{n}")
    assert len(got["wires"]) == count
    for record, wire in zip(records, got["wires"]):
        ring = rings[1]
        check_segment(wire, record,
                      bytes(ring[(record["seq"] + k) % ring_bytes] for k in range(length)))
    rate = beats / got["cycles"]
    print(f"width {n}: {beats} beats in {got['cycles']} cycles, rate {rate:.4f}")
    assert rate >= 0.99


@pytest.mark.parametrize("n", WIDTHS)
def test_lint(n, tmp_path):
    """The Verilog passes ``verilator --lint-only -Wall`` with the project's waivers."""
    toolchain.setup()
    path = tmp_path / "tcp_tx.v"
    path.write_text(verilog.convert(TcpTx(n, 3), name="tcp_tx"))
    done = subprocess.run(["verilator", "--lint-only", "-Wall", "-Wno-DECLFILENAME",
                           "-Wno-UNUSEDSIGNAL", "-Wno-PROCASSINIT", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_parameters():
    for bad in (0, 65535 - 39, "1460"):
        with pytest.raises(ValueError, match="max_payload"):
            TcpTx(8, 2, max_payload=bad)
    with pytest.raises(ValueError, match="data_bytes"):
        TcpTx(3, 2)
    with pytest.raises(ValueError, match="conns"):
        TcpTx(8, 0)

# amaranth: UnusedElaboratable=no
"""IpStack against scapy and the model's codecs (iwarp_model.wire.net), widths 1, 8 and 64,
with random idle and stall cycles on every stream.

RX: ARP request -> byte-exact reply; pings of random sizes -> echo replies with valid checksums
(a corrupted request -> no reply; one arriving while the resolver waits for an ARP reply ->
answered once it comes, the receive side never held up);
bad datagrams (checksum, options, fragments, other IP, truncated, bad frame, unknown protocol or
EtherType, other MAC) dropped with the right counter and no effect on their neighbours; TCP
datagrams delivered with their header fields and trimmed payload. TX: TCP requests leave as
frames scapy decodes with correct checksums; resolution by ARP (the datagram parked, the
others going on), retries and timeout.
"""

import ipaddress
import random

import pytest
from amaranth import Value
from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from iwarp_model.wire.net import IcmpEcho, IPv4Packet, internet_checksum
from iwarp_nic.ip import IpStack
from iwarp_nic.ip.park import PARK_BYTES
from iwarp_nic.ip.stack import COUNTERS
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, Packet, from_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, send, send_packets

IDLE = STALL = 0.25
WIDTHS = (1, 2, 8, 64)  # 2: the ECPIX-5 server's width
OUR_MAC, OUR_IP = "02:00:00:00:00:01", "10.0.0.1"
PEER_MAC, PEER_IP = "02:00:00:00:00:02", "10.0.0.2"
MAC2, IP2 = "02:00:00:00:00:03", "10.0.0.3"
IP3 = "10.0.0.4"                         # nobody answers for it
MAC3, IP4 = "02:00:00:00:00:05", "10.0.0.5"
TIMEOUT, RETRIES = 300, 3


def mac_int(text):
    return int(text.replace(":", ""), 16)


def ip_int(text):
    return int(ipaddress.IPv4Address(text))


def frame(pkt, err=False):
    """A frame as the MAC delivers it: padded to 60 bytes, no FCS."""
    data = bytes(pkt)
    return Packet(data + bytes(max(0, 60 - len(data))), err)


def ip_to_us(payload, **ip):
    return Ether(dst=OUR_MAC, src=PEER_MAC) / IP(src=PEER_IP, dst=OUR_IP, **ip) / payload


def dut(n):
    return IpStack(n, arp_entries=4, arp_retries=RETRIES, arp_timeout=TIMEOUT)


class Collector:
    """Accepts every transfer of a stream with random ``ready``, until ``state['done']``;
    none while ``state['hold']``."""

    def __init__(self, port, rng, state):
        self.port, self.rng, self.state, self.got = port, rng, state, []
        self.count = 0                          # whole packets (or transfers, without last)

    async def run(self, ctx):
        bus = AmaranthBus(ctx)
        names = list(self.port.fields)
        signals = [self.port.valid] + [self.port.fields[k] for k in names]
        while not self.state.get("done"):
            ready = not self.state.get("hold") and self.rng.random() >= STALL
            bus.set(self.port.ready, int(ready))
            valid, *values = await bus.edge(*signals)
            if ready and valid:
                self.got.append(dict(zip(names, values)))
                self.count += self.got[-1].get("last", 1)

    def packets(self, n):
        beats = [Beat(t["data"], t["keep"], t["last"], t.get("err", 0)) for t in self.got]
        whole = len(beats)
        while whole and not beats[whole - 1].last:
            whole -= 1
        return from_beats(beats[:whole], n)


def header_port(iface):
    return StreamPort(iface.valid, iface.ready, {"bits": Value.cast(iface.payload)})


async def configure(ctx, stack):
    ctx.set(stack.mac, mac_int(OUR_MAC))
    ctx.set(stack.ip, ip_int(OUR_IP))


async def wait_for(ctx, cond, limit=200_000):
    for _ in range(limit):
        if cond():
            return
        await ctx.tick()
    raise AssertionError("condition not reached")


def counters(ctx, stack):
    return {name: ctx.get(getattr(stack, name)) for name in COUNTERS}


def expected_counts(**nonzero):
    return {name: nonzero.get(name, 0) for name in COUNTERS}


def check_echo_reply(wire, request):
    """The reply to scapy ``request`` (an Ether/IP/ICMP echo request), by scapy and net.py."""
    request = Ether(bytes(request))
    assert len(wire) == 14 + request[IP].len
    eth = Ether(wire)
    assert (eth.dst, eth.src, eth.type) == (PEER_MAC, OUR_MAC, 0x0800)
    ip = IPv4Packet.decode(wire[14:], verify=True)
    assert (ip.src, ip.dst, ip.proto, ip.ttl, ip.df) == (
        ipaddress.IPv4Address(OUR_IP).packed, ipaddress.IPv4Address(PEER_IP).packed, 1, 64, True)
    assert not ip.is_fragment
    echo = IcmpEcho.decode(ip.payload, verify=True)
    req = request[ICMP]
    assert (echo.type, echo.code, echo.ident, echo.seq) == (0, 0, req.id, req.seq)
    assert echo.payload == bytes(req.payload)
    assert internet_checksum(wire[14:34]) == 0 and internet_checksum(ip.payload) == 0


# --- RX: the responder and the drops -----------------------------------------------------------

@pytest.mark.parametrize("n", WIDTHS)
def test_rx_mix(n):
    rng = random.Random(7 + n)
    stack = dut(n)
    arp_req = Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst="00:00:00:00:00:00", pdst=OUR_IP)
    arp_reply = bytes(Ether(dst=PEER_MAC, src=OUR_MAC) / ARP(
        op=2, hwsrc=OUR_MAC, psrc=OUR_IP, hwdst=PEER_MAC, pdst=PEER_IP))
    most = 60 if n == 1 else 300
    pings, tcps, bad = [], [], []
    for i in range(6 if n == 1 else 16):
        data = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, rng.randint(2, most)])))
        pings.append(Ether(bytes(ip_to_us(ICMP(type=8, id=rng.getrandbits(16), seq=i)
                                          / Raw(data)))))
    # One request with a data byte corrupted: no reply leaves.
    corrupt = bytearray(bytes(ip_to_us(ICMP(type=8, id=1, seq=99) / Raw(b"ping" * 5))))
    corrupt[-1] ^= 0x10
    for _ in range(6 if n == 1 else 16):
        data = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, rng.randint(2, most)])))
        tcps.append(ip_to_us(TCP(sport=rng.getrandbits(16), dport=4791, seq=rng.getrandbits(32),
                                 flags="PA") / Raw(data), id=rng.getrandbits(16)))
    tcp_bytes = bytes(TCP(dport=9) / Raw(b"x" * 30))
    bad_ck = ip_to_us(Raw(tcp_bytes), proto=6)
    bad_ck = bytearray(bytes(bad_ck))
    bad_ck[24] ^= 0x5A                                       # IPv4 checksum byte
    truncated = bytes(ip_to_us(Raw(tcp_bytes), proto=6))
    bad = [  # (frame, counter)
        (frame(bytes(bad_ck)), "rx_bad_checksum"),
        (frame(ip_to_us(Raw(tcp_bytes), proto=6, options=b"\x01\x01\x01\x00")), "rx_options"),
        (frame(ip_to_us(Raw(tcp_bytes), proto=6, flags="MF")), "rx_fragment"),
        (frame(ip_to_us(Raw(tcp_bytes), proto=6, frag=3)), "rx_fragment"),
        (frame(Ether(dst=OUR_MAC) / IP(src=PEER_IP, dst="10.9.9.9", proto=6) / Raw(tcp_bytes)),
         "rx_not_ours"),
        (frame(ip_to_us(Raw(tcp_bytes), proto=6, version=6)), "rx_bad_header"),
        (Packet(truncated[:14 + 12]), "rx_truncated"),      # header cut short
        (Packet(truncated[:-10]), "rx_truncated"),          # shorter than Total Length
        (frame(ip_to_us(Raw(tcp_bytes), proto=6), err=True), "rx_frame_err"),
        (frame(ip_to_us(Raw(b"\x00" * 20), proto=17)), "ip_protocol"),
        (frame(Ether(dst=OUR_MAC, src=PEER_MAC, type=0x86DD) / Raw(b"\x00" * 50)),
         "eth_ethertype"),
        (frame(Ether(dst=MAC2, src=PEER_MAC) / IP(dst=OUR_IP) / Raw(tcp_bytes)), "eth_not_ours"),
        (Packet(bytes(Ether(dst=OUR_MAC, src=PEER_MAC))[:10]), "eth_runt"),
        (frame(ip_to_us(ICMP(type=13) / Raw(b"\x00" * 12))), "icmp_dropped"),
        (frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=MAC2) / ARP(
            op=1, hwsrc=MAC2, psrc=IP2, pdst="10.0.0.77")), "arp_rx_request"),   # not for us
        (frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=MAC2) / ARP(
            hwtype=6, op=1, hwsrc=MAC2, psrc=IP2, pdst=OUR_IP)), "arp_rx_bad"),
        (frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=MAC2) / ARP(
            op=1, hwsrc=MAC2, psrc=IP2, pdst=OUR_IP), err=True), "arp_rx_bad"),
        (Packet(bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=MAC2) / ARP(
            op=1, hwsrc=MAC2, psrc=IP2, pdst=OUR_IP))[:14 + 20]), "arp_rx_bad"),  # too short
    ]
    # Delivered by Ipv4Rx although bad: to TCP with err on the last payload beat (TCP drops
    # them), and to the protocol demux / ICMP which drop them.
    to_tcp_with_err = {"rx_truncated": 1, "rx_frame_err": 1}
    delivered_bad = ("rx_truncated", "rx_frame_err", "ip_protocol", "icmp_dropped")
    # ARP first (it teaches the cache the peer, for the echo replies), the rest shuffled.
    items = [("ping", p) for p in pings] + [("tcp", t) for t in tcps] + \
        [("bad", b) for b in bad] + [("corrupt", Packet(bytes(corrupt)))]
    rng.shuffle(items)
    frames = [frame(arp_req)] + [x[0] if k == "bad" else frame(x) for k, x in items]
    expect_tcp = []                                          # (scapy packet, err)
    for k, x in items:
        if k == "tcp":
            expect_tcp.append((Ether(bytes(x)), False))
        elif k == "bad" and x[1] in to_tcp_with_err and x[0][12:14] == b"\x08\x00" \
                and len(x[0]) > 40:
            expect_tcp.append((Ether(bytes(x[0])), True))
    expect_ping = [x for k, x in items if k == "ping"]
    nonzero = {}
    for _, name in [x for k, x in items if k == "bad"]:
        nonzero[name] = nonzero.get(name, 0) + 1
    delivered = len(tcps) + len(expect_ping) + 1 + sum(
        1 for k, x in items if k == "bad" and x[1] in delivered_bad and len(x[0]) > 40)
    nonzero.update(rx_delivered=delivered, arp_rx_request=nonzero["arp_rx_request"] + 1,
                   arp_tx_reply=1, icmp_bad_checksum=1)

    state = {}
    out = Collector(StreamPort.amaranth(stack.o), rng, state)
    tcp_hdr = Collector(header_port(stack.o_tcp_header), rng, state)
    tcp_pay = Collector(StreamPort.amaranth(stack.o_tcp_payload), rng, state)

    async def driver(ctx):
        await configure(ctx, stack)
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(stack.i), frames, n,
                           rng=rng, idle=IDLE)
        # Every request answered or refused for want of room (icmp_busy), every reply out.
        await wait_for(ctx, lambda: ctx.get(stack.icmp_replies) + ctx.get(stack.icmp_busy)
                       == len(expect_ping) and out.count == 1 + ctx.get(stack.icmp_replies)
                       and len(tcp_hdr.got) == len(expect_tcp))
        for _ in range(50):
            await ctx.tick()
        state["done"] = True
        state["counters"] = counters(ctx, stack)

    run(stack, driver, out.run, tcp_hdr.run, tcp_pay.run, name=f"ip_rx_w{n}")

    sent = out.packets(n)
    arps = [p for p in sent if p[12:14] == b"\x08\x06"]
    echoes = [p for p in sent if p[12:14] == b"\x08\x00"]
    assert [bytes(p) for p in arps] == [arp_reply]
    # The replies are those of the requests not refused, in order.
    answered = iter(expect_ping)
    for wire in echoes:
        assert not wire.err
        seq = Ether(bytes(wire))[ICMP].seq
        request = next(x for x in answered if Ether(bytes(x))[ICMP].seq == seq)
        check_echo_reply(bytes(wire), request)
    refused = len(expect_ping) - len(echoes)
    assert refused <= len(expect_ping) // 2, f"{refused} of {len(expect_ping)} pings refused"
    nonzero.update(icmp_replies=len(echoes), tx_sent=len(echoes), icmp_busy=refused)

    layout = stack.o_tcp_header.payload.shape()
    payloads = tcp_pay.packets(n)
    assert len(tcp_hdr.got) == len(payloads) == len(expect_tcp)
    for got, pay, (pkt, err) in zip(tcp_hdr.got, payloads, expect_tcp, strict=True):
        h = layout.from_bits(got["bits"])
        ip = pkt[IP]
        assert pay.err == err
        if err:
            continue
        assert h.has_payload == 1
        assert (h.fields.src, h.fields.dst, h.fields.protocol, h.fields.total_length,
                h.fields.identification, h.fields.ttl) == (
            ip_int(ip.src), ip_int(ip.dst), 6, ip.len, ip.id, ip.ttl)
        assert bytes(pay) == bytes(ip.payload)
    assert state["counters"] == expected_counts(**nonzero)


@pytest.mark.parametrize("n", WIDTHS)
def test_arp_burst_while_tx_waits(n):
    """ARP requests for us from eight senders, back to back, while nothing leaves the stack:
    the receive side takes them at its full rate (it never waits for TX), the ones that find
    a reply already waiting go unanswered (``arp_reply_busy``), and once TX moves every reply
    made leaves byte-exact, to its own requester. A request after that is answered."""
    rng = random.Random(40 + n)
    stack = dut(n)
    senders = [(f"02:00:00:00:01:{k:02x}", f"10.0.1.{k}") for k in range(1, 10)]

    def request(mac, ip):
        return frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=mac) / ARP(
            op=1, hwsrc=mac, psrc=ip, hwdst="00:00:00:00:00:00", pdst=OUR_IP))

    def reply(mac, ip):
        return bytes(Ether(dst=mac, src=OUR_MAC) / ARP(op=2, hwsrc=OUR_MAC, psrc=OUR_IP,
                                                      hwdst=mac, pdst=ip))

    burst = [request(*s) for s in senders[:-1]]
    beats = sum(-(-len(f) // n) for f in burst)
    state = {"hold": True, "now": 0}
    out = Collector(StreamPort.amaranth(stack.o), rng, state)

    async def clock(ctx):
        while not state.get("done"):
            await ctx.tick()
            state["now"] += 1

    async def driver(ctx):
        bus = AmaranthBus(ctx)
        await configure(ctx, stack)
        port_i = StreamPort.amaranth(stack.i)
        begin = state["now"]
        await send_packets(bus, port_i, burst, n)
        await wait_for(ctx, lambda: ctx.get(stack.arp_rx_request) == len(burst))
        state["cycles"] = state["now"] - begin
        state["busy"] = ctx.get(stack.arp_reply_busy)
        state["hold"] = False
        await wait_for(ctx, lambda: out.count == ctx.get(stack.arp_tx_reply))
        await send_packets(bus, port_i, [request(*senders[-1])], n)
        await wait_for(ctx, lambda: out.count == len(burst) + 1 - state["busy"])
        state["done"] = True
        state["counters"] = counters(ctx, stack)

    run(stack, driver, out.run, clock, name=f"ip_arp_burst_w{n}")
    # The burst was taken as it came: each request costs its beats and a few cycles, however
    # long TX is held.
    assert state["cycles"] <= beats + 4 * len(burst) + 16, (
        f"{state['cycles']} cycles to take {beats} beats")
    c = state["counters"]
    answered = c["arp_tx_reply"]
    assert c["arp_reply_busy"] == state["busy"] >= 1 and answered + state["busy"] == len(
        burst) + 1
    sent = [bytes(p) for p in out.packets(n)]
    assert len(sent) == answered
    # The replies leave in request order, each to its requester; the last to the late one.
    targets = iter(senders)
    for wire in sent:
        assert any(wire == reply(*t) for t in targets), "a reply not to a requester, or late"
    assert sent[-1] == reply(*senders[-1])
    assert (c["arp_rx_request"], c["arp_rx_bad"], c["rx_delivered"]) == (len(burst) + 1, 0, 0)


@pytest.mark.parametrize("n", WIDTHS)
def test_truncated_back_to_back(n):
    """Datagrams cut short of their Total Length, each followed at once by an IPv4 packet too
    short for a header (a runt), every cut and runt length: each is counted in
    ``rx_truncated``, also when the two are found in one cycle (the parser drops the runt as
    the datagram before it ends). The same one layer down: Ethernet headers alone, each
    followed by a frame shorter than a header, all counted in ``eth_runt``."""
    rng = random.Random(60 + n)
    stack = dut(n)
    whole = bytes(ip_to_us(Raw(bytes(TCP(dport=9) / Raw(b"t" * 40))), proto=6))
    pairs = [(Packet(whole[:-cut]), Packet(whole[:14 + short], True))
             for cut in range(1, 41) for short in (1, 7, 12, 19)]
    header = whole[:14]
    pairs += [(Packet(header), Packet(header[:short], True)) for short in range(1, 14)]
    rng.shuffle(pairs)
    frames = [f for pair in pairs for f in pair]
    runts = sum(len(f) <= 14 for f in frames)
    state = {}
    tcp_hdr = Collector(header_port(stack.o_tcp_header), rng, state)
    tcp_pay = Collector(StreamPort.amaranth(stack.o_tcp_payload), rng, state)

    async def driver(ctx):
        await configure(ctx, stack)
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(stack.i), frames, n)
        await wait_for(ctx, lambda: ctx.get(stack.rx_truncated) == len(frames) - runts
                       and ctx.get(stack.eth_runt) == runts)
        state["done"] = True

    run(stack, driver, tcp_hdr.run, tcp_pay.run, name=f"ip_truncated_w{n}")
    assert all(p.err for p in tcp_pay.packets(n))


# --- TX: TCP datagrams out, resolution, retries and timeout ---------------------------------------

@pytest.mark.parametrize("n", WIDTHS)
def test_tx_and_resolver(n):
    """TCP datagrams leave as frames scapy decodes. A datagram to an unknown address is parked
    while its ARP request is out, and the datagrams behind it do not wait: one to a known
    address leaves at once, one that also misses is discarded (``tx_unresolved``). The answer
    releases the parked one. Nobody answers for IP3: RETRIES requests, then the parked datagram
    is thrown away (``arp_resolve_fail``), while a datagram to the peer sent meanwhile left
    before the last request; the park is free again after that."""
    rng = random.Random(90 + n)
    # Long enough that IP2 is asked once before its answer comes.
    stack = IpStack(n, arp_entries=4, arp_retries=RETRIES, arp_timeout=10 * TIMEOUT)
    learn = frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP))

    def answer(mac, ip):
        return frame(Ether(dst=OUR_MAC, src=mac) / ARP(op=2, hwsrc=mac, psrc=ip, hwdst=OUR_MAC,
                                                         pdst=OUR_IP))

    def segment(dst):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40 if n == 1 else 400)))
        return dst, bytes(TCP(sport=4791, dport=rng.getrandbits(16), flags="A") / Raw(data))

    plan = [segment(PEER_IP) for _ in range(3 if n == 1 else 6)]
    to_ip2, lost, mid = segment(IP2), segment(IP3), segment(PEER_IP)
    to_ip3, after, to_ip4 = segment(IP3), segment(PEER_IP), segment(IP4)
    state = {}
    out = Collector(StreamPort.amaranth(stack.o), rng, state)

    async def tcp_send(ctx, dst, seg):
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(stack.i_tcp_header),
                   [{"dst": ip_int(dst), "protocol": 6, "length": len(seg)}], rng=rng, idle=IDLE)
        await send_packets(bus, StreamPort.amaranth(stack.i_tcp_payload), [seg], n,
                           rng=rng, idle=IDLE)

    async def driver(ctx):
        bus_i = AmaranthBus(ctx)
        await configure(ctx, stack)
        port_i = StreamPort.amaranth(stack.i)
        await send_packets(bus_i, port_i, [learn], n)
        await wait_for(ctx, lambda: out.count == 1)            # the ARP reply
        for dst, seg in plan:
            await tcp_send(ctx, dst, seg)
        base = 1 + len(plan)
        await wait_for(ctx, lambda: out.count == base)
        # IP2 is parked; a second miss is discarded; the peer's datagram leaves meanwhile.
        for dst, seg in (to_ip2, lost, mid):
            await tcp_send(ctx, dst, seg)
        await wait_for(ctx, lambda: out.count == base + 2)     # ARP request, `mid`
        await send_packets(bus_i, port_i, [answer(MAC2, IP2)], n)
        await wait_for(ctx, lambda: out.count == base + 3)     # the parked datagram
        # Nobody answers for IP3: the peer's datagram behind it does not wait.
        await tcp_send(ctx, *to_ip3)
        await tcp_send(ctx, *after)
        await wait_for(ctx, lambda: out.count == base + 4 + RETRIES)
        await wait_for(ctx, lambda: ctx.get(stack.arp_resolve_fail) == 1)
        await ctx.tick().repeat(PARK_BYTES // n)   # the park throws away a beat per cycle
        # The park is free again: IP4 is parked, resolved and sent.
        await tcp_send(ctx, *to_ip4)
        await wait_for(ctx, lambda: out.count == base + 5 + RETRIES)
        await send_packets(bus_i, port_i, [answer(MAC3, IP4)], n)
        await wait_for(ctx, lambda: out.count == base + 6 + RETRIES)
        state["done"] = True
        state["counters"] = counters(ctx, stack)

    run(stack, driver, out.run, name=f"ip_tx_w{n}")
    sent = [bytes(p) for p in out.packets(n)]
    assert not any(p.err for p in out.packets(n))

    def check_tcp(wire, dst_mac, dst_ip, seg):
        eth = Ether(wire)
        assert (eth.dst, eth.src, eth.type) == (dst_mac, OUR_MAC, 0x0800)
        ip = eth[IP]
        assert (ip.src, ip.dst, ip.proto, ip.len, ip.ihl, ip.flags.DF) == (
            OUR_IP, dst_ip, 6, 20 + len(seg), 5, True)
        assert internet_checksum(wire[14:34]) == 0
        assert bytes(ip.payload) == seg
        rebuilt = IP(bytes(ip))
        del rebuilt.chksum
        assert IP(bytes(rebuilt)).chksum == ip.chksum

    def arp_request(target):
        return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=OUR_MAC) / ARP(
            op=1, hwsrc=OUR_MAC, psrc=OUR_IP, hwdst="00:00:00:00:00:00", pdst=target))

    k = 1
    for dst, seg in plan:
        check_tcp(sent[k], PEER_MAC, dst, seg)
        k += 1
    # The request for IP2 and `mid` in either order (`mid` may pass the parked datagram's
    # payload on its way into the park), then the parked datagram.
    pair = sorted(sent[k:k + 2], key=lambda wire: wire[12:14] != b"\x08\x06")
    assert pair[0] == arp_request(IP2)
    check_tcp(pair[1], PEER_MAC, PEER_IP, mid[1])
    check_tcp(sent[k + 2], MAC2, IP2, to_ip2[1])
    k += 3
    # IP3's requests, with `after` among them and never after the last.
    tail = sent[k:k + RETRIES + 1]
    tcp_at = [j for j, wire in enumerate(tail) if wire[12:14] == b"\x08\x00"]
    assert len(tcp_at) == 1 and tcp_at[0] < RETRIES, "the peer's datagram waited for IP3"
    check_tcp(tail[tcp_at[0]], PEER_MAC, PEER_IP, after[1])
    assert [w for j, w in enumerate(tail) if j != tcp_at[0]] == [arp_request(IP3)] * RETRIES
    k += RETRIES + 1
    assert sent[k] == arp_request(IP4)
    check_tcp(sent[k + 1], MAC3, IP4, to_ip4[1])
    c = state["counters"]
    assert (c["tx_sent"], c["tx_unresolved"], c["arp_resolve_fail"], c["arp_tx_request"]) == (
        len(plan) + 4, 1, 1, RETRIES + 2)
    idents = [int.from_bytes(p[18:20], "big") for p in sent if p[12:14] == b"\x08\x00"]
    assert len(set(idents)) == len(idents)


@pytest.mark.parametrize("n", WIDTHS)
def test_echo_while_resolving(n):
    """A datagram to an address not in the cache is parked while its ARP request is out; an
    echo request arrives, then the ARP reply. Both are taken and answered: one ARP request, the
    echo reply and the datagram sent, nothing unresolved. (TX used to wait for the resolver
    here, and the echo reply with it.)"""
    rng = random.Random(300 + n)
    stack = IpStack(n, arp_entries=4, arp_retries=RETRIES, arp_timeout=20_000)  # > the ping
    learn = frame(Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst="00:00:00:00:00:00", pdst=OUR_IP))
    answer = frame(Ether(dst=OUR_MAC, src=MAC2) / ARP(
        op=2, hwsrc=MAC2, psrc=IP2, hwdst=OUR_MAC, pdst=OUR_IP))
    ping = ip_to_us(ICMP(type=8, id=7, seq=1) / Raw(rng.randbytes(1000)))
    seg = bytes(TCP(sport=4791, dport=80, flags="A") / Raw(rng.randbytes(100)))
    state = {}
    out = Collector(StreamPort.amaranth(stack.o), rng, state)

    async def driver(ctx):
        bus_i, tx = AmaranthBus(ctx), AmaranthBus(ctx)
        await configure(ctx, stack)
        port_i = StreamPort.amaranth(stack.i)
        await send_packets(bus_i, port_i, [learn], n)
        await wait_for(ctx, lambda: out.count == 1)            # the ARP reply
        await send(tx, StreamPort.amaranth(stack.i_tcp_header),
                   [{"dst": ip_int(IP2), "protocol": 6, "length": len(seg)}])
        await send_packets(tx, StreamPort.amaranth(stack.i_tcp_payload), [seg], n)
        await wait_for(ctx, lambda: out.count == 2)            # the ARP request for IP2
        await send_packets(bus_i, port_i, [frame(ping), answer], n)
        await wait_for(ctx, lambda: out.count == 4)
        state["done"] = True
        state["counters"] = counters(ctx, stack)

    run(stack, driver, out.run, name=f"ip_echo_resolving_w{n}")
    sent = [bytes(p) for p in out.packets(n)]
    assert Ether(sent[1])[ARP].pdst == IP2
    to_ip2, reply = sorted(sent[2:4], key=lambda wire: Ether(wire)[IP].dst != IP2)
    assert Ether(to_ip2)[IP].dst == IP2 and bytes(Ether(to_ip2)[IP].payload) == seg
    check_echo_reply(reply, ping)
    c = state["counters"]
    assert (c["arp_tx_request"], c["tx_unresolved"], c["icmp_replies"], c["tx_sent"]) == (
        1, 0, 1, 2)

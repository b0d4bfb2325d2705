"""The raw-frame endpoint: ARP, ping, bad frames, and TCP between two RawStacks through the
impairment link under a virtual clock; segments crafted and checked with scapy; and, as root,
Linux's own TCP through a TAP device in a network namespace."""

import fcntl
import hashlib
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import ARP, ICMP, IP, TCP, Ether, Raw, raw

from iwarp_model.transport.impair import Link, Pipe, VirtualClock, resegment
from iwarp_model.transport.rawtcp import RawStack, TcpConfig, TcpError, TcpState

S = TcpState
MIB = 1 << 20
PEER_MAC, PEER_IP = "02:00:00:00:00:99", "10.0.0.9"
HOST_MAC, HOST_IP = "02:00:00:00:00:01", "10.0.0.1"


def pattern(seed: bytes, n: int) -> bytes:
    block = hashlib.sha512(seed).digest()
    return (block * (n // len(block) + 1))[:n]


def establish(pipe: Pipe, port: int = 5000):
    listener = pipe.b.listen(port)
    ca = pipe.a.connect(Pipe.IP_B, port)
    assert pipe.run(lambda: listener.pending and ca.state is S.ESTABLISHED, timeout=30)
    return ca, listener.accept()


def exchange(pipe: Pipe, pairs, n: int, timeout: float = 600.0):
    """Send n distinct bytes each way on every (a, b) pair; assert byte-exact arrival."""
    expected, got = {}, {}
    for i, (ca, cb) in enumerate(pairs):
        for j, conn in enumerate((ca, cb)):
            data = pattern(b"%d-%d" % (i, j), n)
            conn.send(data)
            expected[id((cb, ca)[j])] = hashlib.sha256(data).hexdigest()
            got[id(conn)] = (conn, hashlib.sha256(), [0])
    def done():
        for conn, h, count in got.values():
            data = conn.recv()
            h.update(data)
            count[0] += len(data)
        return all(count[0] >= n for _, _, count in got.values())
    assert pipe.run(done, timeout=timeout), {id(c): k[0] for c, _, k in got.values()}
    for key, (_, h, count) in got.items():
        assert count[0] == n and h.hexdigest() == expected[key]


# ---- a RawStack driven by hand-made frames (scapy on the other side)

class Harness:
    def __init__(self, config=None, **options):
        self.clock = VirtualClock()
        self.out = []
        self.events = []
        self.stack = RawStack(HOST_MAC, HOST_IP, send_frame=self.out.append, clock=self.clock,
                              rng=random.Random(7), config=config,
                              on_event=lambda c, k: self.events.append(k), **options)

    def feed(self, packet):
        self.stack.receive_frame(raw(Ether(src=PEER_MAC, dst=HOST_MAC) / packet))

    def take(self):
        frames, self.out[:] = [Ether(f) for f in self.out], []
        return frames

    def learn_peer(self):
        self.stack.receive_frame(raw(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(
            op=1, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst="00:00:00:00:00:00", pdst=HOST_IP)))
        self.take()

    def tcp(self, **fields):
        return IP(src=PEER_IP, dst=HOST_IP) / TCP(sport=40000, dport=5000, **fields)

    def accept_connection(self, peer_isn=1000, options=(("MSS", 1460), ("NOP", None),
                                                         ("WScale", 2))):
        self.learn_peer()
        listener = self.stack.listen(5000)
        self.feed(self.tcp(flags="S", seq=peer_isn, window=65535, options=list(options)))
        (synack,) = self.take()
        tcp = synack[TCP]
        self.feed(self.tcp(flags="A", seq=peer_isn + 1, ack=tcp.seq + 1, window=4096))
        conn = listener.accept()
        assert conn is not None and conn.state is S.ESTABLISHED
        return conn, tcp


def checksums_valid(frame):
    """Recompute every checksum with scapy and compare with what the stack sent."""
    rebuilt = frame.copy()
    for layer in (IP, TCP, ICMP):
        if layer in rebuilt:
            del rebuilt[layer].chksum
    return raw(Ether(raw(rebuilt))) == raw(frame)


def test_arp_request_answered():
    h = Harness()
    h.stack.receive_frame(raw(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=HOST_IP)))
    (reply,) = h.take()
    assert reply.dst == PEER_MAC and reply.src == HOST_MAC and len(raw(reply)) == 60
    assert (reply[ARP].op, reply[ARP].hwsrc, reply[ARP].psrc) == (2, HOST_MAC, HOST_IP)
    assert (reply[ARP].hwdst, reply[ARP].pdst) == (PEER_MAC, PEER_IP)
    # a request for someone else is not answered
    h.stack.receive_frame(raw(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(
        op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst="10.0.0.77")))
    assert h.take() == [] and h.stack.counters["drop.arp_not_for_us"] == 1


def test_arp_resolution_retries_then_drops():
    h = Harness(arp_interval=0.5, arp_retries=3)
    conn = h.stack.connect(PEER_IP, 80)
    sent_at = []
    for _ in range(10):
        for frame in h.take():
            assert frame[ARP].op == 1 and frame.dst == "ff:ff:ff:ff:ff:ff"
            assert frame[ARP].pdst == PEER_IP
            sent_at.append(h.clock.now)
        h.clock.now += 0.25
        h.stack.poll()
    assert sent_at == [0.0, 0.5, 1.0]
    # the SYN and its retransmission at 1 s waited for the peer's MAC and were dropped
    assert h.stack.counters["drop.arp_unresolved"] == 2
    # the next SYN retransmission asks again; a reply releases the queued SYN
    h.clock.now = 3.0
    h.stack.poll()
    assert [f[ARP].op for f in h.take()] == [1]
    h.stack.receive_frame(raw(Ether(src=PEER_MAC, dst=HOST_MAC) / ARP(
        op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=HOST_MAC, pdst=HOST_IP)))
    (syn,) = h.take()
    assert syn.dst == PEER_MAC and syn[TCP].flags == "S" and conn.state is S.SYN_SENT


def test_ping_answered():
    h = Harness()
    h.learn_peer()
    h.feed(IP(src=PEER_IP, dst=HOST_IP, id=5) / ICMP(type=8, id=0x1234, seq=7) / (b"abc" * 20))
    (reply,) = h.take()
    assert reply[IP].src == HOST_IP and reply[IP].dst == PEER_IP
    assert (reply[ICMP].type, reply[ICMP].id, reply[ICMP].seq) == (0, 0x1234, 7)
    assert reply[ICMP].load == b"abc" * 20
    assert checksums_valid(reply)


def test_bad_frames_counted_not_raised():
    h = Harness()
    h.learn_peer()
    good = raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst=HOST_IP)
               / TCP(sport=1, dport=2, flags="S"))
    bad_ip_checksum = good[:24] + bytes([good[24] ^ 1]) + good[25:]
    bad_tcp_checksum = good[:-4] + bytes([good[-4] ^ 0x10]) + good[-3:]
    cases = {
        "truncated": [good[:10], good[:30], good[:40]],
        "checksum": [bad_ip_checksum, bad_tcp_checksum],
        "not_our_mac": [b"\x02\x00\x00\x00\x00\x55" + good[6:]],
        "not_our_ip": [raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst="10.0.0.3")
                           / TCP())],
        "fragment": [raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst=HOST_IP,
                                                                  flags="MF") / (b"x" * 16))],
        "ethertype": [raw(Ether(src=PEER_MAC, dst=HOST_MAC, type=0x86DD) / (b"x" * 46))],
        "malformed": [raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst=HOST_IP,
                                                                   version=5))],
        "protocol": [raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst=HOST_IP,
                                                                  proto=17) / (b"x" * 8))],
    }
    for reason, frames in cases.items():
        for frame in frames:
            h.stack.receive_frame(frame)
        assert h.stack.counters["drop." + reason] == len(frames), reason
    assert h.take() == []  # none of them drew an answer (not even an RST)


@settings(max_examples=300)
@given(st.binary(max_size=120), st.integers(0, 119))
def test_random_bytes_never_raise(tail, cut):
    h = Harness()
    header = raw(Ether(src=PEER_MAC, dst=HOST_MAC) / IP(src=PEER_IP, dst=HOST_IP) / TCP())
    h.stack.receive_frame(header[:cut] + tail)
    h.stack.receive_frame(tail)


def test_handshake_options_checked_with_scapy():
    pipe = Pipe(record=True)
    ca, cb = establish(pipe)
    tcp_frames = [(d, Ether(f)) for _, d, f in pipe.log if TCP in Ether(f)]
    (d1, syn), (d2, synack), (d3, ack) = tcp_frames[:3]
    assert (d1, d2, d3) == ("ab", "ba", "ab")
    assert syn[TCP].flags == "S" and synack[TCP].flags == "SA" and ack[TCP].flags == "A"
    assert dict(syn[TCP].options) == {"MSS": 1460, "NOP": None, "WScale": 3}
    assert dict(synack[TCP].options) == {"MSS": 1460, "NOP": None, "WScale": 3}
    assert synack[TCP].ack == syn[TCP].seq + 1 and ack[TCP].ack == synack[TCP].seq + 1
    assert all(checksums_valid(f) for _, f in tcp_frames[:3])
    assert ca.send_mss == cb.send_mss == 1460 and ca.snd_wscale == cb.snd_wscale == 3
    assert ack[TCP].window == (256 * 1024 >> 3) - 1 or ack[TCP].window == 256 * 1024 >> 3
    assert pipe.a.counters["arp_requests_out"] == 1 and pipe.b.counters["arp_replies_out"] == 1


def test_peer_without_window_scale_and_small_mss():
    h = Harness()
    conn, synack = h.accept_connection(options=[("MSS", 536)])
    assert "WScale" not in dict(synack.options) and dict(synack.options)["MSS"] == 1460
    assert conn.rcv_wscale == conn.snd_wscale == 0 and conn.send_mss == 536
    conn.send(b"y" * 3000)
    frames = h.take()
    assert [len(f[TCP].payload) for f in frames] == [536] * 5 + [320]
    assert all(f[TCP].window == 65535 for f in frames)


IMPAIRMENTS = {
    "clean": {},
    "loss1": {"loss": 0.01},
    "loss5": {"loss": 0.05},
    "reorder": {"reorder": 0.05},
    "duplicate": {"duplicate": 0.05},
    "corrupt": {"corrupt": 0.02},
    "everything": {"loss": 0.02, "reorder": 0.03, "duplicate": 0.03, "corrupt": 0.02},
    "resegment": {"resegment": 333, "loss": 0.01},
    "split": {"split": 1.0},
}


@pytest.mark.parametrize("name", IMPAIRMENTS)
def test_one_mib_each_way(name):
    pipe = Pipe(seed=sum(name.encode()), **IMPAIRMENTS[name])
    ca, cb = establish(pipe)
    start = pipe.clock.now
    exchange(pipe, [(ca, cb)], MIB)
    elapsed = pipe.clock.now - start
    print(f"{name}: 1 MiB each way in {elapsed:.3f} virtual s; A {dict(ca.counters)}")
    if name == "clean":
        assert ca.counters["retransmissions"] == cb.counters["retransmissions"] == 0
        assert elapsed < 0.1
    if "loss" in IMPAIRMENTS[name]:
        assert ca.counters["retransmissions"] and cb.counters["retransmissions"]
    if name == "corrupt":
        assert pipe.a.counters["drop.checksum"] + pipe.b.counters["drop.checksum"] > 0
    if name == "duplicate":
        assert cb.counters["drop.out_of_window"] > 0
    if name == "resegment":
        assert pipe.ab.counters["resegmented"] > 0 and pipe.ba.counters["resegmented"] > 0
    if name == "split":
        assert set(range(1, 500)) <= pipe.ab.split_offsets
        assert set(range(1, 500)) <= pipe.ba.split_offsets


def test_resegment_checked_with_scapy():
    """A TCP segment of 10 octets with FIN and PSH cut into 3-octet segments: scapy finds
    each one's checksums right, the sequence numbers consecutive, the payloads the original's
    in order, FIN and PSH on the last only; an ARP frame and a corrupted segment pass whole."""
    frame = raw(Ether(src=HOST_MAC, dst=PEER_MAC) / IP(src=HOST_IP, dst=PEER_IP, id=7) /
                TCP(sport=4000, dport=5000, seq=0xFFFF_FFFE, ack=99, flags="FPA", window=512) /
                b"0123456789")
    pieces = [Ether(p) for p in resegment(frame, 3)]
    assert [p[Raw].load for p in pieces] == [b"012", b"345", b"678", b"9"]
    assert [p[TCP].seq for p in pieces] == [0xFFFF_FFFE, 1, 4, 7]
    assert [str(p[TCP].flags) for p in pieces] == ["A", "A", "A", "FPA"]
    for piece in pieces:
        ip_sum, tcp_sum = piece[IP].chksum, piece[TCP].chksum
        del piece[IP].chksum, piece[TCP].chksum
        again = Ether(raw(piece))
        assert (again[IP].chksum, again[TCP].chksum) == (ip_sum, tcp_sum)
        assert (piece[IP].id, piece[TCP].ack, piece[TCP].window) == (7, 99, 512)
    arp = raw(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=PEER_IP))
    assert resegment(arp, 1) == [arp]
    bad = bytearray(frame)
    bad[-1] ^= 1
    assert resegment(bytes(bad), 3) == [bytes(bad)]
    assert resegment(frame, 10) == [frame]


def test_sequence_numbers_wrap():
    pipe = Pipe(seed=3, loss=0.01, stack_options={"isn": lambda *_: 0xFFFF_0000})
    ca, cb = establish(pipe)
    assert ca.iss == cb.iss == 0xFFFF_0000
    exchange(pipe, [(ca, cb)], MIB)
    assert ca.snd_una > 1 << 32 and cb.rcv_nxt > 1 << 32


def test_keyed_isn_differs_per_tuple_and_moves_with_clock():
    pipe = Pipe()
    c1 = pipe.a.connect(Pipe.IP_B, 5000, local_port=40000)
    c2 = pipe.a.connect(Pipe.IP_B, 5000, local_port=40001)
    pipe.clock.now = 1.0
    c1.abort()
    c3 = pipe.a.connect(Pipe.IP_B, 5000, local_port=40000)
    assert len({c1.iss, c2.iss, c3.iss}) == 3
    assert (c3.iss - c1.iss) & 0xFFFF_FFFF == 250_000  # RFC 6528: the 4 us timer, same key


def test_sixteen_connections():
    pipe = Pipe(seed=16, loss=0.01, reorder=0.01)
    listener = pipe.b.listen(5000)
    clients = [pipe.a.connect(Pipe.IP_B, 5000) for _ in range(16)]
    assert pipe.run(lambda: listener.pending == 16, timeout=30)
    servers = {c.remote_port: c for c in iter(listener.accept, None)}
    pairs = [(ca, servers[ca.local_port]) for ca in clients]
    exchange(pipe, pairs, 64 * 1024)
    assert len(pipe.a.connections) == len(pipe.b.connections) == 16


def close_both(pipe, first, second, simultaneous=False):
    first.close()
    if simultaneous:
        second.close()
    else:
        assert pipe.run(lambda: first.state is S.FIN_WAIT_2, timeout=5)
        assert second.state is S.CLOSE_WAIT and second.fin_received
        second.close()
        assert second.state is S.LAST_ACK
    assert pipe.run(lambda: first.state is S.CLOSED and second.state is S.CLOSED, timeout=5)
    assert first.error is None and second.error is None


@pytest.mark.parametrize("order", ["client_first", "server_first", "simultaneous"])
def test_fin_close(order):
    pipe = Pipe(record=True)
    ca, cb = establish(pipe)
    ca.send(b"last words")
    cb.send(b"reply")
    states = []
    pipe.b.on_event = lambda c, k: states.append(k)
    if order == "server_first":
        close_both(pipe, cb, ca)
    else:
        close_both(pipe, ca, cb, simultaneous=order == "simultaneous")
    assert ca.recv() == b"reply" and cb.recv() == b"last words" and ca.eof and cb.eof
    assert "fin" in states and states[-1] == "closed"
    assert pipe.a.connections == pipe.b.connections == []
    with pytest.raises(TcpError):
        ca.send(b"more")
    fins = [Ether(f)[TCP] for _, _, f in pipe.log if TCP in Ether(f) and Ether(f)[TCP].flags.F]
    assert len(fins) == 2


def test_time_wait_reacks_fin_and_expires():
    cfg = TcpConfig(time_wait=2.0)
    pipe = Pipe(config=cfg, record=True)
    ca, cb = establish(pipe)
    ca.close()
    assert pipe.run(lambda: cb.state is S.CLOSE_WAIT, timeout=5)
    cb.close()
    pipe.ab.loss = 1.0  # A's last ACK is lost: B retransmits its FIN
    assert pipe.run(lambda: ca.state is S.TIME_WAIT, timeout=5)
    entered = pipe.clock.now
    assert pipe.run(lambda: cb.counters["retransmissions"] > 0, timeout=5)
    pipe.ab.loss = 0.0
    assert pipe.run(lambda: cb.state is S.CLOSED, timeout=5)
    assert ca.state is S.TIME_WAIT and ca.counters["drop.out_of_window"] == 1
    assert pipe.run(lambda: ca.state is S.CLOSED, timeout=10)
    assert pipe.clock.now - entered >= 2.0 and ca.error is None


def test_abort_resets_peer():
    pipe = Pipe()
    ca, cb = establish(pipe)
    ca.send(b"x" * 10000)
    pipe.run(lambda: cb.available == 10000, timeout=5)
    ca.abort()
    assert ca.state is S.CLOSED and ca.error == "aborted"
    assert pipe.run(lambda: cb.state is S.CLOSED, timeout=5) and cb.error == "reset"
    assert pipe.a.connections == pipe.b.connections == []


def test_connection_refused():
    pipe = Pipe()
    conn = pipe.a.connect(Pipe.IP_B, 4444)
    assert pipe.run(lambda: conn.state is S.CLOSED, timeout=5)
    assert conn.error == "refused" and pipe.b.counters["resets_out"] == 1


def test_reset_in_time_wait_and_close_wait():
    pipe = Pipe()
    ca, cb = establish(pipe)
    ca.close()
    assert pipe.run(lambda: cb.state is S.CLOSE_WAIT, timeout=5)
    cb.abort()
    assert pipe.run(lambda: ca.state is S.CLOSED, timeout=5) and ca.error == "reset"


def test_simultaneous_open():
    pipe = Pipe()
    ca = pipe.a.connect(Pipe.IP_B, 7000, local_port=6000)
    cb = pipe.b.connect(Pipe.IP_A, 6000, local_port=7000)
    assert pipe.run(lambda: ca.state is cb.state is S.ESTABLISHED, timeout=10)
    exchange(pipe, [(ca, cb)], 100_000)


# ---- RFC 5961 and acceptability, with crafted segments from scapy

def test_blind_rst_and_syn_draw_challenge_acks():
    h = Harness()
    conn, synack = h.accept_connection(peer_isn=5000)
    nxt = 5001
    # RST in window but not exactly RCV.NXT: challenge ACK, connection survives
    h.feed(h.tcp(flags="R", seq=nxt + 100))
    (challenge,) = h.take()
    assert challenge[TCP].flags == "A" and challenge[TCP].ack == nxt
    assert conn.state is S.ESTABLISHED
    # RST far outside the window: dropped without an answer to a reset
    h.feed(h.tcp(flags="R", seq=nxt + 10_000_000))
    assert h.take() == [] and conn.state is S.ESTABLISHED
    # SYN in a synchronized state, in or out of window: challenge ACK
    h.feed(h.tcp(flags="S", seq=nxt + 5))
    h.feed(h.tcp(flags="S", seq=12345))
    frames = h.take()
    assert [f[TCP].flags for f in frames] == ["A", "A"]
    assert conn.counters["challenge_acks"] == 3 and conn.state is S.ESTABLISHED
    # the connection still carries data both ways
    h.feed(h.tcp(flags="PA", seq=nxt, ack=synack.seq + 1, window=4096) / b"hello")
    assert conn.recv() == b"hello"
    conn.send(b"world")
    frames = h.take()
    assert frames[-1][TCP].load == b"world" and frames[-1][TCP].ack == nxt + 5
    # the exact RST ends it
    h.feed(h.tcp(flags="R", seq=nxt + 5))
    assert conn.state is S.CLOSED and conn.error == "reset" and h.events[-1] == "closed"


def test_out_of_window_and_out_of_order_segments():
    h = Harness(config=TcpConfig(rcv_buffer=8192))
    conn, synack = h.accept_connection(peer_isn=100)
    ack = synack.seq + 1
    h.feed(h.tcp(flags="A", seq=101 + 9000, ack=ack, window=4096) / b"beyond")
    (dup,) = h.take()
    assert dup[TCP].ack == 101 and conn.counters["drop.out_of_window"] == 1
    h.feed(h.tcp(flags="A", seq=50, ack=ack, window=4096) / b"old!")  # entirely old
    (dup,) = h.take()
    assert dup[TCP].ack == 101 and conn.counters["drop.out_of_window"] == 2
    # out of order: kept, answered at once by a duplicate ACK; the hole filled -> one ACK
    h.feed(h.tcp(flags="A", seq=111, ack=ack, window=4096) / b"klmnopqrst")
    (dup,) = h.take()
    assert dup[TCP].ack == 101 and conn.available == 0
    h.feed(h.tcp(flags="A", seq=101, ack=ack, window=4096) / b"abcdefghij")
    (ack_frame,) = h.take()
    assert ack_frame[TCP].ack == 121 and conn.recv() == b"abcdefghijklmnopqrst"
    # overlapping retransmission is trimmed; a segment straddling the right edge is cut
    h.feed(h.tcp(flags="A", seq=116, ack=ack, window=4096) / (b"x" * 5 + b"A" * 100))
    h.feed(h.tcp(flags="A", seq=221, ack=ack, window=4096) / (b"B" * 8200))
    assert conn.available == 8192 and conn.recv(101) == b"A" * 100 + b"B"
    assert conn.counters["drop.beyond_window_bytes"] == 108
    assert h.take()[-1][TCP].window == 0


def test_ack_of_unsent_data_dropped():
    h = Harness()
    conn, synack = h.accept_connection(peer_isn=100)
    h.feed(h.tcp(flags="PA", seq=101, ack=synack.seq + 1 + 5000, window=4096) / b"zz")
    (reply,) = h.take()
    assert conn.counters["drop.ack_unsent"] == 1 and conn.available == 0
    assert reply[TCP].ack == 101


def test_delayed_ack_every_second_segment_or_timer():
    h = Harness()
    conn, synack = h.accept_connection(peer_isn=100)
    ack = synack.seq + 1
    h.feed(h.tcp(flags="A", seq=101, ack=ack, window=4096) / (b"1" * 100))
    assert h.take() == []
    h.feed(h.tcp(flags="A", seq=201, ack=ack, window=4096) / (b"2" * 100))
    (a,) = h.take()
    assert a[TCP].ack == 301
    h.feed(h.tcp(flags="A", seq=301, ack=ack, window=4096) / (b"3" * 100))
    assert h.stack.next_deadline() == pytest.approx(0.04)
    h.clock.now = 0.039
    h.stack.poll()
    assert h.take() == []
    h.clock.now = 0.04
    h.stack.poll()
    (a,) = h.take()
    assert a[TCP].ack == 401


def test_fast_retransmit_on_three_duplicate_acks():
    h = Harness()
    conn, synack = h.accept_connection(peer_isn=100)
    base = synack.seq + 1
    h.feed(h.tcp(flags="A", seq=101, ack=base, window=65535))
    conn.send(pattern(b"fr", 1460 * 4))
    assert len(h.take()) == 4
    for _ in range(2):
        h.feed(h.tcp(flags="A", seq=101, ack=base, window=65535))
    assert h.take() == []
    h.feed(h.tcp(flags="A", seq=101, ack=base, window=65535))
    (rexmit,) = h.take()
    assert rexmit[TCP].seq == base and len(rexmit[TCP].payload) == 1460
    assert conn.counters["dup_acks"] == 3 and conn.counters["fast_retransmits"] == 1


# ---- timers

def test_retransmission_backoff_doubles_then_times_out():
    cfg = TcpConfig(rto_min=0.2, max_retries=6)
    pipe = Pipe(config=cfg, record=True)
    ca, cb = establish(pipe)
    assert pipe.run(lambda: False, timeout=0.1) is False  # let delayed ACKs settle
    pipe.ab.loss = 1.0
    pipe.log.clear()
    ca.send(b"into the void")
    assert pipe.run(lambda: ca.state is S.CLOSED, timeout=200)
    assert ca.error == "timeout"
    times = [t for t, d, f in pipe.log if d == "ab" and Ether(f)[TCP].payload]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) == 7  # the original and six retransmissions
    assert gaps[0] == pytest.approx(0.2, rel=0.05)
    for a, b in zip(gaps, gaps[1:]):
        assert b == pytest.approx(2 * a, rel=1e-6)


def test_syn_retransmission_backoff():
    cfg = TcpConfig(rto_initial=1.0, syn_retries=3)
    pipe = Pipe(config=cfg, record=True)
    pipe.ab.loss = 1.0
    pipe.a.arp_cache[bytes([10, 0, 0, 2])] = (bytes.fromhex("02000000000b"), 1e9)
    conn = pipe.a.connect(Pipe.IP_B, 5000)
    assert pipe.run(lambda: conn.state is S.CLOSED, timeout=60)
    syns = [t for t, d, f in pipe.log if d == "ab" and TCP in Ether(f)]
    assert [round(b - a, 6) for a, b in zip(syns, syns[1:])] == [1.0, 2.0, 4.0]
    assert conn.error == "timeout"


def test_rtt_estimator_follows_rfc6298():
    pipe = Pipe(delay=0.05)
    ca, cb = establish(pipe)
    # B's SYN-ACK round trip is one RTT; A's SYN also waited for ARP: two RTTs
    assert cb.srtt == pytest.approx(0.1) and cb.rto == pytest.approx(0.1 + 4 * 0.05)
    assert ca.srtt == pytest.approx(0.2) and ca.rto == pytest.approx(0.2 + 4 * 0.1)
    exchange(pipe, [(ca, cb)], 200_000)
    # one sample per round trip (Karn: never a retransmitted one) pulls SRTT down towards the
    # true RTT, plus at most one delayed-ACK wait
    assert ca.counters["rtt_samples"] >= 4 and 0.1 <= ca.srtt < 0.2
    assert ca.rto >= ca.cfg.rto_min


def test_zero_window_probing():
    cfg = TcpConfig(rcv_buffer=16 * 1024)
    pipe = Pipe(config=cfg)
    ca, cb = establish(pipe)
    data = pattern(b"zw", 100_000)
    ca.send(data)
    pipe.run(lambda: False, timeout=5.0)  # B's application does not read
    assert cb.available == 16 * 1024 and ca.snd_wnd == 0
    assert ca.counters["zero_window_probes"] >= 3 and ca.state is S.ESTABLISHED
    got = bytearray()
    def drain():
        got.extend(cb.recv(4096))
        return len(got) == len(data)
    assert pipe.run(drain, timeout=30)
    assert bytes(got) == data and ca.error is None


def test_link_is_deterministic_and_reorders():
    def run(seed):
        clock, out = VirtualClock(), []
        link = Link(out.append, clock=clock, rng=random.Random(seed), delay=0.001,
                    loss=0.1, duplicate=0.1, corrupt=0.1, reorder=0.2, reorder_frames=2)
        for i in range(200):
            link.send(bytes([i]) * 20)
            clock.now += 0.0001
            link.poll()
        clock.now += 1
        link.poll()
        return out, link.counters
    (out1, c1), (out2, c2) = run(1), run(1)
    assert out1 == out2 and c1 == c2
    assert c1["delivered"] == c1["sent"] - c1["lost"] + c1["duplicated"]
    assert run(2)[0] != out1
    firsts = [f[0] for f in out1 if len(set(f)) == 1]
    assert firsts != sorted(firsts)


def test_link_counts_the_lost_segments_that_take_sequence_numbers():
    """``lost_sequenced`` counts the lost frames whose sender must send them again (a SYN, a
    FIN, payload), not bare acknowledgements or other protocols; scapy builds the frames."""
    clock = VirtualClock()
    link = Link(lambda frame: None, clock=clock, rng=random.Random(0), loss=1.0)
    ip = Ether(src=Pipe.MAC_A, dst=Pipe.MAC_B) / IP(src=Pipe.IP_A, dst=Pipe.IP_B)
    frames = [ip / TCP(flags="S"), ip / TCP(flags="A"), ip / TCP(flags="PA") / Raw(b"data"),
              ip / TCP(flags="A") / Raw(b"x"), ip / TCP(flags="FA"), ip / TCP(flags="RA"),
              Ether(src=Pipe.MAC_A, dst=Pipe.MAC_B) / ARP(psrc=Pipe.IP_A, pdst=Pipe.IP_B)]
    for frame in frames:
        link.send(raw(frame))
    assert link.counters["lost"] == 7
    assert link.counters["lost_sequenced"] == 4


# ---- Linux's TCP through a TAP device in a network namespace

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
LINUX_IP, NIC_IP, NIC_MAC = "169.254.10.1", "169.254.10.2", "02:00:00:00:10:02"

LINUX_PEER = textwrap.dedent("""
    import hashlib, socket, sys, threading
    mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    block = hashlib.sha512(b"linux").digest()
    data = (block * (n // len(block) + 1))[:n]
    if mode == "server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, port))
        ls.listen(1)
        print("ready", flush=True)
        s, _ = ls.accept()
    else:
        s = socket.create_connection((host, port), timeout=30)
    s.settimeout(60)
    sender = threading.Thread(target=s.sendall, args=(data,))
    sender.start()
    h, got = hashlib.sha256(), 0
    while got < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        h.update(chunk)
        got += len(chunk)
    sender.join()
    s.shutdown(socket.SHUT_WR)
    while s.recv(65536):
        pass
    print(got, h.hexdigest(), flush=True)
""")


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.mark.linux_peer
def test_linux_peer_through_tap():
    ns, tap = f"iwarp-rawtcp-{os.getpid()}", f"iwtap{os.getpid() % 100000}"
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    _ip("netns", "add", ns)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
        _ip("link", "set", tap, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{LINUX_IP}/24", "dev", tap)
        _ip("-n", ns, "link", "set", tap, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        stack = RawStack(NIC_MAC, NIC_IP, send_frame=lambda f: os.write(fd, f),
                         clock=time.monotonic, rng=random.Random(9))

        def pump(until, timeout=30.0):
            end = time.monotonic() + timeout
            while not until():
                assert time.monotonic() < end, "Linux peer exchange timed out"
                deadline = stack.next_deadline()
                wait = 0.01 if deadline is None else min(0.01, deadline - time.monotonic())
                if select.select([fd], [], [], max(0.0, wait))[0]:
                    for _ in range(256):
                        try:
                            stack.receive_frame(os.read(fd, 65536))
                        except BlockingIOError:
                            break
                stack.poll()

        def linux(mode, host, port):
            return subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-c", LINUX_PEER, mode, host,
                 str(port), str(MIB)], stdout=subprocess.PIPE, text=True)

        def exchange_with(conn, proc):
            mine = pattern(b"nic", MIB)
            conn.send(mine)
            got = bytearray()
            def received_all():
                got.extend(conn.recv())
                return len(got) >= MIB and conn.unacked == 0
            pump(received_all)
            # Linux never had to send past the right edge we advertised, nor out of order
            assert conn.counters["drop.beyond_window_bytes"] == conn.counters["out_of_order"] == 0
            conn.close()
            pump(lambda: conn.eof and conn.state in (S.TIME_WAIT, S.CLOSED))
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0
            assert out.split()[-2:] == [str(MIB), hashlib.sha256(mine).hexdigest()]
            block = hashlib.sha512(b"linux").digest()
            assert bytes(got) == (block * (MIB // len(block) + 1))[:MIB]

        # the NIC opens the connection to a Linux server
        server = linux("server", LINUX_IP, 5000)
        try:
            assert server.stdout.readline().strip() == "ready"
            conn = stack.connect(LINUX_IP, 5000)
            pump(lambda: conn.state is S.ESTABLISHED)
            assert conn.send_mss == 1460 and conn.snd_wscale > 0
            exchange_with(conn, server)
        finally:
            server.kill()
        # a Linux client opens the connection to the NIC
        listener = stack.listen(5001)
        client = linux("client", NIC_IP, 5001)
        try:
            pump(lambda: listener.pending)
            exchange_with(listener.accept(), client)
        finally:
            client.kill()
        # the kernel pings the NIC
        if shutil.which("ping"):
            ping = subprocess.Popen(["ip", "netns", "exec", ns, "ping", "-c", "2", "-W", "5",
                                     NIC_IP], stdout=subprocess.DEVNULL)
            pump(lambda: ping.poll() is not None)
            assert ping.returncode == 0 and stack.counters["echo_replies_out"] == 2
    finally:
        os.close(fd)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)

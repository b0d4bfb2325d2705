"""The TCP engine (MAC + IP + TCP in Verilator) against the model's raw-frame TCP
(iwarp_model.transport.rawtcp), widths 1 and 8.

Every transfer is checked byte for byte at both ends. The model's Link impairs the wire (loss,
duplication, reordering, bit flips that the checksums must catch); crafted frames test every
kind of bad input, which must be dropped and counted with no effect on the connection they aim
at or on the others.
"""

import itertools
import os
import random
from dataclasses import replace

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from iwarp_model.transport.rawtcp import TcpState
from iwarp_nic.tcp.layouts import EventKind
from iwarp_tb.tcphost import ENDED
from iwarp_tb.tcprig import MODEL_TCP, ModelWire, NicRig, ip_int

WIDTHS = (1, 8)
NIC_PORT, MODEL_PORT = 5000, 6000
MSS = 1460                      # the NIC's and the model's


@pytest.fixture(params=WIDTHS, ids=lambda w: f"w{w}")
def rig(request):
    rig = NicRig(request.param, conns=16)
    yield rig
    rig.close()


def nic_listens(rig, wire, conn=0, port=NIC_PORT):
    """The model connects to a listening NIC slot; returns the model's connection."""
    rig.host.listen(conn, port)
    rig.h.run(200)
    model_conn = wire.model.connect(rig.ip, port)
    wire.run(lambda: rig.host.slots[conn].peer is not None, timeout=0.05)
    return model_conn


def nic_connects(rig, wire, conn=1, local_port=40001, listener=None):
    """The NIC connects to the model's listener; returns the model's accepted connection."""
    listener = listener or wire.model.listen(MODEL_PORT)
    rig.host.connect(conn, local_port, ip_int(wire.ip), MODEL_PORT)
    accepted = []

    def up():
        if not accepted and (c := listener.accept()) is not None:
            accepted.append(c)
        return bool(accepted) and rig.host.slots[conn].peer is not None

    wire.run(up, timeout=0.05)
    return accepted[0]


def exchange(rig, wire, pairs, size, timeout=0.2):
    """Send ``size`` random bytes each way on every (nic slot, model connection) pair at once
    and check both ends receive exactly them."""
    sent = {}
    got = {id(mc): bytearray() for _, mc in pairs}
    for slot, mc in pairs:
        to_nic, to_model = os.urandom(size), os.urandom(size)
        sent[slot] = (to_nic, to_model)
        mc.send(to_nic)
        rig.host.send(slot, to_model)

    def done():
        for _, mc in pairs:
            got[id(mc)].extend(mc.recv())
        return all(len(rig.host.slots[slot].received) >= size and len(got[id(mc)]) >= size
                   for slot, mc in pairs)

    wire.run(done, timeout=timeout)
    for slot, mc in pairs:
        to_nic, to_model = sent[slot]
        assert bytes(rig.host.slots[slot].received) == to_nic, f"slot {slot}: NIC got bad bytes"
        assert bytes(got[id(mc)]) == to_model, f"slot {slot}: model got bad bytes"
        rig.host.slots[slot].received.clear()


def test_open_transfer_close(rig):
    """Both opens, data both ways, then an orderly close started by each side."""
    wire = ModelWire(rig)
    passive = nic_listens(rig, wire)
    active = nic_connects(rig, wire)
    exchange(rig, wire, [(0, passive), (1, active)], 40_000)
    # The model closes the passive connection; the NIC sees PEER_FIN, then closes too.
    passive.close()
    wire.run(lambda: EventKind.PEER_FIN in rig.host.slots[0].events, timeout=0.05)
    rig.host.close(0)
    wire.run(lambda: rig.host.slots[0].last_event == EventKind.CLOSED, timeout=0.05)
    # The NIC closes the active connection first: the model reads EOF, closes, NIC ends.
    rig.host.close(1)
    wire.run(lambda: active.eof, timeout=0.05)
    active.close()
    wire.run(lambda: rig.host.slots[1].last_event == EventKind.CLOSED, timeout=0.05)
    assert rig.h.get("tcp_timeouts") == 0


@pytest.mark.parametrize("impair", [
    {},
    {"loss": 0.01},
    {"loss": 0.05},
    {"reorder": 0.05},
    {"duplicate": 0.05},
    {"corrupt": 0.02},
], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "clean")
def test_bulk_impaired(rig, impair):
    """Data both ways at once through an impaired wire arrives intact."""
    wire = ModelWire(rig, **impair)
    passive = nic_listens(rig, wire)
    size = 256 * 1024 if rig.width == 8 else 96 * 1024
    exchange(rig, wire, [(0, passive)], size, timeout=0.5)
    if impair.get("loss") or impair.get("reorder"):
        # Segments after a hole were kept and delivered (byte-exact above) once it filled.
        assert rig.h.get("tcp_rx_parked") > 0, "no out-of-order segment was parked"
    if impair.get("corrupt"):
        caught = sum(rig.h.get(n) for n in ("tcp_rx_front_bad_checksum", "rx_bad_checksum",
                                            "rx_bad_header", "tcp_rx_front_bad_header",
                                            "eth_not_ours", "eth_ethertype", "ip_protocol",
                                            "rx_not_ours", "rx_options", "rx_fragment",
                                            "rx_truncated"))
        assert caught > 0, "bit flips reached the NIC but no check counted one"


@pytest.mark.parametrize("wire_args, backed_up", [
    ({}, False),
    ({"loss": 0.02}, False),
    ({"config": replace(MODEL_TCP, rcv_buffer=8192)}, True),
], ids=["clean", "loss0.02", "window8k"])
def test_segments_hold_whole_chunks(rig, wire_args, backed_up):
    """Chunks of mixed sizes (1 octet to the MSS), queued faster than the line, leave in
    segments that each hold whole chunks, as NicCore needs for its FPDUs (RFC 5044 Appendix
    A: each segment starts with an FPDU): every data segment the NIC sends, retransmissions
    too, starts at a chunk's start and ends at a chunk's end.

    Where the model's window (8 KiB) holds the data back, the send ring fills, and segments
    are packed: at most 10% more than the fewest that hold the chunks whole. Otherwise the
    NIC sends what the ring holds as soon as it is there, often a chunk or two (about 1.5
    times the fewest at one byte, 1.2 at eight)."""
    wire = ModelWire(rig, capture=True, **wire_args)
    passive = nic_listens(rig, wire)
    rng = random.Random(5)
    sizes = []
    while sum(sizes) < (200_000 if rig.width == 8 else 60_000):
        sizes.append(rng.choice((rng.randint(1, 64), rng.randint(65, MSS), MSS)))
    data = os.urandom(sum(sizes))
    rig.host.in_flight = 64         # chunks go in as fast as the engine takes them
    rig.host.send(0, data, sizes)
    got = bytearray()

    def done():
        got.extend(passive.recv())
        return len(got) >= len(data)

    wire.run(done, timeout=0.5)
    assert bytes(got) == data, "the model got bad bytes"
    bounds = set(itertools.accumulate(sizes, initial=0))    # chunk starts, and the end
    iss, segments = None, set()
    for frame in wire.captured:
        p = Ether(frame)
        if TCP not in p or p[TCP].sport != NIC_PORT:
            continue
        if p[TCP].flags.S:
            iss = p[TCP].seq
        length = p[IP].len - 4 * p[IP].ihl - 4 * p[TCP].dataofs
        if length:
            at = (p[TCP].seq - iss - 1) % (1 << 32)
            assert at in bounds and at + length in bounds, \
                f"segment {at}..{at + length} cuts a chunk"
            assert length <= MSS
            segments.add((at, length))
    # The fewest segments that hold the chunks whole: pack greedily.
    fewest, room = 0, 0
    for n in sizes:
        if n > room:
            fewest, room = fewest + 1, MSS
        room -= n
    firsts = {at for at, _ in segments}
    print(f"{len(sizes)} chunks, {len(firsts)} segments (fewest {fewest}), "
          f"{rig.h.get('tcp_retransmits')} retransmitted")
    if backed_up:
        assert len(firsts) <= fewest * 1.1, f"{len(firsts)} segments, {fewest} would do"
    if "loss" in wire_args:
        assert rig.h.get("tcp_retransmits") > 0, "no segment was sent again"


def test_sixteen_connections(rig):
    """Sixteen connections at once (eight opened each way), each with data both ways."""
    wire = ModelWire(rig)
    listener = wire.model.listen(MODEL_PORT)
    pairs = []
    for slot in range(8):
        rig.host.listen(slot, NIC_PORT)
    rig.h.run(200)
    models = [wire.model.connect(rig.ip, NIC_PORT) for _ in range(8)]
    for slot in range(8, 16):
        rig.host.connect(slot, 41000 + slot, ip_int(wire.ip), MODEL_PORT)
    accepted = []

    def all_up():
        while (c := listener.accept()) is not None:
            accepted.append(c)
        return len(accepted) == 8 and all(s.peer for s in rig.host.slots)

    wire.run(all_up, timeout=0.1)
    by_port = {mc.local_port: mc for mc in models}
    for slot in range(8):
        pairs.append((slot, by_port[rig.host.slots[slot].peer[1]]))
    by_peer = {mc.remote_port: mc for mc in accepted}
    for slot in range(8, 16):
        pairs.append((slot, by_peer[41000 + slot]))
    exchange(rig, wire, pairs, 24 * 1024 if rig.width == 8 else 8 * 1024, timeout=0.3)


def test_every_slot_listens():
    """Two slots, both listening on one port: the listen table has ``min(listen_slots,
    conns)`` entries (2 of the default 16), every one taken. Each of two SYNs finds a slot, a
    third finds none and is refused with a RST; a slot that aborts listens again and takes the
    next connection. Data crosses each connection intact."""
    rig = NicRig(1, conns=2, ring_bytes=4096, rx_buffer_bytes=8192)
    try:
        wire = ModelWire(rig)
        for slot in range(2):
            rig.host.listen(slot, NIC_PORT)
        rig.h.run(200)
        first = [wire.model.connect(rig.ip, NIC_PORT) for _ in range(2)]
        wire.run(lambda: all(s.peer is not None for s in rig.host.slots), timeout=0.05)
        by_port = {mc.local_port: mc for mc in first}
        pairs = [(slot, by_port[rig.host.slots[slot].peer[1]]) for slot in range(2)]
        exchange(rig, wire, pairs, 3000, timeout=0.1)
        refused = wire.model.connect(rig.ip, NIC_PORT)
        wire.run(lambda: refused.error is not None, timeout=0.05)
        assert rig.h.get("tcp_rx_no_conn") >= 1
        slot = pairs[0][0]
        rig.host.abort(slot)
        wire.run(lambda: rig.host.slots[slot].peer is None, timeout=0.05)
        again = nic_listens(rig, wire, conn=slot)
        exchange(rig, wire, [(slot, again)], 3000, timeout=0.1)
    finally:
        rig.close()


class Crafter:
    """Frames from the model's addresses, aimed at a NIC connection with the model's view of
    its sequence numbers."""

    def __init__(self, rig, wire, model_conn):
        self.rig, self.wire, self.mc = rig, wire, model_conn

    def segment(self, *, seq=None, ack=None, flags="A", payload=b"", window=8192, **tcp):
        mc = self.mc
        return (Ether(dst=self.rig.mac, src=bytes(self.wire.model.mac))
                / IP(src=self.wire.ip, dst=self.rig.ip)
                / TCP(sport=mc.local_port, dport=mc.remote_port,
                      seq=mc.snd_nxt if seq is None else seq,
                      ack=mc.rcv_nxt if ack is None else ack, flags=flags, window=window, **tcp)
                / payload)

    def send(self, frame, **kwargs):
        self.rig.h.send_frame(bytes(frame), **kwargs)
        self.wire.step(3000)


def corrupt_byte(frame, offset):
    data = bytearray(bytes(frame))
    data[offset] ^= 0x5A
    return bytes(data)


def test_bad_input_dropped(rig):
    """Bad frames aimed at a live connection are dropped and counted, and both connections keep
    working: bad FCS, bad IP and TCP checksums, truncated headers, out-of-window data, and
    RST and SYN with a wrong sequence number (RFC 5961: challenge ACK)."""
    wire = ModelWire(rig)
    target = nic_listens(rig, wire, conn=0)
    other = nic_connects(rig, wire, conn=1)
    exchange(rig, wire, [(0, target), (1, other)], 4000)
    craft = Crafter(rig, wire, target)

    def counter(name):
        return rig.h.get(name)

    before = {n: counter(n) for n in ("rx_bad_fcs", "rx_bad_checksum", "tcp_rx_front_bad_checksum",
                                      "tcp_rx_front_bad_header", "tcp_rx_dropped",
                                      "tcp_rx_challenged", "tcp_resets")}
    poison = b"POISON" * 50
    # Bad FCS: the MAC drops it.
    craft.send(craft.segment(payload=poison), bad_fcs=True)
    # Bad IPv4 header checksum (byte 24 is inside the header checksum field).
    craft.send(corrupt_byte(craft.segment(payload=poison), 24))
    # Bad TCP checksum: a payload byte flipped.
    craft.send(corrupt_byte(craft.segment(payload=poison), 60))
    # Truncated: a TCP data offset pointing past the segment.
    bad_offset = craft.segment(payload=b"xy")
    bad_offset[TCP].dataofs = 15
    craft.send(bad_offset)
    # Out of window: data far beyond RCV.NXT and far behind it.
    craft.send(craft.segment(seq=(target.snd_nxt + (1 << 30)) % (1 << 32), payload=poison))
    craft.send(craft.segment(seq=(target.snd_nxt - (1 << 30)) % (1 << 32), payload=poison))
    # RST and SYN with a wrong sequence number (in the window, not at RCV.NXT).
    craft.send(craft.segment(seq=(target.snd_nxt + 100) % (1 << 32), flags="R"))
    craft.send(craft.segment(seq=(target.snd_nxt + 100) % (1 << 32), flags="S"))
    # RST far outside the window.
    craft.send(craft.segment(seq=(target.snd_nxt + (1 << 31)) % (1 << 32), flags="R"))
    wire.run(lambda: True)
    for _ in range(20):
        wire.step(2000)

    after = {n: counter(n) for n in before}
    delta = {n: after[n] - before[n] for n in before}
    assert delta["rx_bad_fcs"] == 1, delta
    assert delta["rx_bad_checksum"] == 1, delta
    assert delta["tcp_rx_front_bad_checksum"] == 1, delta
    assert delta["tcp_rx_front_bad_header"] == 1, delta
    assert delta["tcp_rx_dropped"] >= 3, delta      # two data segments + the far RST
    assert delta["tcp_rx_challenged"] == 2, delta   # the in-window RST and the SYN
    assert delta["tcp_resets"] == 0, delta
    assert b"POISON" not in rig.host.slots[0].received
    assert all(e != EventKind.RESET for e in rig.host.slots[0].events)
    # Both connections still carry data correctly.
    exchange(rig, wire, [(0, target), (1, other)], 20_000, timeout=0.3)


def test_peer_reset(rig):
    """An RST at RCV.NXT from the peer resets the connection (RESET event); the other
    connection is untouched."""
    wire = ModelWire(rig)
    target = nic_listens(rig, wire, conn=0)
    other = nic_connects(rig, wire, conn=1)
    target.abort()
    wire.run(lambda: rig.host.slots[0].last_event == EventKind.RESET, timeout=0.05)
    exchange(rig, wire, [(1, other)], 10_000)
    # The slot can listen and be connected again.
    again = nic_listens(rig, wire, conn=0)
    exchange(rig, wire, [(0, again)], 10_000)


def test_reset_in_time_wait_ends_a_clean_close(rig):
    """The NIC closes first and acknowledges the model's FIN: TIME-WAIT. The model's FIN comes
    again (its copy of the NIC's ACK was late); the NIC acknowledges it, and the model, done
    with the connection, answers with an RST at the NIC's RCV.NXT (as Linux does). The slot
    ends at once, as CLOSED: both FINs were acknowledged, so the close was clean."""
    wire = ModelWire(rig)
    target = nic_listens(rig, wire, conn=0)
    exchange(rig, wire, [(0, target)], 4000)
    rig.host.close(0)
    wire.run(lambda: target.eof, timeout=0.05)
    target.close()
    slot = rig.host.slots[0]
    wire.run(lambda: EventKind.PEER_FIN in slot.events and target.state is TcpState.CLOSED,
             timeout=0.05)
    assert slot.last_event == EventKind.PEER_FIN        # TIME-WAIT: 2 ms of it left
    craft = Crafter(rig, wire, target)
    craft.send(craft.segment(seq=(target.snd_nxt - 1) % (1 << 32), flags="FA"))
    wire.run(lambda: slot.last_event in ENDED, timeout=0.0005)
    assert slot.last_event == EventKind.CLOSED, slot.events
    assert EventKind.RESET not in slot.events


def test_parked_run_of_a_reset_connection_is_thrown_away(rig):
    """Segments parked past a hole die with their connection: a RST frees the slot, the run
    is dropped (never delivered to anyone), another connection's out-of-order segment was not
    parked meanwhile (one run at a time), and the slot, connected again, gets only its own
    bytes."""
    wire = ModelWire(rig)
    target = nic_listens(rig, wire, conn=0)
    other = nic_connects(rig, wire, conn=1)
    exchange(rig, wire, [(0, target), (1, other)], 4000)
    before = {n: rig.h.get(n) for n in ("tcp_rx_parked", "tcp_rx_dropped")}
    craft = Crafter(rig, wire, target)
    poison = b"PARKED" * 100
    for k in range(2):                              # a run of two, past a 1000-byte hole
        seq = (target.snd_nxt + 1000 + k * len(poison)) % (1 << 32)
        craft.send(craft.segment(seq=seq, payload=poison, flags="PA"))
    assert rig.h.get("tcp_rx_parked") - before["tcp_rx_parked"] == 2
    other_craft = Crafter(rig, wire, other)
    other_craft.send(other_craft.segment(seq=(other.snd_nxt + 1000) % (1 << 32),
                                         payload=poison, flags="PA"))
    assert rig.h.get("tcp_rx_parked") - before["tcp_rx_parked"] == 2
    target.abort()
    wire.run(lambda: rig.host.slots[0].last_event == EventKind.RESET, timeout=0.05)
    for _ in range(10):
        wire.step(2000)
    # The other connection's segment and the two parked ones were dropped.
    assert rig.h.get("tcp_rx_dropped") - before["tcp_rx_dropped"] >= 3
    assert not rig.host.slots[0].received and not rig.host.slots[1].received
    exchange(rig, wire, [(1, other)], 10_000)       # byte-exact: nothing else arrived
    again = nic_listens(rig, wire, conn=0)
    exchange(rig, wire, [(0, again)], 10_000)


def nic_segments(frames, port):
    """The TCP segments among the NIC's ``frames`` to the model's ``port``, as scapy sees them:
    (seq, ack, flags, payload bytes, options)."""
    out = []
    for frame in frames:
        pkt = Ether(frame)
        if TCP in pkt and pkt[TCP].dport == port:
            tcp = pkt[TCP]
            out.append((tcp.seq, tcp.ack, str(tcp.flags), bytes(tcp.payload)[:max(
                0, pkt[IP].len - 4 * pkt[IP].ihl - 4 * tcp.dataofs)], tcp.options))
    return out


@pytest.mark.parametrize("sack", [True, False], ids=["sack", "no_sack"])
def test_acks_while_a_run_is_parked(rig, sack):
    """The NIC's SYN offers SACK, its SYN-ACK only to a SYN that did (RFC 2018 section 2).
    While a run waits past a hole, with data queued for the peer, each ACK goes out alone (a
    pure duplicate, RFC 5681 4.2) and carries the run as one SACK block exactly when SACK was
    agreed; the block stays while part of the hole is filled, and the ACK that jumps over the
    run carries none. The bytes arrive in order."""
    wire = ModelWire(rig, config=replace(MODEL_TCP, sack_permitted=sack))
    frames = []
    forward = wire.to_model.send
    wire.to_model.send = lambda frame: (frames.append(frame), forward(frame))
    target = nic_listens(rig, wire, conn=0)
    other = nic_connects(rig, wire, conn=1)
    syn_ack, = [o for _, _, f, _, o in nic_segments(frames, target.local_port) if f == "SA"]
    syn, = [o for _, _, f, _, o in nic_segments(frames, other.local_port) if f == "S"]
    assert ("SAckOK", b"") in syn
    assert (("SAckOK", b"") in syn_ack) == sack
    exchange(rig, wire, [(0, target)], 4000)

    base = target.snd_nxt
    hole, run = os.urandom(1000), os.urandom(1200)
    rig.host.send(0, os.urandom(400_000))       # the NIC has data for the peer meanwhile
    wire.run(lambda: any(data for *_, data, _ in nic_segments(frames, target.local_port)[-1:]))
    craft = Crafter(rig, wire, target)

    def acks_after(seq, payload, ack, pure=True):
        """Send ``payload`` at ``base + seq``; the SACK blocks (None: no SACK option) of the
        NIC's segments after it that ACK ``base + ack``: pure ACKs, or all of them."""
        wire.step(400)                          # the host's chunks are in, being sent
        frames.clear()
        craft.send(craft.segment(seq=(base + seq) % (1 << 32), payload=payload, flags="A",
                                 window=65535))
        for _ in range(12):                     # (at 1 byte, 3 full segments go out first)
            wire.step(2000)
        blocks = []
        for _, got_ack, flags, data, options in nic_segments(frames, target.local_port):
            if got_ack == (base + ack) % (1 << 32) and (not pure or (not data and flags == "A")):
                found = [v for k, v in options if k == "SAck"]
                blocks.append(found[0] if found else None)
        assert blocks, f"no {'pure ' * pure}ACK of +{ack} after the segment at +{seq}"
        return blocks

    def block(left, right):
        return {((base + left) % (1 << 32), (base + right) % (1 << 32)) if sack else None}

    # (More than one ACK each time: the model's ACKs of the NIC's data sit before the crafted
    # bytes, so the NIC answers them too, RFC 9293 3.10.7.4; all carry the same block.)
    assert set(acks_after(1000, run[:600], 0)) == block(1000, 1600)
    assert set(acks_after(1600, run[600:], 0)) == block(1000, 2200)
    assert set(acks_after(0, hole[:400], 400)) == block(1000, 2200)
    assert set(acks_after(400, hole[400:], 2200, pure=False)) == {None}
    assert bytes(rig.host.slots[0].received) == hole + run


def test_connect_refused(rig):
    """A SYN to a closed model port is answered by RST: the slot reports RESET."""
    wire = ModelWire(rig)
    rig.host.connect(2, 40100, ip_int(wire.ip), 7777)
    wire.run(lambda: rig.host.slots[2].last_event == EventKind.RESET, timeout=0.05)


def test_no_connection_answered_with_rst(rig):
    """A segment for no connection gets RFC 9293's RST, and nothing else changes."""
    wire = ModelWire(rig)
    mc = wire.model.connect(rig.ip, 4444)           # nobody listens there
    wire.run(lambda: mc.error is not None, timeout=0.05)
    assert rig.h.get("tcp_rx_no_conn") >= 1
    assert rig.h.get("tcp_tx_resets") >= 1


@pytest.mark.parametrize("seed", [10, 11])
def test_random_seeds(rig, seed):
    """Lossy, reordering, duplicating transfers on two random slots, random sizes."""
    wire = ModelWire(rig, seed=seed, loss=0.02, reorder=0.02, duplicate=0.02)
    rng = random.Random(seed)
    slot_a, slot_b = rng.randrange(8), 8 + rng.randrange(8)
    a = nic_listens(rig, wire, conn=slot_a)
    b = nic_connects(rig, wire, conn=slot_b, local_port=rng.randrange(1024, 65536))
    exchange(rig, wire, [(slot_a, a), (slot_b, b)], rng.randrange(10_000, 60_000),
             timeout=0.5)

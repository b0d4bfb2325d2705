"""Synthetic captures of byte streams: scapy decodes them, checksums included, and the TCP
payloads reassemble to exactly the bytes written."""

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from iwarp_model.capture import StreamCapture
from iwarp_model.pcap import read_pcap


def test_capture_reassembles_and_checks(tmp_path):
    path = tmp_path / "s.pcap"
    out = bytes(range(256)) * 20
    back = b"reply" * 700
    with StreamCapture(path, ("192.0.2.1", 40000), ("192.0.2.2", 7174), mss=1000) as cap:
        cap.sent(b"hello")
        cap.received(back)
        cap.sent(out)
    _, frames = read_pcap(path)
    packets = [Ether(f) for _, f in frames]
    flags = [str(p[TCP].flags) for p in packets]
    assert flags[:3] == ["S", "SA", "A"] and flags[-3:] == ["FA", "FA", "A"]
    assert packets[0][TCP].options[0] == ("MSS", 1000)
    streams = {7174: b"", 40000: b""}
    for p in packets:
        ip, tcp = p[IP], p[TCP]
        # scapy recomputes the checksums of a copy with them cleared: they must agree.
        ip_chk, tcp_chk = ip.chksum, tcp.chksum
        del ip.chksum, tcp.chksum
        rebuilt = Ether(bytes(p))
        assert (rebuilt[IP].chksum, rebuilt[TCP].chksum) == (ip_chk, tcp_chk)
        assert len(bytes(tcp.payload)) <= 1000
        streams[tcp.dport] += bytes(tcp.payload)
    assert streams[7174] == b"hello" + out and streams[40000] == back
    # Sequence numbers run on without gaps: each segment starts where the last one ended.
    expected = {}
    for p in packets:
        tcp = p[TCP]
        if tcp.sport in expected:
            assert tcp.seq == expected[tcp.sport]
        expected[tcp.sport] = tcp.seq + len(tcp.payload) + (1 if tcp.flags & 0x03 else 0)


def test_passive_side_syn_first_and_closed_capture(tmp_path):
    path = tmp_path / "p.pcap"
    cap = StreamCapture(path, ("192.0.2.2", 7174), ("192.0.2.1", 40000), active=False)
    cap.close()
    _, frames = read_pcap(path)
    first = Ether(frames[0][1])
    assert first[TCP].flags == "S" and first[TCP].dport == 7174
    with pytest.raises(ValueError):
        cap.sent(b"late")
    with pytest.raises(ValueError):
        StreamCapture(tmp_path / "x.pcap", ("192.0.2.1", 1), ("192.0.2.2", 2), mss=0)


def test_memory_pair_capture_matches_the_wire(tmp_path):
    """The in-memory transport's pcap carries exactly the bytes that crossed it, and the first
    segment each way is the MPA Request / Reply on its own."""
    from iwarp_model.engine import Connection
    from iwarp_model.transport.memory import MemoryPair
    from iwarp_model.verbs import Device, QpState
    from iwarp_model.wire.mpa import KEY_REPLY, KEY_REQUEST

    conns = []
    for name, active in (("a", True), ("b", False)):
        dev = Device(name)
        pd, cq = dev.alloc_pd(), dev.create_cq(8)
        qp = dev.create_qp(pd, cq, cq)
        qp.modify(QpState.INIT)
        conns.append(Connection(qp, active=active, crc=True))
    path = tmp_path / "m.pcap"
    with StreamCapture(path, ("192.0.2.1", 40000), ("192.0.2.2", 7174)) as cap:
        pair = MemoryPair(*conns, record=True, capture=cap)
        pair.start()
        conns[0].close()
        pair.pump()
    _, frames = read_pcap(path)
    streams = {7174: b"", 40000: b""}
    firsts = {}
    for _, frame in frames:
        tcp = Ether(frame)[TCP]
        payload = bytes(tcp.payload)
        if payload and tcp.dport not in firsts:
            firsts[tcp.dport] = payload
        streams[tcp.dport] += payload
    assert streams[7174] == bytes(pair.wire["ab"]) and streams[40000] == bytes(pair.wire["ba"])
    assert firsts[7174].startswith(KEY_REQUEST) and firsts[40000].startswith(KEY_REPLY)

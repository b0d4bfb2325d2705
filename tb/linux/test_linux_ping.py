"""IpNode (MAC + IP layer) as generated Verilog against Linux's network stack, through a TAP
device in a network namespace (iwarp_tb.tap), at 1 byte (GMII) and 8 bytes (XGMII).

* Linux pings the NIC: ARP, then 5 echo requests, 5 replies (``ping`` counts them).
* An echo request with a corrupted FCS is counted in ``rx_bad_fcs`` and not answered; the same
  frame with a good FCS is (the NIC resolves Linux's address by ARP, through the bridge).
* TCP through the NIC's TCP ports: a SYN pushed on ``i_tcp_header``/``i_tcp_payload`` reaches
  Linux, which answers a closed port with RST+ACK; that comes back out of ``o_tcp_header``/
  ``o_tcp_payload`` with the fields Linux sets, checked by the model's TCP decoder.

A pcap of each run is written to build/linux/. Needs root (the ``linux_peer`` facility) and
``ping`` (Debian: iputils-ping).
"""

import ipaddress
import re
import shutil

import pytest
from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.l2 import Ether

from iwarp_model.pcap import PcapWriter, read_pcap
from iwarp_model.wire.net import IcmpEcho, TcpSegment, mac_str
from iwarp_nic.hdrparse import HeaderStream
from iwarp_nic.headers import IPV4
from iwarp_nic.ip.ipv4 import TxRequest
from iwarp_nic.node import IpNode
from iwarp_tb import toolchain
from iwarp_tb.harness import Harness, pack, unpack
from iwarp_tb.tap import BridgeStats, Tap, bridge

pytestmark = pytest.mark.linux_peer

PHYS = {1: "gmii", 8: "xgmii"}
NIC_MAC = bytes.fromhex("020000000002")
PCAPS = toolchain.BUILD / "linux"
TIMEOUT_S = 120


def ip_int(text):
    return int(ipaddress.IPv4Address(text))


def node(width, tap):
    """The IpNode harness with the NIC's addresses set."""
    h = Harness(f"iwarp_ip_node_w{width}", IpNode(width), phy=PHYS[width])
    h.set("mac", int.from_bytes(NIC_MAC, "big"))
    h.set("ip", ip_int(tap.nic_ip))
    return h


def start_ping(tap, count, *options):
    """``ping`` from Linux to the NIC, started (bridge while it runs)."""
    assert shutil.which("ping"), "ping is needed (Debian: iputils-ping)"
    return tap.popen(["ping", "-c", str(count), "-W", "5", *options, tap.nic_ip])


@pytest.mark.parametrize("width", PHYS)
def test_ping(width):
    pcap = PCAPS / f"ping_w{width}.pcap"
    with Tap() as tap, node(width, tap) as h:
        ping = start_ping(tap, 5, "-i", "0.2")
        try:
            stats = bridge(h, tap, until=lambda: ping.poll() is not None, timeout_s=TIMEOUT_S,
                           pcap=pcap)
        finally:
            ping.kill()
        out = ping.communicate()[0]
        summary = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert summary and summary.groups() == ("5", "5"), out
        assert h.get("icmp_replies") == 5
        assert h.get("arp_tx_reply") >= 1
        assert h.get("rx_bad_fcs") == h.get("rx_overflows") == h.get("tx_underruns") == 0
        assert not stats.bad_from_nic
    _, frames = read_pcap(pcap)
    assert len(frames) == len(stats.to_nic) + len(stats.from_nic) >= 12


@pytest.mark.parametrize("width", PHYS)
def test_bad_fcs_not_answered(width):
    with Tap() as tap, node(width, tap) as h, PcapWriter(PCAPS / f"bad_fcs_w{width}.pcap") as pcap:
        payload = bytes(range(48))
        request = bytes(Ether(dst=NIC_MAC, src=tap.mac) / IP(src=tap.peer_ip, dst=tap.nic_ip)
                        / ICMP(type=8, id=0x1234, seq=7) / payload)
        stats = BridgeStats()

        def replies():
            return [f for f in stats.from_nic if ICMP in Ether(f) and Ether(f)[ICMP].id == 0x1234]

        # Linux pings first, so the NIC has its MAC (an echo request from a sender missing from
        # the ARP cache holds the NIC's RX path until the resolver gives up: an IpStack limit).
        ping = start_ping(tap, 1)
        bridge(h, tap, until=lambda: ping.poll() is not None, timeout_s=TIMEOUT_S, stats=stats,
               pcap=pcap)
        assert ping.returncode == 0, ping.communicate()[0]

        # The reply streams out while the request streams in, so the NIC starts it before the
        # FCS shows the frame bad; it must not leave.
        h.send_frame(request, bad_fcs=True)
        start = h.cycle
        bridge(h, tap, until=lambda: h.cycle - start >= 50_000, timeout_s=TIMEOUT_S,
               stats=stats, pcap=pcap)
        assert replies() == [] and not stats.bad_from_nic
        assert h.get("rx_bad_fcs") == 1
        assert h.get("rx_frames_ok") == len(stats.to_nic)  # Linux's frames only

        # The same request with a good FCS is answered.
        h.send_frame(request)
        bridge(h, tap, until=replies, timeout_s=TIMEOUT_S, stats=stats, pcap=pcap)
        (reply,) = replies()
        frame = Ether(reply)
        assert (frame.dst, frame.src) == (mac_str(tap.mac), mac_str(NIC_MAC))
        assert (frame[IP].src, frame[IP].dst) == (tap.nic_ip, tap.peer_ip)
        echo = IcmpEcho.decode(bytes(frame[IP].payload)[:8 + len(payload)])
        assert (echo.type, echo.ident, echo.seq, echo.payload) == (0, 0x1234, 7, payload)
        assert h.get("rx_bad_fcs") == 1
        assert h.get("rx_frames_ok") == len(stats.to_nic) + 1
        assert not stats.bad_from_nic


@pytest.mark.parametrize("width", PHYS)
def test_tcp_syn_to_closed_port_gets_rst(width):
    header_layout = HeaderStream(IPV4).members["payload"].shape
    with Tap() as tap, node(width, tap) as h:
        nic, peer = ipaddress.IPv4Address(tap.nic_ip), ipaddress.IPv4Address(tap.peer_ip)
        syn = TcpSegment(sport=40000, dport=9, seq=1000, ack=0, flags=0x02, window=8192)
        segment = syn.encode(nic.packed, peer.packed)
        h.push("s_axis_tcp_header", [pack(TxRequest, {"dst": int(peer), "protocol": 6,
                                                      "length": len(segment)})])
        h.push("s_axis_tcp_payload", [segment])
        headers, payloads = [], []

        def answered():
            headers.extend(h.pull("m_axis_tcp_header"))
            payloads.extend(h.pull("m_axis_tcp_payload"))
            return headers and payloads

        stats = bridge(h, tap, until=answered, timeout_s=TIMEOUT_S,
                       pcap=PCAPS / f"tcp_rst_w{width}.pcap")
        assert len(headers) == len(payloads) == 1
        header = unpack(header_layout, headers[0])
        fields = header["fields"]
        assert (fields["src"], fields["dst"], fields["protocol"]) == (int(peer), int(nic), 6)
        assert fields["total_length"] == 20 + len(payloads[0]) and header["has_payload"]
        assert not payloads[0].err
        rst = TcpSegment.decode(bytes(payloads[0]), peer.packed, nic.packed)
        assert (rst.sport, rst.dport) == (9, 40000)
        assert rst.flags == 0x14, f"expected RST+ACK, got flags {rst.flags:#x}"
        assert rst.ack == 1001
        assert h.get("tx_sent") == 1 and h.get("arp_tx_request") >= 1
        # What Linux saw: the SYN, as scapy decodes it from the NIC's frames.
        syns = [Ether(f) for f in stats.from_nic if TCP in Ether(f)]
        assert len(syns) == 1 and syns[0][TCP].flags == "S" and syns[0][IP].dst == tap.peer_ip

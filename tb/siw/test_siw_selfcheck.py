"""Self-check of the siw harness: two Linux siw guests back to back, and the host on a guest's wire.

The guest is built once per session (``build/siw``, under a file lock, so parallel workers share
it). Each test holds ``build/siw/run.lock`` while its guests run, so that however xdist spreads
the tests, no more than two TCG guests share the cores.
"""

import time

import pytest
from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.l2 import ARP, Ether

from iwarp_tb.siw import guest as siw_guest
from iwarp_tb.siw import image
from iwarp_tb.siw.netdev import SocketNetdev

pytestmark = [pytest.mark.siw, pytest.mark.xdist_group(name="siw")]

SERVER_IP = "169.254.1.1"
RPING_PORT = 7174


@pytest.fixture(scope="session")
def stock():
    return image.ensure("stock")


@pytest.fixture(autouse=True)
def one_pair_at_a_time():
    with siw_guest.guest_slot():
        yield


def test_rping_back_to_back(stock, tmp_path):
    count = 5
    server, client = siw_guest.run_pair(f"iwarp.role=rping-server iwarp.count={count}",
                                        f"iwarp.role=rping-client iwarp.count={count}",
                                        workdir=tmp_path)
    assert (server.rc, client.rc) == (0, 0), client.transcript + server.transcript
    assert client.pings == count, client.transcript
    assert server.pings == count, server.transcript
    assert client.output.count("ping data: rdma-ping-") == count


def test_ucmatose_back_to_back(stock, tmp_path):
    # Connection set-up and tear-down through rdma_cm, iw_cm and MPA rev 2. With messages
    # (-C > 0) the ucmatose server posts Sends the moment it is ESTABLISHED; under TCG they reach
    # the siw initiator in the same read as the MPA Reply, which siw rejects as "extra data"
    # (CONNECT_ERROR -22). See README.md.
    server, client = siw_guest.run_pair("iwarp.role=ucmatose-server iwarp.count=0",
                                        "iwarp.role=ucmatose-client iwarp.count=0",
                                        workdir=tmp_path)
    assert (server.rc, client.rc) == (0, 0), client.transcript + server.transcript
    assert "return status 0" in client.output and "return status 0" in server.output


def test_socket_netdev_sees_guest(stock, tmp_path):
    """The host end of the wire: answer the guest's ARP and ping, then see rping's SYN."""
    my_mac = "02:00:00:00:01:01"
    port = siw_guest.free_port()
    g = siw_guest.SiwGuest(
        "stock", f"iwarp.role=rping-client iwarp.peer={SERVER_IP} iwarp.port={RPING_PORT} "
        "iwarp.tries=3", netdev="listen", port=port, ip="169.254.1.2/24", workdir=tmp_path)
    with g, SocketNetdev.connect(port) as wire:
        seen = {"arp": None, "syn": None}
        deadline = time.monotonic() + 120
        while seen["syn"] is None and time.monotonic() < deadline:
            raw = wire.recv_frame(timeout=1.0)
            if raw is None:
                continue
            pkt = Ether(raw)
            if ARP in pkt and pkt[ARP].op == 1 and pkt[ARP].pdst == SERVER_IP:
                seen["arp"] = pkt
                reply = (Ether(dst=pkt.src, src=my_mac)
                         / ARP(op=2, hwsrc=my_mac, psrc=SERVER_IP, hwdst=pkt.src,
                               pdst=pkt[ARP].psrc))
                wire.send_frame(bytes(reply))
            elif ICMP in pkt and pkt[ICMP].type == 8 and pkt[IP].dst == SERVER_IP:
                echo = pkt[ICMP]
                reply = (Ether(dst=pkt.src, src=my_mac) / IP(src=SERVER_IP, dst=pkt[IP].src)
                         / ICMP(type=0, id=echo.id, seq=echo.seq) / bytes(echo.payload))
                wire.send_frame(bytes(reply))
            elif TCP in pkt and pkt[TCP].flags == "S":
                seen["syn"] = pkt
        g.wait_ready(timeout=5)
    assert seen["arp"] is not None, "no ARP request for the peer"
    assert seen["arp"][ARP].psrc == "169.254.1.2"
    assert seen["arp"].src == g.mac
    syn = seen["syn"]
    assert syn is not None, "no TCP SYN from rping"
    assert (syn[IP].src, syn[IP].dst, syn[TCP].dport) == ("169.254.1.2", SERVER_IP, RPING_PORT)
    assert syn.dst == my_mac  # addressed with the MAC our ARP reply gave
    assert len(bytes(syn)) <= 1514

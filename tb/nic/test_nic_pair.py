"""Two NICs back to back (:class:`~iwarp_tb.nicpair.NicPair`, natively under Verilator) set up
connections through the verbs driver (:mod:`iwarp_tb.driver`): registers, rings, memory
regions, the TCP open and the MPA exchange the driver plays (RFC 5044 section 7, RFC 6581).

The oracles: the frames on the link (the harness's taps), parsed by scapy, carry the TCP
handshake and exactly the MPA Request and Reply the drivers made, each decoded again by the
model's codec; both ends settle the same parameters as the model's ``negotiate``; the
register events name the peer; the shadow-memory checker saw no write outside writable
memory and no AXI protocol fault.
"""

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from iwarp_model.verbs import QpState
from iwarp_model.wire import mpa
from iwarp_nic.host.nicmap import NicEventKind
from iwarp_nic.mpa import Rtr
from iwarp_nic.tcp.layouts import EventKind
from iwarp_tb.nicpair import NODES, NicPairRig
from iwarp_tb.tcprig import ip_int

PORT = 4791


def tcp_payloads(frames, src_ip):
    """The TCP payloads (in order) of the frames from ``src_ip``."""
    out = []
    for frame in frames:
        packet = Ether(bytes(frame))
        if IP in packet and packet[IP].src == src_ip and TCP in packet:
            payload = bytes(packet[TCP].payload)
            if payload:
                out.append(payload)
    return out


@pytest.mark.cocotb
@pytest.mark.parametrize("width", [8])
def test_connection_setup(width):
    rig = NicPairRig(width, seed=3)
    try:
        qps = {}
        for nic, device in rig.devices.items():
            pd = device.alloc_pd()
            cq = device.create_cq(64)
            qps[nic] = [device.create_qp(pd, cq, cq, max_rd_atomic=4 + k,
                                         max_dest_rd_atomic=6 + k) for k in range(2)]
        options = [dict(crc=True, markers=False),
                   dict(crc=False, markers=True, p2p=True, rtr=(Rtr.READ, Rtr.SEND))]
        for k, opts in enumerate(options):
            rig.connect({nic: qps[nic][k] for nic in NODES}, port=PORT + k, **opts)
        frames = rig.frames()
        assert frames and not any(f.err for f in frames)
        ips = {nic: ".".join(str(rig.ips[nic] >> s & 0xFF) for s in (24, 16, 8, 0))
               for nic in NODES}
        for k, opts in enumerate(options):
            a, b = qps["a"][k], qps["b"][k]
            assert (a.state, b.state) == (QpState.RTS, QpState.RTS), (a.reason, b.reason)
            # Each startup frame went out as made, and came back through the other's gather.
            assert a.request.encode() in tcp_payloads(frames, ips["a"])
            assert b.reply.encode() in tcp_payloads(frames, ips["b"])
            assert b.request == a.request and a.reply == b.reply
            assert mpa.MpaFrame.decode(a.request.encode(), reply=False).crc == opts["crc"]
            settled = mpa.negotiate(a.request, a.reply)
            assert a.negotiated == b.negotiated == settled
            assert settled.crc == opts["crc"]
            assert settled.markers_from_initiator == settled.markers_from_responder == \
                opts["markers"]
            assert a.request.enhanced.ird == 6 + k and a.reply.enhanced.ord == 4 + k
            if opts.get("p2p"):
                # The Initiator's preference among the RTRs both offered (RFC 6581 9.2).
                assert settled.peer_to_peer and a.rtr == b.rtr == Rtr.SEND
            else:
                assert a.rtr == b.rtr == Rtr.NONE
        for nic, device in rig.devices.items():
            peer = "b" if nic == "a" else "a"
            opened = [e for e in device.events if e["kind"] == NicEventKind.TCP]
            assert [EventKind(e["code"]) for e in opened] == [EventKind.ESTABLISHED] * 2
            assert all(e["data"] & 0xFFFF_FFFF == ip_int(ips[peer]) for e in opened)
            assert device.memory.violations() == [] and device.memory.faults() == []
    finally:
        rig.close()

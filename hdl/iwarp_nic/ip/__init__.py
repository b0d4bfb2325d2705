"""The IP layer: Ethernet demultiplexing, ARP (RFC 826), IPv4 (RFC 791, 1071, 1122) and ICMP
echo (RFC 792), joined by :class:`~iwarp_nic.ip.stack.IpStack`."""

from .arp import ArpEngine
from .icmp import IcmpEcho
from .ipv4 import Ipv4Rx, Ipv4Tx, TxRequest
from .mux import Arbiter, Demux
from .park import ParkedDatagram
from .stack import IpStack

__all__ = ["ArpEngine", "IcmpEcho", "Ipv4Rx", "Ipv4Tx", "TxRequest", "Arbiter", "Demux",
           "ParkedDatagram", "IpStack"]

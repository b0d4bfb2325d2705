"""A raw-frame network endpoint: Ethernet, ARP, IPv4, ICMP echo and TCP, time-driven.

Implements:

* RFC 826: ARP requests and replies, the merge rule for the address cache, queueing of
  datagrams while a peer is resolved (retried, then dropped and counted).
* RFC 791: IPv4 to on-link peers; fragments are dropped and counted, options skipped.
* RFC 792: ICMP echo requests are answered.
* RFC 9293 section 3.3.2 and 3.10: the TCP state machine (active, passive and simultaneous open,
  orderly close from either side, RST in every state, TIME-WAIT), segment acceptability and
  trimming, the send and receive windows, receiver and sender SWS avoidance (3.8.6.2), delayed
  ACK (3.8.6.3), zero-window probing (3.8.6.1), reset generation (3.5.2).
* RFC 7323 section 2: window scaling (offered by an active open, answered by a passive one).
* RFC 6298: SRTT/RTTVAR, RTO with a configurable minimum, exponential backoff, Karn's rule.
* RFC 5681 section 3: slow start, congestion avoidance, fast retransmit after three duplicate
  ACKs and fast recovery, with the RFC 6582 (NewReno) partial-ACK rule.
* RFC 5961 sections 3 to 5: an RST is accepted only when its sequence number is exactly RCV.NXT
  (otherwise, in window, a challenge ACK), a SYN in a synchronized state draws a challenge ACK,
  ACKs outside [SND.UNA - MAX.SND.WND, SND.MAX] are dropped. Challenge ACKs are not rate-limited.
* RFC 6528: initial sequence numbers are a 4 us clock plus a keyed hash of the 4-tuple.

The stack is deterministic: it never reads the wall clock or a global random source. Time comes
from ``clock()``, randomness from ``rng`` (a :class:`random.Random`), and frames leave through
``send_frame``. Nothing happens between calls: feed frames with :meth:`RawStack.receive_frame`
and call :meth:`RawStack.poll` at or after :meth:`RawStack.next_deadline` to run the timers.
Bad frames are counted and dropped, never raised.

Sequence numbers are held as unbounded integers (the ISN plus the bytes since); a received
32-bit number is placed next to a reference by its signed modular distance, so comparisons are
ordinary integer comparisons and wraparound at 2**32 is transparent.
"""

import enum
import hashlib
import struct
from collections import Counter, deque
from dataclasses import dataclass

from ..wire.net import (
    ACK,
    ARP_REPLY,
    ARP_REQUEST,
    BROADCAST_MAC,
    ETH_MIN_FRAME,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FIN,
    ICMP_ECHO_REPLY,
    ICMP_ECHO_REQUEST,
    PROTO_ICMP,
    PROTO_TCP,
    PSH,
    RST,
    SYN,
    ArpPacket,
    BadFieldError,
    ChecksumError,
    EthernetFrame,
    IcmpEcho,
    IPv4Packet,
    TcpSegment,
    TruncatedError,
    ipv4,
    mac,
)

__all__ = ["RawStack", "TcpConnection", "TcpConfig", "TcpState", "Listener", "TcpError"]

_MASK = 0xFFFF_FFFF
_DEFAULT_MSS = 536  # RFC 9293 section 3.7.1, when the peer sends no MSS option


def _sdiff(a: int, b: int) -> int:
    """The signed distance ``a - b`` modulo 2**32, in [-2**31, 2**31)."""
    d = (a - b) & _MASK
    return d - (1 << 32) if d & 0x8000_0000 else d


def _unwrap(value32: int, ref: int) -> int:
    """The unbounded sequence number nearest to ``ref`` whose low 32 bits are ``value32``."""
    return ref + _sdiff(value32, ref & _MASK)


class TcpError(ConnectionError):
    """A call the connection's state does not allow (send after close, on a reset connection)."""


class TcpState(enum.Enum):
    CLOSED = "CLOSED"
    SYN_SENT = "SYN-SENT"
    SYN_RECEIVED = "SYN-RECEIVED"
    ESTABLISHED = "ESTABLISHED"
    FIN_WAIT_1 = "FIN-WAIT-1"
    FIN_WAIT_2 = "FIN-WAIT-2"
    CLOSE_WAIT = "CLOSE-WAIT"
    CLOSING = "CLOSING"
    LAST_ACK = "LAST-ACK"
    TIME_WAIT = "TIME-WAIT"


S = TcpState
_SENDING = {S.ESTABLISHED, S.CLOSE_WAIT, S.FIN_WAIT_1, S.CLOSING, S.LAST_ACK}
_RECEIVING = {S.ESTABLISHED, S.FIN_WAIT_1, S.FIN_WAIT_2}


@dataclass(frozen=True)
class TcpConfig:
    """TCP tunables (seconds, bytes). ``mss`` is the MSS this end advertises (capped by the
    stack's MTU); ``rcv_buffer`` bounds the in-order bytes held for the application and sets
    the advertised window and the window-scale shift; ``snd_buffer`` is the send buffer an
    application keeps to (:attr:`TcpConnection.room`), as a socket's: what it queued and the
    peer has not acknowledged."""

    mss: int = 1460
    rcv_buffer: int = 256 * 1024
    snd_buffer: int = 256 * 1024
    rto_initial: float = 1.0
    rto_min: float = 0.2
    rto_max: float = 60.0
    clock_granularity: float = 0.001
    delayed_ack: float = 0.04
    time_wait: float = 0.5
    syn_retries: int = 6
    max_retries: int = 12
    initial_window: int = 10  # segments (RFC 6928)
    invalid_ack_interval: float = 0.5  # least time between answers to unacceptable pure ACKs
    window_scaling: bool = True
    #: Offer SACK-permitted (RFC 2018 section 2). This end takes SACK blocks as plain ACKs: it
    #: offers them only to see what a peer sends, never using them to choose what to resend.
    sack_permitted: bool = False

    def __post_init__(self):
        if not 64 <= self.mss <= 0xFFFF:
            raise ValueError(f"mss {self.mss} outside 64..65535")
        if not 1 <= self.rcv_buffer <= 0xFFFF << 14:
            raise ValueError(f"rcv_buffer {self.rcv_buffer} outside 1..{0xFFFF << 14}")
        if self.snd_buffer < 1:
            raise ValueError(f"snd_buffer {self.snd_buffer} is not positive")
        if not 0 < self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need 0 < rto_min <= rto_initial <= rto_max")


class Listener:
    """A listening port. :meth:`accept` hands out connections that completed the handshake."""

    def __init__(self, stack: "RawStack", port: int, backlog: int):
        self.stack, self.port, self.backlog = stack, port, backlog
        self._ready: deque[TcpConnection] = deque()

    @property
    def pending(self) -> int:
        """Established connections waiting for :meth:`accept`."""
        return len(self._ready)

    def accept(self) -> "TcpConnection | None":
        """The oldest established, not yet accepted connection, or None."""
        return self._ready.popleft() if self._ready else None

    def close(self) -> None:
        """Stop accepting SYNs on the port; connections already made are unaffected."""
        if self.stack._listeners.get(self.port) is self:
            del self.stack._listeners[self.port]


class RawStack:
    """One host: a MAC and an IPv4 address on one Ethernet segment.

    ``send_frame(bytes)`` is called with each outgoing frame (no FCS, padded to 60 bytes);
    ``clock()`` returns the current time in seconds; ``rng`` is a :class:`random.Random` from
    which the ISN secret, IP identifications and ephemeral ports are drawn. ``on_event(conn,
    kind)``, if given, is called with ``"established"``, ``"data"``, ``"sent"`` (the peer
    acknowledged queued bytes: :attr:`TcpConnection.room` grew), ``"fin"`` (the peer has
    closed its direction) and ``"closed"`` (see :attr:`TcpConnection.error`). ``isn``, if given,
    replaces the RFC 6528 generator: ``isn(local_port, remote_ip, remote_port) -> int``.
    ``counters`` counts frames and every drop as ``"drop.<reason>"``.
    """

    def __init__(self, mac_addr, ip_addr, *, send_frame, clock, rng, config: TcpConfig = None,
                 mtu: int = 1500, arp_interval: float = 0.5, arp_retries: int = 3,
                 arp_ttl: float = 300.0, arp_queue: int = 64, on_event=None, isn=None):
        self.mac = mac(mac_addr)
        self.ip = ipv4(ip_addr)
        self._send = send_frame
        self.clock = clock
        self.rng = rng
        self.config = config or TcpConfig()
        if not 576 <= mtu <= 9216:
            raise ValueError(f"mtu {mtu} outside 576..9216")
        self.mtu = mtu
        self.arp_interval, self.arp_retries, self.arp_ttl = arp_interval, arp_retries, arp_ttl
        self.arp_queue = arp_queue
        self.on_event = on_event
        self._isn_hook = isn
        self.counters: Counter[str] = Counter()
        self.arp_cache: dict[bytes, tuple[bytes, float]] = {}
        self._arp_pending: dict[bytes, list] = {}  # ip -> [next_time, tries, [ip packets]]
        self._listeners: dict[int, Listener] = {}
        self._conns: dict[tuple[int, bytes, int], TcpConnection] = {}
        self._secret = rng.getrandbits(128).to_bytes(16, "big")
        self._ident = rng.getrandbits(16)
        self._next_port = rng.randrange(49152, 65536)

    # ---- application calls

    def listen(self, port: int, backlog: int = 128) -> Listener:
        """Accept connections on ``port``; ValueError if already listening there."""
        if not 0 < port < 65536 or port in self._listeners:
            raise ValueError(f"cannot listen on port {port}")
        listener = Listener(self, port, backlog)
        self._listeners[port] = listener
        return listener

    def connect(self, remote_ip, remote_port: int, local_port: int | None = None
                ) -> "TcpConnection":
        """Start an active open (sends the SYN once the peer's MAC is known); ValueError if
        the 4-tuple is in use."""
        rip = ipv4(remote_ip)
        if local_port is None:
            local_port = self._ephemeral_port(rip, remote_port)
        key = (local_port, rip, remote_port)
        if key in self._conns:
            raise ValueError(f"connection {key} exists")
        conn = TcpConnection(self, local_port, rip, remote_port)
        self._conns[key] = conn
        conn._open_active()
        return conn

    @property
    def connections(self) -> list["TcpConnection"]:
        return list(self._conns.values())

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`poll` has work, or None if no timer runs."""
        times = [p[0] for p in self._arp_pending.values()]
        times += [t for c in self._conns.values() if (t := c._next_deadline()) is not None]
        return min(times, default=None)

    def poll(self) -> None:
        """Run every timer due at ``clock()``: ARP retries, RTO, persist, delayed ACK,
        TIME-WAIT."""
        now = self.clock()
        for ip, pending in list(self._arp_pending.items()):
            if pending[0] > now:
                continue
            if pending[1] >= self.arp_retries:
                self.counters["drop.arp_unresolved"] += len(pending[2])
                del self._arp_pending[ip]
                continue
            pending[0], pending[1] = now + self.arp_interval, pending[1] + 1
            self._arp_request(ip)
        for conn in list(self._conns.values()):
            conn._on_timers(now)

    def receive_frame(self, frame: bytes) -> None:
        """Process one received Ethernet frame (without FCS). Frames that are malformed, fail
        a checksum, or are not addressed to this host are counted in ``counters`` and
        dropped."""
        self.counters["frames_in"] += 1
        try:
            eth = EthernetFrame.decode(frame)
            if eth.dst != self.mac and eth.dst != BROADCAST_MAC:
                self._drop("not_our_mac")
            elif eth.ethertype == ETHERTYPE_ARP:
                self._rx_arp(ArpPacket.decode(eth.payload))
            elif eth.ethertype == ETHERTYPE_IPV4:
                self._rx_ip(IPv4Packet.decode(eth.payload))
            else:
                self._drop("ethertype")
        except TruncatedError:
            self._drop("truncated")
        except ChecksumError:
            self._drop("checksum")
        except BadFieldError:
            self._drop("malformed")

    # ---- link and network layers

    def _drop(self, reason: str) -> None:
        self.counters["drop." + reason] += 1

    def _tx(self, dst_mac: bytes, ethertype: int, payload: bytes) -> None:
        self.counters["frames_out"] += 1
        self._send(EthernetFrame(dst_mac, self.mac, ethertype, payload).encode(
            min_size=ETH_MIN_FRAME))

    def _arp_request(self, ip: bytes) -> None:
        self.counters["arp_requests_out"] += 1
        arp = ArpPacket(ARP_REQUEST, self.mac, self.ip, bytes(6), ip)
        self._tx(BROADCAST_MAC, ETHERTYPE_ARP, arp.encode())

    def _rx_arp(self, arp: ArpPacket) -> None:
        now = self.clock()
        merged = arp.sender_ip in self.arp_cache
        if merged:
            self.arp_cache[arp.sender_ip] = (arp.sender_mac, now + self.arp_ttl)
        if arp.target_ip != self.ip:
            self._drop("arp_not_for_us")
            return
        self.arp_cache[arp.sender_ip] = (arp.sender_mac, now + self.arp_ttl)
        pending = self._arp_pending.pop(arp.sender_ip, None)
        if pending:
            for packet in pending[2]:
                self._tx(arp.sender_mac, ETHERTYPE_IPV4, packet)
        if arp.op == ARP_REQUEST:
            self.counters["arp_replies_out"] += 1
            reply = ArpPacket(ARP_REPLY, self.mac, self.ip, arp.sender_mac, arp.sender_ip)
            self._tx(arp.sender_mac, ETHERTYPE_ARP, reply.encode())

    def _send_ip(self, dst: bytes, proto: int, payload: bytes) -> None:
        self._ident = (self._ident + 1) & 0xFFFF
        packet = IPv4Packet(self.ip, dst, proto, payload, ident=self._ident).encode()
        entry = self.arp_cache.get(dst)
        if entry is not None and entry[1] > self.clock():
            self._tx(entry[0], ETHERTYPE_IPV4, packet)
            return
        pending = self._arp_pending.get(dst)
        if pending is None:
            pending = self._arp_pending[dst] = [self.clock() + self.arp_interval, 1, []]
            self._arp_request(dst)
        if len(pending[2]) >= self.arp_queue:
            self._drop("arp_queue_full")
        else:
            pending[2].append(packet)

    def _rx_ip(self, packet: IPv4Packet) -> None:
        if packet.dst != self.ip:
            self._drop("not_our_ip")
        elif packet.is_fragment:
            self._drop("fragment")
        elif packet.proto == PROTO_ICMP:
            echo = IcmpEcho.decode(packet.payload)
            if echo.type != ICMP_ECHO_REQUEST:
                self._drop("icmp_type")
                return
            self.counters["echo_replies_out"] += 1
            reply = IcmpEcho(ICMP_ECHO_REPLY, echo.ident, echo.seq, echo.payload)
            self._send_ip(packet.src, PROTO_ICMP, reply.encode())
        elif packet.proto == PROTO_TCP:
            self._rx_tcp(packet.src, TcpSegment.decode(packet.payload, packet.src, self.ip))
        else:
            self._drop("protocol")

    # ---- TCP demultiplexing

    def _rx_tcp(self, src: bytes, seg: TcpSegment) -> None:
        self.counters["tcp_in"] += 1
        conn = self._conns.get((seg.dport, src, seg.sport))
        if conn is not None:
            conn._segment_arrives(seg)
            return
        listener = self._listeners.get(seg.dport)
        if listener is not None and seg.flags & (SYN | ACK | RST) == SYN:
            half_open = sum(1 for c in self._conns.values() if c._listener is listener
                            and c.state is S.SYN_RECEIVED)
            if half_open + len(listener._ready) >= listener.backlog:
                self._drop("backlog")
                return
            conn = TcpConnection(self, seg.dport, src, seg.sport)
            conn._listener = listener
            self._conns[(seg.dport, src, seg.sport)] = conn
            conn._open_passive(seg)
            return
        self._drop("no_connection")
        self._reset_for(src, seg)

    def _reset_for(self, src: bytes, seg: TcpSegment) -> None:
        """RFC 9293 section 3.10.7.1: the RST answering a segment for no connection."""
        if seg.flags & RST:
            return
        if seg.flags & ACK:
            rst = TcpSegment(seg.dport, seg.sport, seg.ack, 0, RST, 0)
        else:
            rst = TcpSegment(seg.dport, seg.sport, 0, (seg.seq + seg.seg_len) & _MASK,
                             RST | ACK, 0)
        self.counters["resets_out"] += 1
        self._send_ip(src, PROTO_TCP, rst.encode(self.ip, src))

    def _ephemeral_port(self, rip: bytes, rport: int) -> int:
        for _ in range(16384):
            port = self._next_port
            self._next_port = 49152 + (self._next_port - 49152 + 1) % 16384
            if (port, rip, rport) not in self._conns and port not in self._listeners:
                return port
        raise ValueError("no free ephemeral port")

    def _isn(self, lport: int, rip: bytes, rport: int) -> int:
        if self._isn_hook is not None:
            return self._isn_hook(lport, rip, rport) & _MASK
        tuple_bytes = self.ip + struct.pack("!H", lport) + rip + struct.pack("!H", rport)
        keyed = hashlib.sha256(tuple_bytes + self._secret).digest()
        return (int(self.clock() * 250_000) + int.from_bytes(keyed[:4], "big")) & _MASK

    def _event(self, conn: "TcpConnection", kind: str) -> None:
        if self.on_event is not None:
            self.on_event(conn, kind)


class TcpConnection:
    """One TCP connection of a :class:`RawStack` (made by ``connect`` or a listener).

    The application side: :meth:`send` queues bytes, :meth:`recv` takes received bytes,
    :meth:`close` sends a FIN after the queued bytes, :meth:`abort` sends an RST. ``state`` is a
    :class:`TcpState`; ``error`` is None, or why the connection ended abnormally (``"reset"``,
    ``"refused"``, ``"timeout"``, ``"aborted"``). ``counters`` counts segments in and out,
    bytes, retransmissions, timeouts, duplicate ACKs, fast retransmits, challenge ACKs,
    zero-window probes and every drop as ``"drop.<reason>"``.
    """

    def __init__(self, stack: RawStack, local_port: int, remote_ip: bytes, remote_port: int):
        self.stack = stack
        self.cfg = stack.config
        self.local_port, self.remote_ip, self.remote_port = local_port, remote_ip, remote_port
        self.state = S.CLOSED
        self.error: str | None = None
        self.counters: Counter[str] = Counter()
        self._listener: Listener | None = None
        self.mss = min(self.cfg.mss, stack.mtu - 40)
        self.rcv_wscale = 0
        if self.cfg.window_scaling:
            while (self.cfg.rcv_buffer >> self.rcv_wscale) > 0xFFFF:
                self.rcv_wscale += 1
        self.snd_wscale = 0
        self._wscale_ok = False
        self._sack_ok = False
        self.send_mss = _DEFAULT_MSS
        # send sequence space: [snd_una, snd_nxt) in flight, snd_max the highest ever sent
        self.iss = stack._isn(local_port, remote_ip, remote_port)
        self.snd_una = self.snd_nxt = self.snd_max = self.iss
        self._probe_end = self.iss
        self._sndbuf = bytearray()
        self._buf_seq = self.iss + 1
        self._fin_queued = False
        self.snd_wnd = 0
        self._snd_wl1 = self._snd_wl2 = 0
        self._max_snd_wnd = 0
        self.cwnd = self.ssthresh = 0
        self._dupacks = 0
        self._in_recovery = False
        self._recover = self.iss
        # RFC 6298 state
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = self.cfg.rto_initial
        self._rtt_seq: int | None = None
        self._rtt_time = 0.0
        self._retries = 0
        self._persist_backoff = 0
        # receive sequence space
        self.irs = 0
        self.rcv_nxt = 0
        self._rxbuf = bytearray()
        self._ooo: dict[int, bytes] = {}
        self._fin_seq: int | None = None
        self.fin_received = False
        self._unacked_segments = 0
        self._rcv_adv = 0
        self._invalid_ack_time = -float("inf")
        # timers: absolute deadlines or None
        self._t_rtx = self._t_delack = self._t_persist = self._t_timewait = None

    def __repr__(self):
        return (f"<TcpConnection :{self.local_port} -> {'.'.join(map(str, self.remote_ip))}:"
                f"{self.remote_port} {self.state.value}>")

    # ---- application interface

    def send(self, data: bytes) -> int:
        """Queue ``data`` for transmission; returns its length. The buffer takes whatever it
        is given: an application bounds itself by :attr:`room`. TcpError once ``close`` or
        ``abort`` was called or the connection has ended."""
        if self._fin_queued or self.state in (S.CLOSED, S.FIN_WAIT_1, S.FIN_WAIT_2, S.CLOSING,
                                               S.LAST_ACK, S.TIME_WAIT):
            raise TcpError(f"cannot send in {self.state.value}"
                           + (" after close" if self._fin_queued else ""))
        self._sndbuf += data
        self._output()
        return len(data)

    def recv(self, max_bytes: int = 1 << 20) -> bytes:
        """Up to ``max_bytes`` received in-order bytes; b"" when none are waiting (see
        :attr:`eof`). Reading opens the receive window and may send a window update."""
        data = bytes(self._rxbuf[:max_bytes])
        del self._rxbuf[:len(data)]
        if data and self.state in _RECEIVING:
            edge = self.rcv_nxt + self._rcv_window()
            if edge - self._rcv_adv >= min(self.cfg.rcv_buffer // 2, self.mss):
                self._send_ack()
        return data

    def close(self) -> None:
        """Send a FIN once every queued byte is sent (an orderly close of this direction).
        Before the SYN is answered the connection simply ends. Repeated calls do nothing."""
        if self.state is S.SYN_SENT:
            self._finish(None)
        elif self.state in (S.SYN_RECEIVED, S.ESTABLISHED, S.CLOSE_WAIT):
            self._fin_queued = True
            if self.state is S.ESTABLISHED:
                self.state = S.FIN_WAIT_1
            elif self.state is S.CLOSE_WAIT:
                self.state = S.LAST_ACK
            self._output()

    def abort(self) -> None:
        """Send an RST (in a synchronized state) and end the connection with error
        ``"aborted"``. Does nothing on an ended connection."""
        if self.state is S.CLOSED:
            return
        if self.state not in (S.SYN_SENT, S.TIME_WAIT):
            self._emit(self.snd_max, RST | ACK)
        self._finish("aborted")

    @property
    def available(self) -> int:
        """Received bytes waiting for :meth:`recv`."""
        return len(self._rxbuf)

    @property
    def eof(self) -> bool:
        """True once the peer's FIN has arrived and every byte before it was read."""
        return self.fin_received and not self._rxbuf

    @property
    def unacked(self) -> int:
        """Bytes queued by :meth:`send` and not yet acknowledged by the peer."""
        return len(self._sndbuf)

    @property
    def room(self) -> int:
        """What :meth:`send` may still queue within ``cfg.snd_buffer``; once the peer's
        acknowledgements make more, the ``"sent"`` event says so."""
        return max(0, self.cfg.snd_buffer - len(self._sndbuf))

    # ---- opening

    def _open_active(self):
        self.state = S.SYN_SENT
        self._send_syn()

    def _open_passive(self, seg: TcpSegment):
        self.state = S.SYN_RECEIVED
        self._syn_options(seg)
        self._send_syn()

    def _syn_options(self, seg: TcpSegment):
        """Take the peer's ISN and SYN options (RFC 9293 3.7.1, RFC 7323 2.2-2.3)."""
        self.irs = seg.seq
        self.rcv_nxt = self.irs + 1
        self._rcv_adv = self.rcv_nxt
        self.send_mss = max(64, min(self.mss, seg.mss if seg.mss is not None else _DEFAULT_MSS))
        self._wscale_ok = seg.wscale is not None and self.cfg.window_scaling
        self._sack_ok = seg.sack_permitted and self.cfg.sack_permitted
        if self._wscale_ok:
            self.snd_wscale = min(seg.wscale, 14)
        else:
            self.snd_wscale = self.rcv_wscale = 0
        self.snd_wnd = seg.window  # never scaled in a SYN
        self._max_snd_wnd = self.snd_wnd
        self._snd_wl1 = seg.seq
        self.cwnd = self.cfg.initial_window * self.send_mss
        self.ssthresh = 0xFFFF << 14

    def _send_syn(self):
        passive = self.state is S.SYN_RECEIVED
        offer = self._wscale_ok if passive else self.cfg.window_scaling
        seg = TcpSegment(self.local_port, self.remote_port, self.iss & _MASK,
                         self.rcv_nxt & _MASK if passive else 0, SYN | (ACK if passive else 0),
                         min(self._rcv_window(), 0xFFFF), mss=self.mss,
                         wscale=self.rcv_wscale if offer else None,
                         sack_permitted=self._sack_ok if passive else self.cfg.sack_permitted)
        self.snd_nxt = self.snd_max = self.iss + 1
        if self._rtt_seq is None and self._retries == 0:
            self._rtt_seq, self._rtt_time = self.iss + 1, self.stack.clock()
        self._transmit(seg)
        self._t_rtx = self.stack.clock() + self.rto

    def _established(self):
        self.state = S.FIN_WAIT_1 if self._fin_queued else S.ESTABLISHED
        self.stack._event(self, "established")
        if self._listener is not None:
            self._listener._ready.append(self)

    # ---- output

    def _rcv_window(self) -> int:
        """The receive window in bytes: the free buffer, but never less than keeps the right
        edge where it was advertised (RFC 9293 3.8.6.2.2, RFC 7323 2.4), rounded up to the
        scale unit (so the buffer may overfill by less than one unit)."""
        free = max(0, self.cfg.rcv_buffer - len(self._rxbuf))
        window = max(free, self._rcv_adv - self.rcv_nxt)
        unit = 1 << self.rcv_wscale
        return min(-(-window // unit), 0xFFFF) * unit

    def _transmit(self, seg: TcpSegment):
        self.counters["segments_out"] += 1
        self.stack._send_ip(self.remote_ip, PROTO_TCP,
                            seg.encode(self.stack.ip, self.remote_ip))

    def _emit(self, seq: int, flags: int, payload: bytes = b""):
        """Send a segment from the synchronized state, carrying our ACK and window."""
        window = self._rcv_window()
        self._rcv_adv = max(self._rcv_adv, self.rcv_nxt + window)
        self._transmit(TcpSegment(self.local_port, self.remote_port, seq & _MASK,
                                  self.rcv_nxt & _MASK, flags | ACK,
                                  window >> self.rcv_wscale, payload))
        self._t_delack = None
        self._unacked_segments = 0

    def _send_ack(self):
        """A pure ACK. It carries SND.MAX, not a SND.NXT pulled back by a timeout: the peer
        may hold everything up to SND.MAX already, and would find an older number
        unacceptable and drop the ACK with it."""
        self._emit(self.snd_max, 0)

    def _data_end(self) -> int:
        return self._buf_seq + len(self._sndbuf)

    def _send_data(self, seq: int, length: int, fin: bool):
        """Send ``length`` bytes from ``seq`` (plus FIN); counts retransmissions (Karn)."""
        start = seq - self._buf_seq
        payload = bytes(self._sndbuf[start:start + length])
        if seq < self.snd_max:
            self.counters["retransmissions"] += 1
            if self._rtt_seq is not None and seq < self._rtt_seq:
                self._rtt_seq = None
        elif self._rtt_seq is None and (length or fin):
            self._rtt_seq, self._rtt_time = seq + length + fin, self.stack.clock()
        push = PSH if length and seq + length == self._data_end() else 0
        self.counters["bytes_out"] += length
        self._emit(seq, push | (FIN if fin else 0), payload)
        self.snd_max = max(self.snd_max, seq + length + fin)
        if self._t_rtx is None:
            self._t_rtx = self.stack.clock() + self.rto

    def _output(self):
        """Send what the send and congestion windows allow (Nagle off, sender SWS avoidance)."""
        if self.state not in _SENDING:
            return
        while True:
            data_end = self._data_end()
            remaining = data_end - self.snd_nxt
            fin = self._fin_queued and self.snd_nxt <= data_end
            usable = self.snd_una + min(self.snd_wnd, self.cwnd) - self.snd_nxt
            length = max(0, min(self.send_mss, remaining, usable))
            if remaining > 0 and length < min(self.send_mss, remaining):
                in_flight = self.snd_nxt > self.snd_una
                if length == 0 or (in_flight and length < self._max_snd_wnd // 2):
                    break
            fin = fin and self.snd_nxt + length == data_end
            if length == 0 and not fin:
                break
            self._send_data(self.snd_nxt, length, fin)
            self.snd_nxt += length + fin
        if (self.snd_wnd == 0 and self.snd_max == self.snd_una and self._t_persist is None
                and (self._data_end() > self.snd_nxt)):
            self._t_persist = self.stack.clock() + self._persist_interval()

    def _persist_interval(self) -> float:
        base = max(self.rto, self.cfg.rto_min)
        return min(base * (1 << self._persist_backoff), self.cfg.rto_max)

    def _retransmit_first(self) -> int:
        """Resend the oldest unacknowledged segment regardless of the windows; its length."""
        data_end = self._data_end()
        length = max(0, min(self.send_mss, data_end - self.snd_una))
        fin = self._fin_queued and self.snd_una + length == data_end and self.snd_max > data_end
        self._send_data(self.snd_una, length, fin)
        return length + fin

    # ---- timers

    def _next_deadline(self) -> float | None:
        times = [t for t in (self._t_rtx, self._t_delack, self._t_persist, self._t_timewait)
                 if t is not None]
        return min(times, default=None)

    def _on_timers(self, now: float):
        if self._t_timewait is not None and now >= self._t_timewait:
            self._finish(None)
            return
        if self._t_delack is not None and now >= self._t_delack:
            self._send_ack()
        if self._t_rtx is not None and now >= self._t_rtx:
            self._on_rto(now)
        if self._t_persist is not None and now >= self._t_persist:
            self._t_persist = None
            if self.snd_wnd == 0 and self.snd_max == self.snd_una and self.state in _SENDING:
                self._zero_window_probe()
                self._persist_backoff += 1
                self._t_persist = now + self._persist_interval()

    def _zero_window_probe(self):
        """RFC 9293 3.8.6.1: one byte past the closed window; snd_nxt does not move."""
        self.counters["zero_window_probes"] += 1
        start = self.snd_una - self._buf_seq
        self.counters["bytes_out"] += 1
        self._emit(self.snd_una, 0, bytes(self._sndbuf[start:start + 1]))
        self._probe_end = max(self._probe_end, self.snd_una + 1)

    def _on_rto(self, now: float):
        """RFC 6298 section 5.4-5.6 and RFC 5681 section 3.1 on a retransmission timeout."""
        self._t_rtx = None
        self._retries += 1
        limit = self.cfg.syn_retries if self.state in (S.SYN_SENT, S.SYN_RECEIVED) \
            else self.cfg.max_retries
        if self._retries > limit:
            self._finish("timeout")
            return
        self.counters["timeouts"] += 1
        self.rto = min(self.rto * 2, self.cfg.rto_max)
        self._rtt_seq = None
        if self.state in (S.SYN_SENT, S.SYN_RECEIVED):
            self.counters["retransmissions"] += 1
            self._send_syn()
            return
        if self.snd_max == self.snd_una:
            return
        flight = self.snd_max - self.snd_una
        self.ssthresh = max(flight // 2, 2 * self.send_mss)
        self.cwnd = self.send_mss
        self._in_recovery = False
        self._dupacks = 0
        self._recover = self.snd_max
        self.snd_nxt = self.snd_una + self._retransmit_first()
        self._t_rtx = now + self.rto

    # ---- input

    def _segment_arrives(self, seg: TcpSegment):
        """RFC 9293 section 3.10.7.3 and 3.10.7.4, with the RFC 5961 checks."""
        self.counters["segments_in"] += 1
        if self.state is S.SYN_SENT:
            self._syn_sent_arrives(seg)
            return
        seq = _unwrap(seg.seq, self.rcv_nxt)
        syn, fin, rst = seg.flags & SYN, seg.flags & FIN, seg.flags & RST
        if self.state is S.SYN_RECEIVED and syn and not seg.flags & ACK and seq == self.irs:
            self.counters["retransmissions"] += 1
            self._send_syn()  # the peer lost our SYN-ACK
            return
        seg_len = seg.seg_len
        wnd = self._rcv_window()
        if seg_len == 0:
            ok = seq == self.rcv_nxt if wnd == 0 else self.rcv_nxt <= seq < self.rcv_nxt + wnd
        else:
            last = seq + seg_len - 1
            ok = wnd > 0 and (self.rcv_nxt <= seq < self.rcv_nxt + wnd
                              or self.rcv_nxt <= last < self.rcv_nxt + wnd)
        if not ok:
            self.counters["drop.out_of_window"] += 1
            if self.state is S.TIME_WAIT and fin:
                self._t_timewait = self.stack.clock() + self.cfg.time_wait
            now = self.stack.clock()
            limit = self._invalid_ack_time + self.cfg.invalid_ack_interval
            if rst or (seg_len == 0 and now < limit):
                return  # an ACK answering an unacceptable ACK: rate-limited (no ACK wars)
            if seg_len == 0:
                self._invalid_ack_time = now
            self._send_ack()
            return
        if rst:
            if seq != self.rcv_nxt:
                self._challenge_ack("rst")
            elif self.state is S.SYN_RECEIVED and self._listener is not None:
                self._finish(None, silent=True)
            else:
                self._finish(None if self.state is S.TIME_WAIT else "reset")
            return
        if syn:
            self._challenge_ack("syn")
            return
        if not seg.flags & ACK:
            self.counters["drop.no_ack"] += 1
            return
        ack = _unwrap(seg.ack, self.snd_una)
        if self.state is S.SYN_RECEIVED:
            if not self.snd_una < ack <= self.snd_max:
                self.counters["drop.bad_ack"] += 1
                self._transmit(TcpSegment(self.local_port, self.remote_port, seg.ack, 0, RST, 0))
                return
            self._established()
        queued = len(self._sndbuf)
        if not self._process_ack(seg, seq, ack):
            return
        fin_acked = self._fin_queued and self.snd_una > self._data_end()
        if fin_acked:
            if self.state is S.FIN_WAIT_1:
                self.state = S.FIN_WAIT_2
            elif self.state is S.CLOSING:
                self._enter_time_wait()
            elif self.state is S.LAST_ACK:
                self._finish(None)
                return
        if seg.payload or fin:
            self._receive(seq, seg.payload, bool(fin))
        self._output()
        if len(self._sndbuf) < queued and self.state is not S.CLOSED:
            self.stack._event(self, "sent")

    def _challenge_ack(self, why: str):
        self.counters["challenge_acks"] += 1
        self.counters["drop.challenged_" + why] += 1
        self._send_ack()

    def _syn_sent_arrives(self, seg: TcpSegment):
        ack = _unwrap(seg.ack, self.snd_una)
        has_ack = seg.flags & ACK
        if has_ack and not self.iss < ack <= self.snd_max:
            self.counters["drop.bad_ack"] += 1
            if not seg.flags & RST:
                self._transmit(TcpSegment(self.local_port, self.remote_port, seg.ack, 0, RST, 0))
            return
        if seg.flags & RST:
            if has_ack:
                self._finish("refused")
            else:
                self.counters["drop.rst_without_ack"] += 1
            return
        if not seg.flags & SYN:
            self.counters["drop.no_syn"] += 1
            return
        self._syn_options(seg)
        if has_ack:
            self._ack_advance(ack)
            self._snd_wl2 = ack
            self._established()
            self._send_ack()
            self._output()
        else:
            self.state = S.SYN_RECEIVED  # simultaneous open
            self._send_syn()

    def _process_ack(self, seg: TcpSegment, seq: int, ack: int) -> bool:
        """Step five of RFC 9293 3.10.7.4; False if the segment is to be dropped."""
        if ack > max(self.snd_max, self._probe_end):
            self.counters["drop.ack_unsent"] += 1
            self._send_ack()
            return False
        if ack < self.snd_una - max(self._max_snd_wnd, 1):
            self._challenge_ack("old_ack")
            return False
        window = seg.window << self.snd_wscale
        if ack > self.snd_una:
            self._ack_advance(ack)
        elif (ack == self.snd_una and seg.seg_len == 0
              and window == self.snd_wnd and self.snd_max > self.snd_una):
            self._duplicate_ack()
        if self._snd_wl1 < seq or (self._snd_wl1 == seq and self._snd_wl2 <= ack):
            self.snd_wnd = window
            self._snd_wl1, self._snd_wl2 = seq, ack
            self._max_snd_wnd = max(self._max_snd_wnd, window)
            if window:
                self._t_persist = None
                self._persist_backoff = 0
        return True

    def _ack_advance(self, ack: int):
        """New data acknowledged: free the buffer, sample RTT, grow cwnd, restart the RTO."""
        acked = ack - self.snd_una
        freed = max(0, min(ack, self._data_end()) - self._buf_seq)
        del self._sndbuf[:freed]
        self._buf_seq += freed
        self.snd_una = ack
        self.snd_nxt = max(self.snd_nxt, ack)
        self.snd_max = max(self.snd_max, ack)
        self._retries = 0
        now = self.stack.clock()
        if self._rtt_seq is not None and ack >= self._rtt_seq:
            self._rtt_sample(now - self._rtt_time)
            self._rtt_seq = None
        if self._in_recovery:
            if ack >= self._recover:
                self._in_recovery = False
                self.cwnd = min(self.ssthresh, self.snd_max - self.snd_una + self.send_mss)
            else:
                self._retransmit_first()  # RFC 6582 partial ACK
                self.cwnd = max(self.cwnd - acked + self.send_mss, self.send_mss)
                self._t_rtx = now + self.rto
        elif self.cwnd < self.ssthresh:
            self.cwnd += min(acked, self.send_mss)
        else:
            self.cwnd += max(1, self.send_mss * self.send_mss // self.cwnd)
        self._dupacks = 0
        self._t_rtx = None if self.snd_una >= self.snd_max else now + self.rto

    def _duplicate_ack(self):
        self.counters["dup_acks"] += 1
        self._dupacks += 1
        if self._in_recovery:
            self.cwnd += self.send_mss
        elif self._dupacks == 3 and self.snd_una >= self._recover:
            self.counters["fast_retransmits"] += 1
            self.ssthresh = max((self.snd_max - self.snd_una) // 2, 2 * self.send_mss)
            self._in_recovery = True
            self._recover = self.snd_max
            self._retransmit_first()
            self.cwnd = self.ssthresh + 3 * self.send_mss

    def _rtt_sample(self, r: float):
        """RFC 6298 section 2.2-2.4."""
        self.counters["rtt_samples"] += 1
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        rto = self.srtt + max(self.cfg.clock_granularity, 4 * self.rttvar)
        self.rto = min(max(rto, self.cfg.rto_min), self.cfg.rto_max)

    def _receive(self, seq: int, data: bytes, fin: bool):
        """Steps seven and eight: place the text (in order, or kept out of order), then FIN."""
        if seq < self.rcv_nxt:
            data = data[self.rcv_nxt - seq:]
            seq = self.rcv_nxt
        limit = self.rcv_nxt + self._rcv_window()
        if seq + len(data) > limit:
            self.counters["drop.beyond_window_bytes"] += seq + len(data) - limit
            data = data[:max(0, limit - seq)]
            fin = False
        if fin:
            self._fin_seq = seq + len(data)
        if data and self.state not in _RECEIVING:
            self.counters["drop.data_after_fin"] += 1
            data = b""
        if not data and not fin:
            self._send_ack()
            return
        if seq == self.rcv_nxt:
            filled_hole = bool(self._ooo)
            self._append(data)
            while self._ooo:
                start = min(self._ooo)
                if start > self.rcv_nxt:
                    break
                chunk = self._ooo.pop(start)
                if start + len(chunk) > self.rcv_nxt:
                    self._append(chunk[self.rcv_nxt - start:])
            if data or filled_hole:
                self.stack._event(self, "data")
            self._unacked_segments += 1
            if filled_hole or self._unacked_segments >= 2:
                self._send_ack()
            elif self._t_delack is None:
                self._t_delack = self.stack.clock() + self.cfg.delayed_ack
        elif data:
            self.counters["out_of_order"] += 1
            if len(self._ooo.get(seq, b"")) < len(data):
                self._ooo[seq] = data
            self._send_ack()
        if self._fin_seq is not None and self._fin_seq == self.rcv_nxt and not self.fin_received:
            self._receive_fin()

    def _append(self, data: bytes):
        self._rxbuf += data
        self.rcv_nxt += len(data)
        self.counters["bytes_in"] += len(data)

    def _receive_fin(self):
        self.rcv_nxt += 1
        self.fin_received = True
        self._ooo.clear()
        if self.state is S.ESTABLISHED:
            self.state = S.CLOSE_WAIT
        elif self.state is S.FIN_WAIT_1:
            self.state = S.CLOSING
        elif self.state is S.FIN_WAIT_2:
            self._enter_time_wait()
        self._send_ack()
        self.stack._event(self, "fin")

    def _enter_time_wait(self):
        self.state = S.TIME_WAIT
        self._t_rtx = self._t_persist = None
        self._t_timewait = self.stack.clock() + self.cfg.time_wait

    def _finish(self, error: str | None, *, silent: bool = False):
        """Enter CLOSED, free the 4-tuple, and report ``closed`` (unless ``silent``)."""
        self.state = S.CLOSED
        self.error = error
        self._t_rtx = self._t_delack = self._t_persist = self._t_timewait = None
        key = (self.local_port, self.remote_ip, self.remote_port)
        if self.stack._conns.get(key) is self:
            del self.stack._conns[key]
        if not silent:
            self.stack._event(self, "closed")

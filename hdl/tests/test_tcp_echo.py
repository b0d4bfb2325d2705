# amaranth: UnusedElaboratable=no
"""TcpEcho under the Amaranth simulator against a model of the TCP engine's host side written
here: connection slots with the engine's command rules (LISTEN only on a closed slot, CLOSE
answered with CLOSED, a refused LISTEN with ABORTED), peers opening, sending chunks and ending
with FIN, RST, a timeout or a FIN then RST, stray CLOSED events, and the engine's delivery timing
(a chunk's header offered within a few cycles, its PEER_FIN possibly before). Widths 1, 8, 64,
random idle and stall on every stream.

Checked: the model's rules are never broken (in particular a CLOSE only once every byte received
before the FIN has been echoed), every chunk comes back on its connection with its length and
bytes, in order, every slot is listening again at the end, and the counters.

Then the whole server (EchoNode: MAC, IP, TCP engine, TcpEcho) on its GMII pins against a peer
whose frames scapy builds and checks: ARP, ping, and two TCP echo sessions on one slot."""

import ipaddress
import random
import zlib

import pytest
from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from iwarp_nic.apps import EchoNode, TcpEcho
from iwarp_nic.eth import PREAMBLE
from iwarp_nic.tcp.layouts import CommandOp, EventKind
from iwarp_tb.amsim import run
from iwarp_tb.beats import to_beats

PORT = 7
IDLE = STALL = 0.25
ENDINGS = ("fin", "fin", "reset", "timeout", "fin_reset")


class EngineModel:
    """The engine's host ports, as processes around a TcpEcho; see the module docstring.

    ``state[c]`` is the slot's state as the engine sees it: "closed", "listen", "open",
    "close_wait" (PEER_FIN sent), "last_ack" (CLOSE taken). Peers act on random slots each cycle
    until ``target`` connections have been opened; the run ends when every slot listens again
    and every chunk has been echoed.
    """

    def __init__(self, dut, n, rng, *, target, max_chunk, refuse=0.1, stray=0.02):
        self.dut, self.n, self.rng = dut, n, rng
        self.target, self.max_chunk = target, max_chunk
        self.refuse, self.stray = refuse, stray
        conns = dut.conns
        self.state = ["closed"] * conns
        self.plan = [None] * conns
        self.sent = [0] * conns        # bytes queued for the connection on the slot
        self.echoed = [0] * conns      # bytes of it echoed back
        self.fin_at = [None] * conns   # bytes sent before the peer's FIN
        self.pending = [0] * conns     # chunks queued and not yet wholly echoed
        self.events, self.later = [], []
        self.rx_headers, self.rx_beats = [], []
        self.rx_chunks, self.tx_chunks = [], []
        self.tx_open = []              # tx headers taken, bytes still due: [conn, length, data]
        self.violations = []
        self.opened = self.closes = 0
        self.done = False

    # --- helpers -----------------------------------------------------------------------------

    def violation(self, cycle, text):
        self.violations.append(f"cycle {cycle}: {text}")

    def event(self, kind, conn):
        self.events.append((kind, conn))

    def queue_chunk(self, cycle, conn, data):
        self.rx_headers.append((conn, len(data), cycle))
        self.rx_beats += [beat._asdict() for beat in to_beats(data, self.n)]
        self.rx_chunks.append((conn, data))
        self.sent[conn] += len(data)
        self.pending[conn] += 1

    def finished(self):
        return (self.opened >= self.target and all(s == "listen" for s in self.state)
                and not any(self.pending) and not self.events and not self.later)

    # --- the engine's command handling -------------------------------------------------------

    def command(self, cycle, op, conn, port):
        if port != PORT:
            self.violation(cycle, f"command for port {port}")
        if op == CommandOp.LISTEN.value:
            if self.state[conn] != "closed":
                self.violation(cycle, f"LISTEN on slot {conn} in {self.state[conn]}")
                self.event(EventKind.ABORTED, conn)
            elif self.rng.random() < self.refuse:
                self.event(EventKind.ABORTED, conn)   # no room in the listen table
            else:
                self.state[conn] = "listen"
        elif op == CommandOp.CLOSE.value:
            if self.state[conn] == "close_wait":
                if self.echoed[conn] != self.fin_at[conn]:
                    self.violation(cycle, f"CLOSE on slot {conn} with {self.echoed[conn]} of "
                                          f"{self.fin_at[conn]} bytes echoed")
                self.state[conn] = "last_ack"
                self.closes += 1
                self.later.append((cycle + self.rng.randint(1, 30), "closed", conn))
            elif self.state[conn] == "closed":
                self.event(EventKind.CLOSED, conn)    # the engine's answer on a free slot
            else:
                self.violation(cycle, f"CLOSE on slot {conn} in {self.state[conn]}")
        else:
            self.violation(cycle, f"unexpected command {op} on slot {conn}")

    def due(self, cycle):
        """Deferred peer actions: the final ACK of a close, a RST after a FIN."""
        for item in [item for item in self.later if item[0] <= cycle]:
            self.later.remove(item)
            _, what, conn = item
            if what == "closed" and self.state[conn] == "last_ack":
                self.state[conn] = "closed"
                self.event(EventKind.CLOSED, conn)
            if what == "reset" and self.state[conn] in ("close_wait", "last_ack"):
                self.state[conn] = "closed"
                self.event(EventKind.RESET, conn)

    def peer(self, cycle, conn):
        """One step of the peer on slot ``conn``."""
        rng, state = self.rng, self.state[conn]
        if state == "listen":
            if rng.random() < self.stray:
                self.event(EventKind.CLOSED, conn)    # must be ignored
            elif self.opened < self.target and not self.pending[conn]:
                self.opened += 1
                self.state[conn] = "open"
                self.sent[conn] = self.echoed[conn] = 0
                self.plan[conn] = [rng.randint(0, 4), rng.choice(ENDINGS)]
                self.event(EventKind.ESTABLISHED, conn)
        elif state == "open":
            plan = self.plan[conn]
            if plan[0]:
                plan[0] -= 1
                self.queue_chunk(cycle, conn, rng.randbytes(rng.randint(1, self.max_chunk)))
            elif plan[1] in ("fin", "fin_reset"):
                self.state[conn] = "close_wait"
                self.fin_at[conn] = self.sent[conn]
                self.event(EventKind.PEER_FIN, conn)
                if plan[1] == "fin_reset":
                    self.later.append((cycle + rng.randint(0, 40), "reset", conn))
            else:
                self.state[conn] = "closed"
                self.event(EventKind.RESET if plan[1] == "reset" else EventKind.TIMEOUT, conn)

    # --- processes ---------------------------------------------------------------------------

    async def peers(self, ctx):
        cycle = quiet = 0
        while quiet < 100:
            await ctx.tick()
            cycle += 1
            if cycle > 200 * self.target * self.max_chunk + 20_000:
                self.done = True
                raise AssertionError(f"stuck: slots {self.state}, {len(self.events)} events, "
                                     f"{len(self.rx_headers)} headers and {len(self.rx_beats)} "
                                     f"beats to send, pending {self.pending}, "
                                     f"violations {self.violations}")
            self.due(cycle)
            if self.rng.random() < 0.1:
                self.peer(cycle, self.rng.randrange(self.dut.conns))
            quiet = quiet + 1 if self.finished() else 0
        self.done = True

    async def commands(self, ctx):
        port, cycle = self.dut.o_cmd, 0
        while not self.done:
            ready = self.rng.random() >= STALL
            ctx.set(port.ready, ready)
            *_, valid, op, conn, local = await ctx.tick().sample(
                port.valid, port.payload.op, port.payload.conn, port.payload.local_port)
            cycle += 1
            if valid and ready:
                self.command(cycle, op.value if hasattr(op, "value") else op, conn, local)

    async def event_source(self, ctx):
        port = self.dut.i_event
        while not self.done:
            offer = bool(self.events) and self.rng.random() >= IDLE
            ctx.set(port.valid, offer)
            if offer:
                kind, conn = self.events[0]
                ctx.set(port.payload.kind, kind)
                ctx.set(port.payload.conn, conn)
                ctx.set(port.payload.local_port, PORT)
            *_, ready = await ctx.tick().sample(port.ready)
            if offer:
                assert ready, "TcpEcho must always take events"
                self.events.pop(0)

    async def rx_header_source(self, ctx):
        """Headers in order; each is offered at most 3 cycles after it was queued and after the
        one before it was taken (the engine's delivery latency)."""
        port, cycle, free_at = self.dut.i_rx_header, 0, 0
        delay = self.rng.randint(0, 3)
        while not self.done:
            head = self.rx_headers[0] if self.rx_headers else None
            offer = head is not None and cycle >= max(head[2], free_at) + delay
            ctx.set(port.valid, offer)
            if offer:
                ctx.set(port.payload.conn, head[0])
                ctx.set(port.payload.length, head[1])
            *_, ready = await ctx.tick().sample(port.ready)
            cycle += 1
            if offer and ready:
                self.rx_headers.pop(0)
                free_at, delay = cycle, self.rng.randint(0, 3)

    async def rx_data_source(self, ctx):
        port = self.dut.i_rx
        while not self.done:
            offer = bool(self.rx_beats) and self.rng.random() >= IDLE
            ctx.set(port.valid, offer)
            if offer:
                for name, value in self.rx_beats[0].items():
                    if name != "err":
                        ctx.set(port.payload[name], value)
            *_, ready = await ctx.tick().sample(port.ready)
            if offer and ready:
                self.rx_beats.pop(0)

    async def tx_header_sink(self, ctx):
        port = self.dut.o_tx_header
        while not self.done:
            ready = self.rng.random() >= STALL
            ctx.set(port.ready, ready)
            *_, valid, conn, length = await ctx.tick().sample(port.valid, port.payload.conn,
                                                              port.payload.length)
            if valid and ready:
                self.tx_open.append([conn, length, bytearray()])

    async def tx_data_sink(self, ctx):
        """Bytes of the chunks whose headers were taken, as the engine's ring gate takes them
        (none before the header)."""
        port, n = self.dut.o_tx, self.n
        while not self.done:
            ready = bool(self.tx_open) and self.rng.random() >= STALL
            ctx.set(port.ready, ready)
            *_, valid, data, keep, last = await ctx.tick().sample(
                port.valid, port.payload.data, port.payload.keep, port.payload.last)
            if not (valid and ready):
                continue
            conn, length, got = self.tx_open[0]
            count = keep.bit_length()
            assert keep == (1 << count) - 1 and (last or count == n), f"bad beat keep {keep:#x}"
            got += (data & ((1 << 8 * count) - 1)).to_bytes(count, "little")
            assert len(got) <= length and bool(last) == (len(got) == length), (
                f"chunk of {length} bytes ended after {len(got)}")
            if last:
                self.tx_open.pop(0)
                self.tx_chunks.append((conn, bytes(got)))
                self.echoed[conn] += length
                self.pending[conn] -= 1

    def processes(self):
        return [self.peers, self.commands, self.event_source, self.rx_header_source,
                self.rx_data_source, self.tx_header_sink, self.tx_data_sink]


def run_model(n, conns, seed, **kw):
    dut = TcpEcho(n, conns, PORT)
    model = EngineModel(dut, n, random.Random(seed), **kw)
    counters = {}

    async def read_counters(ctx):
        while not model.done:
            await ctx.tick()
        counters.update(accepted=ctx.get(dut.accepted), echoed_bytes=ctx.get(dut.echoed_bytes))

    run(dut, *model.processes(), read_counters, name=f"tcp_echo_w{n}")
    assert model.violations == []
    assert model.tx_chunks == model.rx_chunks
    assert counters == {"accepted": model.opened,
                        "echoed_bytes": sum(len(data) for _, data in model.rx_chunks)}
    return model


@pytest.mark.parametrize("n,conns", [(1, 4), (8, 3), (64, 2), (8, 1)])
def test_echo(n, conns):
    """Random peers on every slot: chunks echoed exactly and in order, CLOSE only after the
    echo, every ending followed by a new LISTEN."""
    model = run_model(n, conns, f"echo{n}/{conns}", target=60, max_chunk=3 * n + 5)
    assert model.closes > 5 and len(model.rx_chunks) > 30


def test_close_waits_for_the_echo():
    """A chunk and the FIN right behind it while the send side stalls for hundreds of cycles:
    the CLOSE waits until the last byte is handed over (the model rejects an early one)."""
    dut = TcpEcho(8, 1, PORT)
    model = EngineModel(dut, 8, random.Random(3), target=1, max_chunk=1, refuse=0, stray=0)
    order = []

    async def script(ctx):
        while model.state[0] != "listen":
            await ctx.tick()
        model.opened = 1
        model.state[0] = "open"
        model.event(EventKind.ESTABLISHED, 0)
        await ctx.tick().repeat(5)
        model.queue_chunk(0, 0, bytes(range(200)))
        model.state[0] = "close_wait"
        model.fin_at[0] = model.sent[0]
        model.event(EventKind.PEER_FIN, 0)
        while model.state[0] == "close_wait":
            order.append(("echoed", model.echoed[0]))
            await ctx.tick()
        order.append(("closed", model.echoed[0]))
        while not model.finished():
            model.due(10**9)
            await ctx.tick()
        model.done = True

    async def slow_tx(ctx):
        port = dut.o_tx
        ctx.set(port.ready, 0)
        await ctx.tick().repeat(300)
        await model.tx_data_sink(ctx)

    processes = [p for p in model.processes() if p not in (model.peers, model.tx_data_sink)]
    run(dut, script, slow_tx, *processes)
    assert model.violations == [] and model.closes == 1
    assert order[-1] == ("closed", 200) and ("echoed", 0) in order
    assert model.tx_chunks == model.rx_chunks


def test_parameters():
    with pytest.raises(ValueError, match="data_bytes"):
        TcpEcho(3, 4, PORT)
    with pytest.raises(ValueError, match="port"):
        TcpEcho(8, 4, 0)
    with pytest.raises(ValueError, match="conns"):
        TcpEcho(8, 0, PORT)


# --- The whole server: EchoNode on GMII against a peer built with scapy ------------------------

OUR_MAC, OUR_IP = "02:00:00:00:00:05", "192.168.1.50"
PEER_MAC, PEER_IP = "02:00:00:00:00:02", "192.168.1.2"


def fcs(frame):
    return zlib.crc32(frame).to_bytes(4, "little")


def checksums_ok(packet):
    """The IPv4 header and ICMP or TCP checksums of a scapy packet are right (scapy recomputes
    them when they are deleted); true for a packet without IP."""
    if IP not in packet:
        return True
    layers = [packet[IP]] + [packet[k] for k in (ICMP, TCP) if k in packet]
    sent = [layer.chksum for layer in layers]
    for layer in layers:
        del layer.chksum
    rebuilt = Ether(bytes(packet))
    return sent == [rebuilt[IP].chksum] + [rebuilt[k].chksum for k in (ICMP, TCP) if k in rebuilt]


class GmiiPeer:
    """The far end of the node's GMII pins: frames in with preamble and FCS, frames out checked
    for both and stripped; ARP requests for the peer answered on the way."""

    def __init__(self, dut, domain="sync"):
        self.dut, self.to_node, self.from_node, self.done = dut, [], [], False
        self.domain = domain    # the MAC's clock domain: the pins change on its edges
        self.sent = self.received = 0       # whole frames each way, for the MAC's counters

    async def drive(self, ctx):
        dut = self.dut
        while not self.done:
            if self.to_node:
                frame = bytes(self.to_node[0])
                frame += bytes(max(0, 60 - len(frame)))
                for byte in PREAMBLE + frame + fcs(frame):
                    ctx.set(dut.gmii_rxd, byte)
                    ctx.set(dut.gmii_rx_dv, 1)
                    await ctx.tick(self.domain)
                ctx.set(dut.gmii_rx_dv, 0)
                await ctx.tick(self.domain).repeat(12)
                self.to_node.pop(0)
                self.sent += 1
            else:
                await ctx.tick(self.domain)

    async def watch(self, ctx):
        current = None
        while not self.done:
            *_, txd, en = await ctx.tick(self.domain).sample(self.dut.gmii_txd,
                                                              self.dut.gmii_tx_en)
            if en:
                current = (current or bytearray()) + bytes([txd])
            elif current is not None:
                assert current[:8] == PREAMBLE and current[-4:] == fcs(current[8:-4])
                self.received += 1
                packet = Ether(bytes(current[8:-4]))
                if ARP in packet and packet[ARP].op == 1 and packet[ARP].pdst == PEER_IP:
                    self.send(ARP(op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=packet[ARP].hwsrc,
                                  pdst=packet[ARP].psrc), dst=packet[ARP].hwsrc)
                else:
                    self.from_node.append(packet)
                current = None

    def send(self, payload, dst=OUR_MAC):
        self.to_node.append(bytes(Ether(src=PEER_MAC, dst=dst) / payload))

    async def expect(self, ctx, what, limit=30_000):
        for _ in range(limit):
            if self.from_node:
                packet = self.from_node.pop(0)
                assert what(packet), packet.show(dump=True)
                assert checksums_ok(packet)
                return packet
            await ctx.tick()
        raise AssertionError("no frame from the node")


@pytest.mark.parametrize("data_bytes,mac_bytes", [(1, None), (2, 1)])
def test_echo_node(data_bytes, mac_bytes):
    """ARP, ping and two echo sessions, one after the other, on a one-slot server: the data of
    three segments comes back in order, the server closes after the client's FIN, and its slot
    listens again for the second session; the MAC counted every frame each way. Also with the
    core at two bytes and half the clock (62.5 MHz) behind a one-byte GMII MAC at 125 MHz in a
    domain of its own (the ECPIX-5's arrangement), its counters read in the core's domain."""
    rng = random.Random("node")
    dut = EchoNode(data_bytes, PORT, mac_bytes=mac_bytes,
                   engine=dict(conns=1, ring_bytes=2048, rx_buffer_bytes=4096))
    peer = GmiiPeer(dut, "sync" if mac_bytes is None else "mac")
    log = {}

    def tcp(sport, seq, ack, flags, data=b"", **options):
        return IP(src=PEER_IP, dst=OUR_IP) / TCP(sport=sport, dport=PORT, seq=seq, ack=ack,
                                                  flags=flags, window=65535, **options) / data

    def from_us(packet):
        return IP in packet and packet[IP].src == OUR_IP and packet[IP].dst == PEER_IP

    async def session(ctx, sport, chunks):
        seq = rng.randrange(1 << 32)
        peer.send(tcp(sport, seq, 0, "S", options=[("MSS", 1460)]))
        synack = await peer.expect(ctx, lambda p: from_us(p) and p[TCP].flags == "SA"
                                   and p[TCP].ack == (seq + 1) % (1 << 32))
        seq, theirs = (seq + 1) % (1 << 32), (synack[TCP].seq + 1) % (1 << 32)
        peer.send(tcp(sport, seq, theirs, "A"))
        for chunk in chunks:
            peer.send(tcp(sport, seq, theirs, "PA", chunk))
            seq = (seq + len(chunk)) % (1 << 32)
        peer.send(tcp(sport, seq, theirs, "FA"))
        seq = (seq + 1) % (1 << 32)
        echoed = bytearray()
        while True:
            packet = await peer.expect(ctx, lambda p: from_us(p) and p[TCP].dport == sport)
            segment = packet[TCP]
            data = segment[Raw].load if Raw in segment else b""  # not the frame's padding
            if data:
                assert segment.seq == theirs, "segments in order, none lost"
                echoed += data
                theirs = (theirs + len(data)) % (1 << 32)
            if "F" in segment.flags:  # its sequence number follows the segment's data, if any
                assert (segment.seq + len(data)) % (1 << 32) == theirs
                theirs = (theirs + 1) % (1 << 32)
                peer.send(tcp(sport, seq, theirs, "A"))
                return bytes(echoed)
            if data:
                peer.send(tcp(sport, seq, theirs, "A"))

    async def script(ctx):
        ctx.set(dut.mac, int(OUR_MAC.replace(":", ""), 16))
        ctx.set(dut.ip, int(ipaddress.IPv4Address(OUR_IP)))
        ctx.set(dut.isn_key, rng.getrandbits(128))
        peer.send(ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP), dst="ff:ff:ff:ff:ff:ff")
        reply = await peer.expect(ctx, lambda p: ARP in p)
        assert (reply[ARP].op, reply[ARP].hwsrc, reply[ARP].psrc) == (2, OUR_MAC, OUR_IP)
        payload = rng.randbytes(56)
        peer.send(IP(src=PEER_IP, dst=OUR_IP) / ICMP(type=8, id=7, seq=1) / payload)
        pong = await peer.expect(ctx, lambda p: ICMP in p)
        assert (pong[ICMP].type, pong[ICMP].id, pong[ICMP].seq) == (0, 7, 1)
        assert pong[Raw].load == payload
        for sport in (40000, 40001):
            chunks = [rng.randbytes(k) for k in (100, 300, 37)]
            log[sport] = (b"".join(chunks), await session(ctx, sport, chunks))
        while peer.to_node:
            await ctx.tick()
        await ctx.tick().repeat(50)
        log["accepted"] = ctx.get(dut.accepted)
        log["echoed_bytes"] = ctx.get(dut.echoed_bytes)
        # The MAC's counters, read in the core's domain (through CountCrossing with a MAC of
        # its own): every frame each way, each good.
        log["frames"] = {name: ctx.get(getattr(dut.node, name))
                         for name in ("rx_frames_ok", "rx_bad_fcs", "tx_frames")}
        log["peer"] = {"rx_frames_ok": peer.sent, "rx_bad_fcs": 0, "tx_frames": peer.received}
        peer.done = True

    if mac_bytes is None:
        run(dut, script, peer.drive, peer.watch, name="echo_node")
    else:
        run(dut, script, peer.drive, peer.watch, name="echo_node_crossing", clock_period=16e-9,
            clocks={"mac": 8e-9})
    for sport in (40000, 40001):
        sent, echoed = log[sport]
        assert echoed == sent
    assert log["accepted"] == 2 and log["echoed_bytes"] == 2 * 437
    assert log["frames"] == log["peer"] and log["peer"]["rx_frames_ok"] > 10

"""``make bench``: cycle-exact benchmarks from simulation and ECP5 fits, as records with goals.

Every benchmark yields records ``{"name", "config", "value", "unit", "goal", "meets"}``;
``goal`` is a number the value must reach (``meets`` says whether it did) or ``None`` for a figure
reported for information. All records go to ``build/bench/results.json`` and are printed as a
table. Exit status 0 whatever the figures: a benchmark measures, the regression judges.

Benchmarks so far:

* CRC engines (CRC32c for MPA, CRC32 for the Ethernet FCS) at 1, 8 and 64 bytes per beat: a
  train of 2000 back-to-back packets of 64..9000 bytes through the generated Verilog, output
  always ready. Throughput is payload bytes per cycle of the input; its goal is one beat per
  cycle (the train's bytes divided by its beats). Latency is cycles from the last beat of the
  final packet to its result.
* The CRC32c engine at 8 and 64 bytes per beat fitted alone on an ECP5 LFE5UM5G-85F, speed 8
  (:func:`boards.fit.fit`: yosys ``synth_ecp5``, nextpnr out of context, seed 1, the clock
  constrained to 156.25 MHz): LUT4 and FF used, for information, and Fmax against 156.25 MHz,
  the ECP5 boards' core clock. That goal is the same at 64 bytes: the nominal clock the
  simulation records use for that width (``iwarp_tb.sim.CLOCK_MHZ``) is beyond an ECP5. Build
  folders are ``build/fit/iwarp_crc32c_w<N>/``; the two fits take about 40 s.
* TCP goodput at 1 and 8 bytes (GMII, XGMII): two :class:`~iwarp_nic.node.TcpNode` back to back
  in one Verilated top (:class:`~iwarp_tb.tcppair.TcpPair`), one connection, 2 MiB (width 1)
  or 8 MiB (width 8) of random bytes each way at once, the hosts keeping 32 chunks of 8 KiB
  queued, every byte checked. Per direction: bytes over the cycles from the first byte taken
  by the sending engine to the last one out of the receiving engine, in B/cycle, Gb/s, and as
  a fraction of the TCP payload ceiling (1460 payload bytes in every 1538 wire bytes at MTU
  1500: ``width * 1460 / 1538`` B/cycle), whose goal is 0.99.
* TCP latency at 1 and 8 bytes, 64 and 1460-byte payloads, one
  :class:`~iwarp_tb.tcprig.NicRig` connected to the model's TCP, one segment at a time on an
  idle line (for information, cycles and ns): wire->stream from the last FCS byte of the
  segment's frame on the RX pins to its last payload byte out of ``o_rx``; stream->wire from
  the chunk offered on ``s_axis_tx`` to the first preamble byte of its frame on the TX pins.
  The four Verilated tops take minutes to build the first time (cached in ``build/``); the
  runs take about a minute.
* The MPA deframer (:class:`~iwarp_nic.mpa.FpduDeframer`, CRC and markers on) at 8 and 64
  bytes, the first stage of the RX chain: a train of 200 FPDUs of 4 KiB ULPDUs from the model's
  ``Framer``, fed as one packet, the output always ready, every ULPDU checked against the
  model. The fraction of cycles that take an input beat (stream bytes over ``width`` times the
  cycles from the first input beat to the last), goal 0.99, and the same for ULPDU bytes, for
  information; latency in cycles from the last input beat of one FPDU on an idle line to its
  last output beat.
* The RX chain of one stream (:class:`~iwarp_nic.ddp.StreamReceiver`: deframer, DDP segment
  parser, Write placer and STag table, CRC and markers on) at 8 and 64 bytes: a train of 200
  RDMA Writes of 4 KiB payloads into one registered region (written into the table at reset),
  framed by the model and fed as one packet, every output always ready, the placed octets
  checked against the payloads. The fraction of cycles that take an input beat (goal 0.99), and
  placed payload bytes per cycle for information next to their ceiling, the payload's share of
  the FPDU octets; the latency in cycles from the last input beat of one FPDU on an idle line
  to its placement request (which the placer offers in the cycle of the payload's first beat).
* The TX chain of one stream (:class:`~iwarp_nic.ddp.StreamSender`: DDP segment emitter and
  MPA framer with the stream position, CRC and markers on) at 8 and 64 bytes: 200 RDMA Writes
  of 4 KiB made inside the wrapper, their payloads played in as the answers to its fetches, the
  FPDUs checked against the model's framing of the model's segments. The fraction of cycles
  that give an output beat (goal 0.99) and payload bytes per cycle next to their ceiling.
* The iWARP blocks at 8 bytes fitted alone like the CRC engine: the MPA framer and deframer,
  the DDP segment parser, Write placer, STag table (4096 entries), segment emitter, the whole
  RX and TX chains, and the RDMAP Terminate emitter and parser and Read responder (LUT4, FF;
  Fmax against 156.25 MHz). The MPA + DDP + RDMAP core will be fitted as one once it is
  assembled.
* RDMA goodput between two NICs (:class:`~iwarp_tb.nicpair.NicPairRig`: two
  :class:`~iwarp_nic.core.NicCore` back to back, each driven by the verbs driver, host memory
  answering after 100 ns) at 1 and 8 bytes, one queue pair: batches of Writes, Reads and
  Sends of 64 octets to 1 MiB in both directions at once (:class:`~iwarp_tb.rdma_run.RdmaRun`,
  every octet and completion checked). The steady rate (``Batch.steady``): each
  direction's messages after the first, from the first message's completion
  where its data lands to the direction's end (the rate a long stream of such messages
  keeps; the batch's fill is a latency, measured below); and the whole batch, from the first
  doorbell to the last completion. Per direction in Gb/s (steady), and as a fraction of the
  wire's ceiling for that message size (:func:`iwarp_tb.sim.ceiling`: what Ethernet, IPv4,
  TCP, MPA, DDP and RDMAP leave of the line, each message in frames of its own); P1, the
  goal 0.99 of the steady rate, applies from 64 KiB. Small messages can pass that ceiling:
  the NIC puts several FPDUs in one TCP segment. A batch not done within three times its
  wire time (lost segments waiting on a retransmission timeout) is recorded as 0 and ends
  that width's runs.
* RDMA latency: one 8-octet Write, Send and Read on an idle line, from the doorbell write to
  the last octet in the target's host memory, the best of three, in cycles and ns; P2, the
  goal 600 ns, is the Write's at 8 bytes.

Records carry the benchmark that made them (``bench``); ``make bench BENCH="rdma_goodput
rdma_latency"`` runs those alone and keeps the other records of the results file. The RDMA
records are also drawn (:mod:`iwarp_tb.bench_plots`): ``build/bench/rdma_goodput.png`` and
``build/bench/rdma_latency.png``.
"""

import json
import random
import sys
import time

from . import bench_plots, toolchain
from .beats import to_columns
from .harness import MIN_FRAME
from .runner import BeatPlayer
from .sim import CLOCK_MHZ

RESULTS = toolchain.BUILD / "bench" / "results.json"


def record(name, config, value, unit, goal=None, higher_is_better=True, point=None):
    """One record; ``point`` (optional) gives the parameters of a plotted point as numbers and
    names (``{"width": 8, "op": "write", "size": 65536}``), which :mod:`.bench_plots` reads."""
    meets = None if goal is None else (value >= goal if higher_is_better else value <= goal)
    rec = {"name": name, "config": config, "value": value, "unit": unit, "goal": goal,
           "meets": meets}
    if point is not None:
        rec["point"] = point
    return rec


def crc_engines():
    from iwarp_nic.crc import CRC32CEngine, CRC32Engine

    rng = random.Random(2026)
    packets = [rng.randbytes(rng.randint(64, 9000)) for _ in range(2000)]
    total = sum(map(len, packets))
    for label, engine in (("crc32c", CRC32CEngine), ("crc32", CRC32Engine)):
        for width in (1, 8, 64):
            out = BeatPlayer(f"iwarp_{label}_w{width}", engine(width)).play(packets)
            stats = out.stats
            cycles = stats["last_in_cycle"] - stats["first_in_cycle"] + 1
            beats = to_columns(packets, width).count
            config = f"{width} B/beat, {CLOCK_MHZ[width]} MHz"
            bpc = total / cycles
            yield record(f"{label} engine throughput", config, round(bpc, 4), "B/cycle",
                         round(total / beats, 4))
            yield record(f"{label} engine throughput", config,
                         round(bpc * 8 * CLOCK_MHZ[width] / 1000, 3), "Gb/s")
            yield record(f"{label} engine latency", config,
                         stats["last_out_cycle"] - stats["last_in_cycle"], "cycles")


#: The ECP5 the fits target, and the core clock the Fmax records must reach.
FIT_PART = {"device": "LFE5UM5G-85F", "package": "CABGA554", "speed": 8}
FIT_TARGET_MHZ = 156.25
FIT_SEED = 1


def _fit(component, name, label, config):
    """LUT4, FF and Fmax records of ``component`` fitted alone on :data:`FIT_PART`;
    :class:`boards.build.BuildError` if yosys or nextpnr fails."""
    from boards.fit import fit

    report = fit(component, name, target_mhz=FIT_TARGET_MHZ, seed=FIT_SEED, **FIT_PART)
    config = f"{config}, nextpnr seed {report['seed']}"
    used = {kind: counts["used"] for kind, counts in report["utilisation"].items()}
    yield record(f"{label} LUT4 (ECP5 85F)", config, used["LUT4"], "LUT4")
    yield record(f"{label} FF (ECP5 85F)", config, used["FF"], "FF")
    yield record(f"{label} Fmax (ECP5 85F, speed {FIT_PART['speed']})", config,
                 report["clocks"]["clk"]["fmax_mhz"], "MHz", FIT_TARGET_MHZ)


def crc_fits():
    """The CRC32c engine at 8 and 64 bytes."""
    from iwarp_nic.crc import CRC32CEngine

    for width in (8, 64):
        yield from _fit(CRC32CEngine(width), f"iwarp_crc32c_w{width}", "crc32c engine",
                        f"{width} B/beat")


def iwarp_fits():
    """The iWARP blocks at 8 bytes, each alone: the MPA framer, deframer, startup frames,
    negotiator, frame gather and receiver (16 connections, 4 KiB rings), the DDP stages, the
    RX chain,
    the Terminate emitter and parser, the send scheduler, the request responder, the atomic
    executor and the request issuer; and the whole engine of one connection (the MPA + DDP +
    RDMAP core)."""
    from iwarp_nic.ddp import (
        SegmentEmitter,
        SegmentParser,
        SegmentPlacer,
        StagTable,
        StreamReceiver,
        StreamSender,
    )
    from iwarp_nic.engine import ConnectionsEngine, IwarpEngine
    from iwarp_nic.mpa import (
        FpduDeframer,
        FpduFramer,
        FrameGather,
        MpaNegotiator,
        MpaReceiver,
        StartupReader,
        StartupWriter,
    )
    from iwarp_nic.rdmap import (
        AtomicExecutor,
        RequestIssuer,
        RequestResponder,
        SendScheduler,
        TerminateEmitter,
        TerminateParser,
    )

    for label, block in (("MPA framer", FpduFramer), ("MPA deframer", FpduDeframer),
                         ("MPA startup reader", StartupReader),
                         ("MPA startup writer", StartupWriter),
                         ("MPA negotiator", MpaNegotiator),
                         ("MPA frame gather", FrameGather), ("MPA receiver", MpaReceiver),
                         ("DDP segment parser", SegmentParser),
                         ("DDP segment placer", SegmentPlacer),
                         ("DDP receive", StreamReceiver),
                         ("DDP segment emitter", SegmentEmitter), ("DDP send", StreamSender),
                         ("RDMAP Terminate emitter", TerminateEmitter),
                         ("RDMAP send scheduler", SendScheduler),
                         ("RDMAP Terminate parser", TerminateParser)):
        name = "iwarp_" + label.lower().replace(" ", "_") + "_w8"
        yield from _fit(block(8), name, label, "8 B/beat")
    yield from _fit(StagTable(4096), "iwarp_ddp_stag_e4096", "DDP STag table",
                    "4096 entries")
    yield from _fit(RequestResponder(), "iwarp_rdmap_request_responder",
                    "RDMAP request responder", "headers")
    yield from _fit(AtomicExecutor(), "iwarp_rdmap_atomic_executor", "RDMAP atomic executor",
                    "8 octets")
    yield from _fit(RequestIssuer(), "iwarp_rdmap_request_issuer", "RDMAP request issuer",
                    "ORD up to 32")
    yield from _fit(IwarpEngine(8), "iwarp_engine_w8", "MPA + DDP + RDMAP engine",
                    "one connection, 8 B/beat, 4096 STags")
    yield from _fit(ConnectionsEngine(8), "iwarp_engine_c16_w8",
                    "MPA + DDP + RDMAP engine (16 connections)",
                    "8 B/beat, 4096 STags, 4 KiB receive rings")


#: TCP bytes per full-size frame at MTU 1500 (RFC 9293 header, no options) and that frame's
#: bytes on the wire: preamble and SFD 8, Ethernet header 14, IP + TCP 40, FCS 4, gap 12.
TCP_PAYLOAD, TCP_WIRE = 1460, 1538
#: Bytes each way in the goodput transfers, by width.
GOODPUT_BYTES = {1: 2 << 20, 8: 8 << 20}


def tcp_goodput():
    from .tcppair import NODES, PairRig

    for width, size in GOODPUT_BYTES.items():
        rng = random.Random(width)
        data = {node: rng.randbytes(size) for node in NODES}
        rig = PairRig(width, chunk=8192, in_flight=32)
        try:
            rig.open()
            cycles = rig.transfer(data)
        finally:
            rig.close()
        ceiling = width * TCP_PAYLOAD / TCP_WIRE
        for sender, receiver in zip(NODES, reversed(NODES)):
            config = (f"{width} B/beat, {CLOCK_MHZ[width]} MHz, {sender}->{receiver} with "
                      f"{receiver}->{sender} at once, {size >> 20} MiB each way, two TcpNodes "
                      f"back to back, 64 KiB send ring and receive buffer, 8 KiB chunks")
            bpc = size / cycles[sender]
            yield record("TCP goodput", config, round(bpc, 4), "B/cycle")
            yield record("TCP goodput", config, round(bpc * 8 * CLOCK_MHZ[width] / 1000, 3),
                         "Gb/s")
            yield record("TCP goodput / payload ceiling", f"{config}, ceiling {width} x "
                         f"{TCP_PAYLOAD}/{TCP_WIRE} B/cycle", round(bpc / ceiling, 4),
                         "fraction", 0.99)


#: Payload sizes of the latency records: a small segment and a full one.
LATENCY_PAYLOADS = (64, 1460)
PREAMBLE, FCS = 8, 4


def tcp_latency():
    for width in (1, 8):
        link = _ModelLink(width)
        try:
            rng = random.Random(width)
            for size in LATENCY_PAYLOADS:
                to_stream = link.wire_to_stream(rng.randbytes(size))
                to_wire = link.stream_to_wire(rng.randbytes(size))
                common = f"{width} B/beat, {CLOCK_MHZ[width]} MHz, {size} B payload"
                for name, config, cycles in (
                        ("TCP latency wire->stream", f"{common}, from the last FCS byte of "
                         "its frame on the RX pins to the last payload byte out of o_rx",
                         to_stream),
                        ("TCP latency stream->wire", f"{common}, from the chunk offered on "
                         "s_axis_tx (idle connection, window open) to the first preamble byte "
                         "of its frame on the TX pins", to_wire)):
                    yield record(name, config, cycles, "cycles")
                    yield record(name, config, round(cycles * 1000 / CLOCK_MHZ[width], 1), "ns")
        finally:
            link.close()


class _ModelLink:
    """A :class:`~iwarp_tb.tcprig.NicRig` of ``width`` bytes with one connection (slot 0) to
    the model, for one segment at a time on an idle line."""

    HEADERS = 14 + 20 + 20   # Ethernet, IPv4 and TCP headers of a data segment, no options

    def __init__(self, width):
        from .tcprig import ModelWire, NicRig

        self.width = width
        self.rig = rig = NicRig(width)
        self.h, self.host = rig.h, rig.host
        self.wire = ModelWire(rig)
        self.host.listen(0, 5000)
        self.h.run(200)
        self.peer = self.wire.model.connect(rig.ip, 5000)
        self.wire.run(lambda: self.host.slots[0].peer is not None, timeout=0.05)
        self.into_nic = []   # (cycle, length) of each frame put on the RX pins
        self._deliver = self.wire.to_nic.deliver
        self.wire.to_nic.deliver = self._recorded

    def _recorded(self, frame):
        self.into_nic.append((self.h.cycle, max(len(frame), MIN_FRAME)))
        self._deliver(frame)

    def quiet(self):
        """Run long enough for every delayed ACK and queued frame to be gone."""
        for _ in range(50):
            self.wire.step(2000)
        self.into_nic.clear()

    def run_until(self, done):
        """Run output by output until ``done()``; the cycle of that output."""
        for _ in range(100):
            self.h.run(100_000, until_output=True)
            self.host.service()
            if done():
                return self.h.cycle - 1
        raise AssertionError("not done after 10^7 cycles")

    def wire_to_stream(self, data):
        """The model sends ``data`` as one segment. A frame handed to the idle RX pins starts
        there in the next cycle; its last FCS byte is ceil((8 + length + 4) / width) - 1
        cycles later."""
        self.quiet()
        received = self.host.slots[0].received
        received.clear()
        self.peer.send(data)
        while not self.into_nic:
            self.wire.step(50)
        (start, length), = self.into_nic
        fcs_end = start + -(-(PREAMBLE + length + FCS) // self.width) - 1
        end = self.run_until(lambda: len(received) >= len(data))
        if bytes(received) != data:
            raise AssertionError("the NIC received other bytes than the model sent")
        return end - fcs_end

    def stream_to_wire(self, data):
        """The host hands ``data`` over as one chunk. :meth:`~iwarp_tb.harness.Harness.frames`
        gives the cycle a frame ended, (8 + length + 4) // width cycles after its first
        preamble byte (the end is seen after the FCS, GMII's on the next cycle, XGMII's at
        /T/)."""
        self.quiet()
        self.host.send(0, data)
        offered = self.h.cycle
        self.host.service()
        frames = []

        def sent():
            frames.extend(self.h.frames())
            return any(frame[self.HEADERS:] == data for frame in frames)

        self.run_until(sent)
        segment, = (frame for frame in frames if frame[self.HEADERS:] == data)
        first = segment.cycle - (PREAMBLE + len(segment) + FCS) // self.width
        for frame in frames:
            self.wire.to_model.send(bytes(frame))
        self.wire.run(lambda: self.peer.available >= len(data), timeout=0.05)
        if self.peer.recv() != data:
            raise AssertionError("the model received other bytes than the NIC sent")
        return first - offered

    def close(self):
        self.rig.close()


def _configured_deframer(width):
    """:class:`~iwarp_nic.mpa.FpduDeframer` with CRC and markers on, as a one-in one-out block
    for :class:`~iwarp_tb.runner.BeatPlayer` (the error output is always ready)."""
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from iwarp_nic.mpa import FpduDeframer
    from iwarp_nic.stream import BeatStream

    class ConfiguredDeframer(wiring.Component):
        i: In(BeatStream(width))
        o: Out(BeatStream(width, err=True))

        def elaborate(self, platform):
            m = Module()
            m.submodules.deframer = deframer = FpduDeframer(width)
            m.d.comb += [deframer.crc.eq(1), deframer.markers.eq(1),
                         deframer.max_ulpdu.eq(0xFFFF), deframer.o_error.ready.eq(1)]
            wiring.connect(m, wiring.flipped(self.i), deframer.i)
            wiring.connect(m, deframer.o, wiring.flipped(self.o))
            return m

    return ConfiguredDeframer()


def _train(ulpdus):
    """The FPDUs of ``ulpdus``, CRC and markers on, as one stream."""
    from iwarp_model.wire.fpdu import Framer

    framer = Framer(crc=True, markers=True)
    return b"".join(framer.frame(u) for u in ulpdus)


def _chunks(train, size=1460):
    """``train`` cut into chunks of ``size`` octets (an MSS), the last one shorter."""
    return [train[k:k + size] for k in range(0, len(train), size)]


def mpa_deframer():
    from .beats import from_beats

    rng = random.Random(5044)
    ulpdus = [rng.randbytes(4096) for _ in range(200)]
    stream = _train(ulpdus)
    expected = [len(u).to_bytes(2, "big") + u for u in ulpdus]
    for width in (8, 64):
        player = BeatPlayer(f"iwarp_mpa_deframer_bench_w{width}", _configured_deframer(width))
        out = player.play([stream], tag="train")
        if [bytes(p) for p in from_beats(out, width)] != expected:
            raise AssertionError(f"deframer w{width}: the ULPDUs differ from the model's")
        stats = out.stats
        cycles = stats["last_out_cycle"] - stats["first_in_cycle"] + 1
        config = f"{width} B/beat, 200 FPDUs of 4096-byte ULPDUs, CRC and markers"
        yield record("MPA deframer input beats per cycle", config,
                     round(len(stream) / (width * cycles), 4), "fraction", 0.99)
        yield record("MPA deframer ULPDU bytes per cycle", config,
                     round(sum(map(len, ulpdus)) / (width * cycles), 4), "fraction")
        one = player.play([_train(ulpdus[:1])], tag="one")
        yield record("MPA deframer latency", f"{width} B/beat, one 4096-byte ULPDU, idle",
                     one.stats["last_out_cycle"] - one.stats["last_in_cycle"], "cycles")


def _gather_train(width, startup, chunks):
    """Run :func:`frame_gather`'s stimulus through a gather of ``width`` bytes; return the
    cycles of the input beats taken (with ``last``), of the output beats and piece headers, and
    the octets released."""
    from iwarp_nic.mpa import FrameGather, GatherOp

    from .amsim import run
    from .streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

    dut = FrameGather(width, conns=4, ring_bytes=16384)
    total = sum(map(len, chunks))
    seen = {"in": [], "out": [], "header": [], "octets": bytearray()}

    async def host(ctx):
        bus = AmaranthBus(ctx)
        cmd, header = StreamPort.amaranth(dut.i_cmd), StreamPort.amaranth(dut.i_header)
        await send(bus, cmd, [{"op": GatherOp.START.value, "conn": 0, "markers": 0}])
        await send(bus, header, [{"conn": 0, "length": len(startup)}])
        await send_packets(bus, StreamPort.amaranth(dut.i), [startup], width)
        while not seen["header"]:
            await ctx.tick()
        await send(bus, cmd, [{"op": GatherOp.FPDUS.value, "conn": 0, "markers": 1}])
        for chunk in chunks:
            await send(bus, header, [{"conn": 0, "length": len(chunk)}])
            await send_packets(bus, StreamPort.amaranth(dut.i), [chunk], width)

    async def drain(ctx):
        bus = AmaranthBus(ctx)
        while len(seen["octets"]) < len(startup) + total:
            await recv(bus, StreamPort.amaranth(dut.o_header), 1)
            [piece] = await recv_packets(bus, StreamPort.amaranth(dut.o), 1, width)
            seen["octets"].extend(piece)

    async def watch(ctx):
        cycle = 0
        async for _, _, *flags in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.payload.last, dut.o.valid, dut.o.ready,
                dut.o_header.valid, dut.o_header.ready):
            i_valid, i_ready, last, o_valid, o_ready, h_valid, h_ready = flags
            if i_valid and i_ready:
                seen["in"].append((cycle, last))
            if o_valid and o_ready:
                seen["out"].append(cycle)
            if h_valid and h_ready:
                seen["header"].append(cycle)
            cycle += 1

    run(dut, host, drain, monitors=[watch], name=f"bench_gather_w{width}")
    return seen


def frame_gather():
    """:class:`~iwarp_nic.mpa.FrameGather` (Amaranth simulation): one connection's train of
    4 KiB FPDUs with CRC and markers, in chunks of an MSS (1460), offered back to back with the
    output always ready; and the cycles from a chunk's last beat to the header of the piece it
    completes (the startup frame's, alone on an idle gather)."""
    from iwarp_model.wire.mpa import MpaFrame

    rng = random.Random(5044)
    count = 200
    train = _train([rng.randbytes(4096) for _ in range(count)])
    chunks = _chunks(train)
    startup = MpaFrame(reply=True, markers=True).encode()
    for width in (8, 64):
        seen = _gather_train(width, startup, chunks)
        if bytes(seen["octets"]) != startup + train:
            raise AssertionError(f"gather w{width}: the octets released differ from the train")
        first = seen["in"][-(-len(startup) // width)][0]   # the train's first beat
        cycles = seen["out"][-1] - first + 1
        config = f"{width} B/beat, {count} FPDUs of 4096-byte ULPDUs in 1460-octet chunks"
        yield record("MPA frame gather input beats per cycle", config,
                     round(len(train) / (width * cycles), 4), "fraction", 0.99)
        startup_end = next(c for c, last in seen["in"] if last)
        yield record("MPA frame gather latency", f"{width} B/beat, the startup frame's chunk "
                     "end to its piece's header, idle", seen["header"][0] - startup_end, "cycles")


def _receiver_train(width, conns, count, chunks, *, placed=False):
    """Run a train through an MpaReceiver of ``width`` bytes, or with ``placed`` a
    ConnectionsReceiver (one region in its table, every connection opened on its PD): every
    connection started and its startup frame released, then ``chunks`` (conn -> its train's
    chunks, ``count`` FPDUs) sent for each connection in turn. Returns the cycles of the FPDU
    chunks' first beat and of the last output beat (ULPDUs, or placed payloads), and the
    output: each connection's ULPDU packets, or the (host address, octets) of each
    placement."""
    from iwarp_model.wire.mpa import MpaFrame
    from iwarp_nic.ddp import ConnectionsReceiver
    from iwarp_nic.mpa import GatherOp, MpaReceiver

    from .amsim import run
    from .beats import Beat, from_beats, from_tagged_beats
    from .stags import load_table
    from .streams import AmaranthBus, StreamPort, recv, send, send_packets

    startup = MpaFrame(reply=True, markers=True, crc=True).encode()
    if placed:
        dut = ConnectionsReceiver(width, conns=conns, ring_bytes=16384, stag_entries=256)
        out = dut.o_data
    else:
        dut = MpaReceiver(width, conns=conns, ring_bytes=16384)
        out = dut.o
    seen = {"startups": 0, "beats": [], "places": [], "first": None, "last": 0}

    async def host(ctx):
        bus = AmaranthBus(ctx)
        cmd, header = StreamPort.amaranth(dut.i_cmd), StreamPort.amaranth(dut.i_header)
        if placed:
            await load_table(ctx, dut.i_write, [_bench_entry()])
            await send(bus, StreamPort.amaranth(dut.i_open),
                       [{"conn": c, "pd": _BENCH_PD, "rtr": 0} for c in range(conns)])
            ctx.set(dut.o_started.ready, 1)
        for c in range(conns):
            await send(bus, cmd, [{"op": GatherOp.START.value, "conn": c, "markers": 0,
                                   "crc": 0}])
            await send(bus, header, [{"conn": c, "length": len(startup)}])
            await send_packets(bus, StreamPort.amaranth(dut.i), [startup], width)
        while seen["startups"] < conns:
            await ctx.tick()
        await send(bus, cmd, [{"op": GatherOp.FPDUS.value, "conn": c, "markers": 1, "crc": 1}
                              for c in range(conns)])
        for k in range(max(map(len, chunks.values()))):
            for c in range(conns):
                await send(bus, header, [{"conn": c, "length": len(chunks[c][k])}])
                await send_packets(bus, StreamPort.amaranth(dut.i), [chunks[c][k]], width)

    async def startups(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.o_startup.ready, 1)
        while True:
            await recv(bus, StreamPort.amaranth(dut.o_startup_header), 1, timeout=1 << 30)
            seen["startups"] += 1

    async def drain(ctx):
        bus = AmaranthBus(ctx)
        ends = 0
        while ends < conns * count:
            [beat] = await recv(bus, StreamPort.amaranth(out), 1, timeout=10_000)
            seen["beats"].append(beat)
            ends += beat["last"]

    async def places(ctx):
        seen["places"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_place),
                                    conns * count, timeout=1 << 30)

    async def watch(ctx):
        cycle = 0
        async for _, _, i_valid, i_ready, o_valid, o_ready in ctx.tick().sample(
                dut.i.valid, dut.i.ready, out.valid, out.ready):
            if i_valid and i_ready and seen["first"] is None and seen["startups"] == conns:
                seen["first"] = cycle
            if o_valid and o_ready:
                seen["last"] = cycle
            cycle += 1

    run(dut, host, drain, *([places] if placed else []), monitors=[startups, watch],
        name=f"bench_receiver_w{width}")
    if placed:
        beats = [Beat(b["data"], b["keep"], b["last"], 0) for b in seen["beats"]]
        return seen["first"], seen["last"], [
            (p["addr"], bytes(d)) for p, d in zip(seen["places"], from_beats(beats, width))]
    packets = {c: [] for c in range(conns)}
    for conn, packet in from_tagged_beats(seen["beats"], width):
        packets[conn].append(bytes(packet))
    return seen["first"], seen["last"], packets


def mpa_receiver():
    """:class:`~iwarp_nic.mpa.MpaReceiver` (Amaranth simulation): four connections, each a
    train of 50 FPDUs of 4 KiB ULPDUs with CRC and markers in 1460-octet chunks, the
    connections' chunks in turn, every output always ready; each connection's ULPDUs checked
    against the model's. Input beats per cycle from the first FPDU chunk's first beat to the
    last ULPDU beat."""
    rng = random.Random(5044)
    count, conns = 50, 4
    ulpdus = [rng.randbytes(4096) for _ in range(count)]
    train = _train(ulpdus)
    chunks = _chunks(train)
    expected = [len(u).to_bytes(2, "big") + u for u in ulpdus]
    for width in (8, 64):
        first, last, got = _receiver_train(width, conns, count,
                                           {c: chunks for c in range(conns)})
        if any(got[c] != expected for c in range(conns)):
            raise AssertionError(f"receiver w{width}: the ULPDUs differ from the model's")
        config = (f"{width} B/beat, {conns} connections x {count} FPDUs of 4096-byte ULPDUs "
                  "in 1460-octet chunks taken in turn")
        yield record("MPA receiver input beats per cycle", config,
                     round(conns * len(train) / (width * (last - first + 1)), 4), "fraction",
                     0.99)


def receive_path():
    """:class:`~iwarp_nic.ddp.ConnectionsReceiver` (Amaranth simulation): four connections,
    each a train of 25 RDMA Writes of 4 KiB with CRC and markers in 1460-octet chunks, the
    connections' chunks in turn, every output always ready; every placement checked (address
    and octets). Input beats per cycle from the first FPDU chunk's first beat to the last
    placed beat, and placed payload octets per cycle."""
    from iwarp_model.wire.rdmap import Opcode, Segment

    rng = random.Random(5040)
    count, conns = 25, 4
    payloads = {c: [rng.randbytes(4096) for _ in range(count)] for c in range(conns)}
    trains = {c: _train([Segment(Opcode.WRITE, p, stag=_BENCH_STAG,
                                 to=4096 * (count * c + k)).encode()
                         for k, p in enumerate(payloads[c])]) for c in range(conns)}
    expected = sorted((_BENCH_HOST + 4096 * (count * c + k), p)
                      for c in range(conns) for k, p in enumerate(payloads[c]))
    octets = sum(map(len, trains.values()))
    for width in (8, 64):
        first, last, placed = _receiver_train(
            width, conns, count, {c: _chunks(t) for c, t in trains.items()}, placed=True)
        if sorted(placed) != expected:
            raise AssertionError(f"receive path w{width}: the placements differ")
        cycles = last - first + 1
        config = (f"{width} B/beat, {conns} connections x {count} RDMA Writes of 4 KiB, CRC "
                  "and markers, in 1460-octet chunks taken in turn")
        yield record("Receive path (several connections) input beats per cycle", config,
                     round(octets / (width * cycles), 4), "fraction", 0.99)
        yield record("Receive path (several connections) placed payload bytes per cycle",
                     f"{config}, ceiling {round(4096 * count * conns / octets, 4)}",
                     round(4096 * count * conns / (width * cycles), 4), "fraction")


#: The region the RX chain benches write into: STag index 1, key 0x5A, PD 1.
_BENCH_STAG, _BENCH_PD, _BENCH_HOST = 1 << 8 | 0x5A, 1, 0x1000_0000


def _bench_entry():
    """The STag table write that stores the bench region (Remote Write)."""
    from iwarp_nic.ddp import Access

    return {"index": _BENCH_STAG >> 8, "entry": {
        "present": 1, "key": _BENCH_STAG & 0xFF, "valid": 1, "invalidatable": 0,
        "pd": _BENCH_PD, "access": Access.REMOTE_WRITE.value, "iova": 0, "length": 1 << 40,
        "host_addr": _BENCH_HOST}}


def _configured_receiver(width):
    """:class:`~iwarp_nic.ddp.StreamReceiver` with CRC and markers on and one region in its
    table (written in the first cycle), as a one-in one-out block for
    :class:`~iwarp_tb.runner.BeatPlayer`: the placed payloads out, every other output ready."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from iwarp_nic.ddp import StreamReceiver
    from iwarp_nic.stream import BeatStream

    class ConfiguredReceiver(wiring.Component):
        i: In(BeatStream(width))
        o: Out(BeatStream(width))

        def elaborate(self, platform):
            m = Module()
            m.submodules.rx = rx = StreamReceiver(width, stag_entries=256)
            loaded = Signal()
            write = _bench_entry()
            m.d.comb += [
                rx.crc.eq(1), rx.markers.eq(1), rx.max_ulpdu.eq(0xFFFF), rx.pd.eq(_BENCH_PD),
                rx.i_write.valid.eq(~loaded), rx.i_write.payload.index.eq(write["index"]),
                *(rx.i_write.payload.entry[name].eq(value)
                  for name, value in write["entry"].items()),
                rx.o_place.ready.eq(1), rx.o_fault.ready.eq(1), rx.o_error.ready.eq(1),
                rx.o_header.ready.eq(1), rx.o_payload.ready.eq(1), rx.o_complete.ready.eq(1),
                rx.o_read_done.ready.eq(1),
            ]
            with m.If(rx.i_write.ready):
                m.d.sync += loaded.eq(1)
            wiring.connect(m, wiring.flipped(self.i), rx.i)
            wiring.connect(m, rx.o_data, wiring.flipped(self.o))
            return m

    return ConfiguredReceiver()


def rx_chain():
    from iwarp_model.wire.rdmap import Opcode, Segment

    from .beats import from_beats

    rng = random.Random(5041)
    payloads = [rng.randbytes(4096) for _ in range(200)]
    ulpdus = [Segment(Opcode.WRITE, p, stag=_BENCH_STAG, to=4096 * k).encode()
              for k, p in enumerate(payloads)]
    stream = _train(ulpdus)
    ceiling = round(sum(map(len, payloads)) / len(stream), 4)
    for width in (8, 64):
        player = BeatPlayer(f"iwarp_ddp_receive_bench_w{width}", _configured_receiver(width))
        out = player.play([stream], tag="train")
        if [bytes(p) for p in from_beats(out, width)] != payloads:
            raise AssertionError(f"RX chain w{width}: the placed octets differ from the payloads")
        stats = out.stats
        cycles = stats["last_out_cycle"] - stats["first_in_cycle"] + 1
        config = f"{width} B/beat, 200 RDMA Writes of 4 KiB, CRC and markers"
        yield record("RX chain input beats per cycle", config,
                     round(len(stream) / (width * cycles), 4), "fraction", 0.99)
        yield record("RX chain placed payload bytes per cycle", f"{config}, ceiling {ceiling}",
                     round(sum(map(len, payloads)) / (width * cycles), 4), "fraction")
        one = player.play([_train(ulpdus[:1])], tag="one")
        yield record("RX chain latency to placement request",
                     f"{width} B/beat, one 4 KiB RDMA Write, idle",
                     one.cycles[0] - one.stats["last_in_cycle"], "cycles")


def _configured_sender(width, count, size, conns=None):
    """:class:`~iwarp_nic.ddp.StreamSender` with CRC and markers on, sending ``count`` RDMA
    Writes of ``size`` octets (STag :data:`_BENCH_STAG`, TO ``size * k``), each one segment,
    as a one-in one-out block for :class:`~iwarp_tb.runner.BeatPlayer`: the payloads in (the
    answers to its fetches, in order), the FPDUs out. With ``conns``, a sender of that many
    connections, each opened first, the Writes going to them in turn (the beats' ``conn`` is
    not passed out)."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from iwarp_nic.ddp import StreamSender
    from iwarp_nic.stream import BeatStream

    class ConfiguredSender(wiring.Component):
        i: In(BeatStream(width))
        o: Out(BeatStream(width, err=True))

        def elaborate(self, platform):
            m = Module()
            m.submodules.tx = tx = StreamSender(width, conns=conns)
            sent = Signal(range(count + 1))
            msg = tx.i_message.payload
            m.d.comb += [
                tx.i_message.valid.eq(sent != count), msg.opcode.eq(0),
                msg.stag.eq(_BENCH_STAG), msg.to.eq(sent * size), msg.length.eq(size),
                tx.o_fetch.ready.eq(1),
            ]
            if conns is None:
                m.d.comb += [tx.crc.eq(1), tx.markers.eq(1), tx.max_ulpdu.eq(size + 14)]
            else:
                opened = Signal(range(conns + 1))
                opening = tx.i_open
                m.d.comb += [opening.valid.eq(opened != conns), opening.payload.conn.eq(opened),
                             opening.payload.crc.eq(1), opening.payload.markers.eq(1),
                             opening.payload.max_ulpdu.eq(size + 14), msg.conn.eq(sent % conns)]
                with m.If(opening.valid):
                    m.d.sync += opened.eq(opened + 1)
                    m.d.comb += tx.i_message.valid.eq(0)
                m.d.comb += tx.o_header.ready.eq(1)     # the TCP engine's chunk headers
            with m.If(tx.i_message.valid & tx.i_message.ready):
                m.d.sync += sent.eq(sent + 1)
            wiring.connect(m, wiring.flipped(self.i), tx.i_payload)
            m.d.comb += [self.o.payload.eq(tx.o.payload), self.o.valid.eq(tx.o.valid),
                         tx.o.ready.eq(self.o.ready)]
            return m

    return ConfiguredSender()


def tx_chain():
    from iwarp_model.wire.fpdu import Framer

    from .beats import from_beats
    from .messages import segments_of

    rng = random.Random(5040)
    payloads = [rng.randbytes(4096) for _ in range(200)]
    for width, conns in ((8, None), (64, None), (8, 4), (64, 4)):
        framers = [Framer(crc=True, markers=True) for _ in range(conns or 1)]
        fpdus = [framers[k % len(framers)].frame(u) for k, p in enumerate(payloads)
                 for u in segments_of({"opcode": 0, "stag": _BENCH_STAG, "to": 4096 * k},
                                      p, 4096 + 14)]
        wire = sum(map(len, fpdus))
        name = f"iwarp_ddp_send_bench_w{width}" + (f"_c{conns}" if conns else "")
        player = BeatPlayer(name, _configured_sender(width, len(payloads), 4096, conns))
        out = player.play(payloads, tag="train")
        if [bytes(p) for p in from_beats(out, width)] != fpdus:
            raise AssertionError(f"{name}: the FPDUs differ from the model's")
        stats = out.stats
        cycles = stats["last_out_cycle"] - stats["first_in_cycle"] + 1
        config = f"{width} B/beat, 200 RDMA Writes of 4 KiB, CRC and markers" + (
            f", {conns} connections in turn" if conns else "")
        chain = "TX chain" + (" (several connections)" if conns else "")
        yield record(f"{chain} output beats per cycle", config,
                     round(wire / (width * cycles), 4), "fraction", 0.99)
        yield record(f"{chain} payload bytes per cycle",
                     f"{config}, ceiling {round(4096 * 200 / wire, 4)}",
                     round(4096 * 200 / (width * cycles), 4), "fraction")


#: Message sizes of the RDMA goodput records, and the octets each point moves at least (each
#: way): enough messages that the first one's latency is a small part of the batch.
RDMA_SIZES = (64, 512, 4096, 65536, 1 << 20)
RDMA_OCTETS = {1: 1 << 18, 8: 1 << 20}
#: Host memory latency of the RDMA records: 100 ns.
HOST_LATENCY_NS = 100
#: The datapath widths of the RDMA records (1 byte at 125 MHz, 8 at 156.25 MHz).
RDMA_WIDTHS = (1, 8)


def _rdma_rig(width, size):
    from .nicpair import NicPairRig
    from .rdma_run import RdmaRun

    rig = NicPairRig(width, seed=width, memory_bytes=max(1 << 24, 8 * size))
    rig.host_latency(HOST_LATENCY_NS)
    return rig, RdmaRun(rig, flows=1, size=size, seed=width, slice_cycles=64)


def rdma_goodput():
    """Goodput of Writes, Reads and Sends between two NICs, both directions at once, against
    the message size; P1 (goal 0.99 of the wire's ceiling) for 64 KiB and more."""
    from .sim import ceiling

    for width in RDMA_WIDTHS:
        rig, run = _rdma_rig(width, max(RDMA_SIZES))
        mhz = CLOCK_MHZ[width]
        try:
            started, cycles = time.monotonic(), rig.h.cycle
            for op, size in [(op, size) for op in ("write", "read", "send")
                             for size in RDMA_SIZES]:
                count = max(2, min(RDMA_OCTETS[width] // size, 128))
                config = (f"{width} B/beat, {mhz} MHz, {op} of {size} B, {count} each way "
                          f"at once, two NicCores back to back, host memory latency "
                          f"{HOST_LATENCY_NS} ns")
                point = {"width": width, "op": op, "size": size}
                p1 = " (P1)" if size >= 65536 else ""
                # Three times the wire's time: a batch that needs a retransmission timeout
                # (0.2 s at least) is reported as not done, and this width's runs end there.
                limit = 3 * count * (size + 64) // (width * ceiling(op, size)) + 200_000
                try:
                    batch = run.batch(op, count, length=size, directions=("a", "b"),
                                      timeout_cycles=int(limit))
                except TimeoutError:
                    yield record("RDMA goodput / wire ceiling" + p1,
                                 config + f": not done within {int(limit)} cycles", 0.0,
                                 "fraction", 0.99 if p1 else None, point=point)
                    break
                if run.errors:
                    raise AssertionError(run.errors)
                gbps = batch.steady * 8 * mhz / 1000 / 2
                yield record("RDMA goodput per direction", config, round(gbps, 3), "Gb/s",
                             point=point)
                wire = 2 * width * ceiling(op, size)
                yield record("RDMA goodput / wire ceiling" + p1, config,
                             round(batch.steady / wire, 4), "fraction", 0.99 if p1 else None,
                             point=point)
                yield record("RDMA goodput / wire ceiling, whole batch", config,
                             round(batch.bytes_per_cycle / wire, 4), "fraction", point=point)
            speed = (rig.h.cycle - cycles) / (time.monotonic() - started)
            yield record("simulator speed", f"{width} B/beat, two NicCores, native Verilator "
                         "harness, RDMA goodput runs", round(speed), "cycles/s")
        finally:
            rig.close()


def rdma_latency():
    """One 8-octet Write, Send and Read on an idle line, doorbell to the last octet in the
    target's host memory; P2 (600 ns) for the Write at 8 bytes."""
    for width in RDMA_WIDTHS:
        rig, run = _rdma_rig(width, 4096)
        mhz = CLOCK_MHZ[width]
        try:
            for op in ("write", "send", "read"):
                cycles = min(run.latency(op) for _ in range(3))
                if run.errors:
                    raise AssertionError(run.errors)
                point = {"width": width, "op": op}
                config = (f"{width} B/beat, {mhz} MHz, 8-octet {op}, from the doorbell write "
                          f"to the last octet in the {'local' if op == 'read' else 'remote'} "
                          f"host memory, host memory latency {HOST_LATENCY_NS} ns")
                yield record("RDMA latency", config, cycles, "cycles", point=point)
                p2 = width == 8 and op == "write"
                yield record("RDMA latency" + (" (P2)" if p2 else ""), config,
                             round(cycles * 1000 / mhz, 1), "ns", 600 if p2 else None,
                             higher_is_better=False, point=point)
        finally:
            rig.close()


BENCHMARKS = [crc_engines, crc_fits, tcp_goodput, tcp_latency, mpa_deframer, frame_gather,
              mpa_receiver, receive_path, rx_chain,
              tx_chain, iwarp_fits, rdma_goodput, rdma_latency]


def table(records):
    head = ("name", "config", "value", "unit", "goal", "meets")
    rows = [[str(r[h]) if r[h] is not None else "-" for h in head] for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def main(argv=None):
    """Run the benchmarks named in ``argv`` (all by default). Each record names its
    benchmark (``bench``); the records of the others already in the results file are kept.
    The file is written again as each benchmark ends (an interrupted run keeps what it
    measured), each benchmark's records printed as they come."""
    names = {bench.__name__: bench for bench in BENCHMARKS}
    chosen = list(argv if argv is not None else sys.argv[1:]) or list(names)
    unknown = [name for name in chosen if name not in names]
    if unknown:
        print(f"unknown benchmarks {unknown}: choose from {', '.join(names)}", file=sys.stderr)
        return 2
    toolchain.setup()
    kept = []
    if RESULTS.exists() and len(chosen) < len(names):
        kept = [r for r in json.loads(RESULTS.read_text()) if r.get("bench") not in chosen]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for name in chosen:
        for rec in names[name]():
            records.append({**rec, "bench": name})
            print(f"{name}: {rec['name']}, {rec['config']}: {rec['value']} {rec['unit']}",
                  flush=True)
        RESULTS.write_text(json.dumps(kept + records, indent=1) + "\n")
    print(table(records))
    missed = sum(r["meets"] is False for r in records)
    print(f"\n{len(records)} records, {missed} goals missed -> {RESULTS}")
    for path in bench_plots.draw(kept + records, RESULTS.parent):
        print(f"plot -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

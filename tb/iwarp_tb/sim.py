"""``make sim``: the project's main simulation job, two NICs doing RDMA, then one NIC against
the reference model's NIC.

First (``--runs pair``), two :class:`~iwarp_nic.core.NicCore` back to back over a simulated
link (:class:`~iwarp_tb.nicpair.NicPair`, Verilated natively), each driven by the verbs driver
(:mod:`iwarp_tb.driver`) through its registers, with host memory answering after a latency.
It opens ``--qps`` connections (TCP, then the MPA exchange), then runs, on every connection,
a batch of each operation of ``--ops`` one way, then both ways at once: RDMA Writes (the first
and the last with Immediate Data), Sends, Reads of ``--size`` octets, fetch-and-adds,
Immediate Data. Then single 8-byte Writes, Sends and Reads on an idle line for latency. Every
octet and every completion is checked (:mod:`iwarp_tb.rdma_run`).

It prints a report: per batch the operations, octets, cycles, goodput in Gb/s at the width's
nominal clock and as a fraction of the wire's ceiling for that message (what is left of the
line rate once Ethernet, IPv4, TCP, MPA, DDP and RDMAP take their share), latencies in
cycles and ns, TCP retransmissions seen on the wire, frames either NIC lost (its counter
registers), errors. The frames on the wire go to
``build/sim/run.pcap`` (read back by tshark when it is installed, which must find every
FPDU's CRC good and each RDMAP message the run sent), the waveform to
``build/sim/run.fst``: by default of the connection setup and the latency probes (readable
single operations on an idle line, a few megabytes), with ``--wave all`` of every cycle
(gigabytes for the default run), with ``--no-wave`` none (and a faster build and run).

Then (``--runs model``), one NicCore against the model's whole NIC on raw frames
(:class:`~iwarp_tb.nicmodel.NicModelRig`): the NIC connects, and ``--model-count`` work
requests of every kind the NIC offloads (Writes, Sends with and without Solicited Event,
Reads, atomics and masked atomics, Immediate Data) go each way at once, the outcome compared
with the same work between two model ends (:mod:`iwarp_tb.model_run`): completions and
memory on both sides. Its frames go to ``build/sim/model.pcap``, read back by tshark (good
CRCs, the Read and Atomic Requests and Atomic Responses the work holds, no Terminate).

Exit status 1 on any error.

``python -m iwarp_tb.sim --width 8 --size 65536 --count 8 --qps 2 --ops write,read,send``
(``make sim SIM_ARGS="..."``).
"""

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

from iwarp_model.pcap import PcapWriter
from iwarp_model.verbs import WrOpcode
from iwarp_model.wire.fpdu import mulpdu
from iwarp_model.wire.net import ETHERTYPE_IPV4, PROTO_TCP, EthernetFrame, IPv4Packet, TcpSegment

from . import facilities, model_run, toolchain
from .model_run import Ends
from .nicpair import NicPairRig
from .rdma_run import OPS, RdmaRun
from .traffic import EVERY, End

#: Nominal core clock per width, for Gb/s figures: 1 byte at 125 MHz is 1G, 8 bytes at
#: 156.25 MHz is 10G; 64 bytes at 322.265625 MHz is the usual 100G MAC user clock.
CLOCK_MHZ = {1: 125.0, 2: 125.0, 4: 156.25, 8: 156.25, 16: 156.25, 32: 250.0, 64: 322.265625}
#: Octets of a frame on the line besides the TCP payload: preamble and SFD 8, Ethernet header
#: 14, IPv4 20, TCP 20, FCS 4, inter-frame gap 12.
FRAME_OVERHEAD = 8 + 14 + 20 + 20 + 4 + 12
MSS = 1460
#: DDP and RDMAP header octets of a tagged (Write, Read Response) and an untagged (Send)
#: segment: RFC 5041 sections 4.2 and 4.3 with RFC 5040 section 4.2.
TAGGED, UNTAGGED = 14, 18


def segments(op, size, *, markers=False):
    """The DDP segments of one message of ``size`` octets (at least one)."""
    header = TAGGED if op in ("write", "read") else UNTAGGED
    return max(1, -(-size // (mulpdu(MSS, markers=markers) - header)))


def expected_opcodes(batches, latencies, qps):
    """The RDMAP messages the run puts on the wire, by tshark's names (Immediate Data is
    "Unknown" to tshark 4.0)."""
    count = Counter()
    for b in batches:
        n = b.count * qps * len(b.directions)
        if b.op in ("write", "send", "read"):
            name = {"write": "Write", "send": "Send", "read": "Read Response"}[b.op]
            count[name] += n * segments(b.op, b.size)
        count.update({"write": {"Unknown": min(b.count, 2) * qps * len(b.directions)},
                      "read": {"Read Request": n},
                      "atomic": {"Atomic Request": n, "Atomic Response": n},
                      "imm": {"Unknown": n}}.get(b.op, {}))
    for op in latencies:
        count.update({"write": ["Write"], "send": ["Send"],
                      "read": ["Read Request", "Read Response"]}[op])
    return count


def ceiling(op, size, *, crc=True, markers=False):
    """The fraction of the line rate an ``op`` of ``size`` octets can carry as payload: each
    segment's payload over the line octets of its frame (MULPDU of the MSS, RFC 5044 section
    4.5; an FPDU's 2 octets of length, its CRC and pad)."""
    header = TAGGED if op in ("write", "read") else UNTAGGED
    room = mulpdu(MSS, markers=markers) - header
    frames = segments(op, size, markers=markers)
    line = 0
    left = size
    for _ in range(frames):
        payload = min(room, left)
        left -= payload
        fpdu = 2 + header + payload
        fpdu += -fpdu % 4 + (4 if crc else 0)
        line += fpdu + FRAME_OVERHEAD
    return size / line


def retransmissions(frames):
    """TCP segments with data whose sequence range was seen before, per direction."""
    seen, count = {}, 0
    for frame in frames:
        eth = EthernetFrame.decode(bytes(frame))
        if eth.ethertype != ETHERTYPE_IPV4:
            continue
        ip = IPv4Packet.decode(eth.payload, verify=False)
        if ip.proto != PROTO_TCP:
            continue
        segment = TcpSegment.decode(ip.payload, ip.src, ip.dst, verify=False)
        data = len(segment.payload)
        if not data:
            continue
        flow = (ip.src, ip.dst, segment.sport, segment.dport)
        seq = segment.seq
        end = seen.get(flow)
        if end is not None and (seq - end) % (1 << 32) >= 1 << 31:
            count += 1
        seen[flow] = seq + data if end is None or (seq + data - end) % (1 << 32) < 1 << 31 \
            else end
    return count


def write_pcap(path, frames, clock_mhz):
    with PcapWriter(path) as writer:
        for frame in sorted(frames, key=lambda f: f.cycle):
            writer.write(bytes(frame), round(frame.cycle * 1000 / clock_mhz))


def tshark_summary(path):
    """``(good CRCs, bad CRCs, RDMAP opcodes by tshark's names)``, or None without tshark."""
    if facilities.tshark():
        return None
    from . import tshark
    root, _ = tshark.decode(path)
    checks = [f.get("showname") for f in tshark.fields(root, "iwarp_mpa.crc_check")]
    good = sum("(Good CRC32)" in check for check in checks)
    return good, len(checks) - good, tshark.rdmap_opcodes(root)


def check_pcap(pcap, errors, wanted, *, every=True):
    """tshark's reading of ``pcap`` as one line of the report; every FPDU's CRC must be good
    and the RDMAP messages as ``wanted`` counts them (tshark's names): all of them if
    ``every``, else those it names, and no Terminate."""
    summary = tshark_summary(pcap)
    if summary is None:
        return "tshark not installed: not cross-checked"
    good, bad, opcodes = summary
    if bad or not good:
        errors.append(f"tshark on {pcap.name}: {bad} bad CRCs of {good + bad}")
    found = dict(opcodes) if every else {name: opcodes[name] for name in [*wanted, "Terminate"]}
    wanted = dict(wanted) if every else {**wanted, "Terminate": 0}
    if found != wanted:
        errors.append(f"tshark on {pcap.name}: RDMAP messages {found}, not {wanted}")
    return (f"tshark: {good} FPDUs with a good CRC, {bad} bad; RDMAP "
            + ", ".join(f"{name} {n}" for name, n in sorted(opcodes.items())))


def run_pair(args, mhz, errors):
    """Two NICs back to back: the batches of ``args.ops`` one way then both ways, and the
    latency probes, reported; what went wrong is added to ``errors``."""
    wave = None if args.no_wave else args.out / "run.fst"
    print(f"Two NICs at {args.width} bytes/beat, {mhz} MHz nominal, back to back "
          f"(Verilator {toolchain.verilator_version()}); {args.qps} queue pairs, "
          f"{args.count} x {args.size} octets per batch, host memory latency "
          f"{args.latency_ns:g} ns, seed {args.seed}")
    rig = NicPairRig(args.width, seed=args.seed, trace=wave)
    built = time.monotonic()
    rig.host_latency(args.latency_ns)
    run = RdmaRun(rig, flows=args.qps, size=args.size, seed=args.seed)
    pause = wave is not None and args.wave == "probes"
    setup_end = rig.h.cycle
    if pause:
        rig.h.tracing(False)
    rows = []
    for op in args.ops:
        for directions in (("a",), ("a", "b")):
            rows.append(run.batch(op, args.count, directions=directions))
    probes_start = rig.h.cycle
    if pause:
        rig.h.tracing(True)
    latencies = {op: run.latency(op) for op in ("write", "send", "read")}
    losses = rig.losses()
    frames = rig.frames()
    cycles = rig.h.cycle
    violations = {nic: d.memory.violations() + d.memory.faults()
                  for nic, d in rig.devices.items()}
    errors += run.errors
    for qp_sides in run.flows:
        for nic, side in qp_sides.items():
            if side.qp.reason:
                errors.append(f"{nic} QP {side.qp.qp_num}: {side.qp.reason}")
    for nic, found in violations.items():
        errors += [f"{nic} host memory: {v}" for v in found[:5]]
    errors += [f"{nic} lost frames: {lost}" for nic, lost in losses.items() if lost]
    rig.close()

    head = ("operation", "dir", "count", "octets", "cycles", "B/cycle", "Gb/s", "ceiling",
            "of ceil")
    print(f"\n{head[0]:<10}{head[1]:>5}" + "".join(f"{h:>10}" for h in head[2:]))
    for b in rows:
        gbps = b.payload * 8 * mhz / b.cycles / 1000
        line = args.width * 8 * mhz / 1000
        if b.payload:
            ceil = ceiling(b.op, b.size) * line * len(b.directions)
            share = f"{gbps / ceil:>10.3f}"
            ceil_text = f"{ceil:>10.2f}"
        else:
            share = ceil_text = f"{'-':>10}"
        print(f"{b.op:<10}{'+'.join(b.directions):>5}{b.count * args.qps:>10}{b.payload:>10}"
              f"{b.cycles:>10}{b.bytes_per_cycle:>10.3f}{gbps:>10.2f}{ceil_text}{share}")
    print("\n(Gb/s: payload goodput of all queue pairs together at the nominal clock; ceiling: "
          "what the links in the batch's directions can carry of that message's payload; "
          "a batch runs from its first doorbell to its last completion)")
    for op, c in latencies.items():
        print(f"latency   8-octet {op:<6} {c:>5} cycles {c * 1000 / mhz:>8.1f} ns "
              "(doorbell to the last octet in the target's host memory)")
    pcap = args.out / "run.pcap"
    write_pcap(pcap, frames, mhz)
    print(f"retransmissions: {retransmissions(frames)}; frames on the wire: {len(frames)}; "
          f"cycles simulated: {cycles} ({cycles / max(time.monotonic() - built, 1e-9):,.0f}"
          " per second of this machine)")
    print("frames lost in the NICs: " + ", ".join(
        f"{nic} {sum(lost.values())}" for nic, lost in losses.items())
          + " (their counter registers: MAC receive FIFO, bad FCS, TCP receive front end and "
          "buffer, frames sent but not received)")
    if any(f.err for f in frames):
        errors.append("frames with a bad FCS or a PHY error on the wire")
    note = check_pcap(pcap, errors, expected_opcodes(rows, latencies, args.qps))
    print(f"pcap:      {pcap} ({len(frames)} frames; {note})")
    if wave is not None:
        print(f"waveform:  {rig.h.trace} ("
              + ("every cycle" if args.wave == "all" else
                 f"cycles 0 to {setup_end} and from {probes_start}: the connection setup and "
                 "the latency probes; --wave all for every cycle") + ")")


def run_model(args, mhz, errors):
    """One NIC against the model's whole NIC (its raw-frame TCP/IP, MPA, DDP, RDMAP): the NIC
    connects, then ``args.model_count`` work requests of every kind the NIC offloads go each
    way at once, scored against the same work between two model ends
    (:mod:`iwarp_tb.model_run`); reported, what went wrong added to ``errors``."""
    print(f"\nOne NIC at {args.width} bytes/beat against the model's NIC (its own TCP/IP on "
          f"raw frames): the NIC connects, then {args.model_count} work requests each way of "
          f"{', '.join(EVERY)}, host memory latency {args.latency_ns:g} ns, seed {args.seed}")
    ends = Ends(End, 100 + args.seed)
    rng = random.Random(args.seed)
    work = model_run.both_ways(ends, rng, args.model_count)
    sends = work["nic"][0] + work["peer"][0]
    pcap = args.out / "model.pcap"
    result = model_run.run(ends, work, nic_connects=True, seed=args.seed, width=args.width,
                           latency_cycles=round(args.latency_ns * mhz / 1000), pcap=pcap)
    errors += result.errors
    octets = sum(sge.length for wr in sends for sge in wr.sg_list)
    frames = [frame for _, _, frame in result.captured]
    print(f"completions: NIC {result.completions['nic']}, model {result.completions['peer']}, "
          f"{'each as the oracle run' if not result.errors else 'see errors'}; "
          f"{octets} octets of payload in {result.cycles} cycles; retransmissions: "
          f"{retransmissions(frames)}")
    atomics = sum(wr.opcode in _ATOMICS for wr in sends)
    wanted = {"Read Request": sum(wr.opcode == WrOpcode.RDMA_READ for wr in sends),
              "Atomic Request": atomics, "Atomic Response": atomics}
    note = check_pcap(pcap, errors, wanted, every=False)
    print(f"pcap:      {pcap} ({len(frames)} frames; {note})")


_ATOMICS = (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP,
            WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD, WrOpcode.MASKED_ATOMIC_CMP_AND_SWP)
RUNS = ("pair", "model")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="make sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS),
                        help="pair: two NICs back to back; model: one NIC against the model's "
                             "NIC (default both)")
    parser.add_argument("--width", type=int, default=8, choices=(1, 8),
                        help="datapath bytes per beat (8: 10G at 156.25 MHz, 1: 1G at 125 MHz)")
    parser.add_argument("--size", type=int, default=16384, help="octets per message")
    parser.add_argument("--count", type=int, default=8, help="messages per batch")
    parser.add_argument("--qps", type=int, default=2, help="connections (queue pairs)")
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"operations, comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--model-count", type=int, default=40,
                        help="work requests each way against the model")
    parser.add_argument("--latency-ns", type=float, default=100.0,
                        help="host memory latency")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wave", choices=("probes", "all"), default="probes",
                        help="the waveform's cycles: the connection setup and the latency "
                             "probes (default), or every cycle")
    parser.add_argument("--no-wave", action="store_true", help="no waveform (faster)")
    parser.add_argument("--out", type=Path, default=toolchain.BUILD / "sim")
    args = parser.parse_args(argv)
    args.ops = args.ops.split(",")
    runs = args.runs.split(",")
    for what, given, known in (("operations", args.ops, OPS), ("runs", runs, RUNS)):
        unknown = set(given) - set(known)
        if unknown:
            parser.error(f"unknown {what} {sorted(unknown)}: choose from {', '.join(known)}")

    toolchain.setup()
    args.out.mkdir(parents=True, exist_ok=True)
    mhz = CLOCK_MHZ[args.width]
    started = time.monotonic()
    errors = []
    if "pair" in runs:
        run_pair(args, mhz, errors)
    if "model" in runs:
        run_model(args, mhz, errors)
    print(f"errors:    {len(errors)}")
    for error in errors[:20]:
        print(f"  {error}")
    print(f"({time.monotonic() - started:.0f} s)")
    print("RESULT: " + ("PASS, every octet and completion checked" if not errors
                        else f"FAIL, {len(errors)} errors"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""``make sim``: the project's main simulation job.

Until the NIC exists, it runs both CRC engines as generated Verilog under Verilator on a train of
Ethernet/IPv4/TCP frames built by scapy: the CRC32 engine computes every frame's FCS and the
CRC32c engine every TCP payload's MPA-style CRC. It checks each result against the model, writes
the frames with their hardware FCS to ``build/sim/run.pcap`` (Wireshark checks the FCS), writes a
waveform per engine, and prints a report: packets, bytes, cycles, bytes per cycle, Gb/s at the
width's nominal clock, latency. Exit status 1 on any mismatch.

``python -m iwarp_tb.sim --width 8 --packets 300 --seed 1`` (``make sim SIM_ARGS="..."``).
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import iwarp_model
from iwarp_model.pcap import PcapWriter

from . import facilities, toolchain
from .runner import run_cocotb
from .sim_train import write_train

#: Nominal core clock per width, for Gb/s figures: 1 byte at 125 MHz is 1G, 8 bytes at
#: 156.25 MHz is 10G; 64 bytes at 322.265625 MHz is the usual 100G MAC user clock.
CLOCK_MHZ = {1: 125.0, 2: 125.0, 4: 156.25, 8: 156.25, 16: 156.25, 32: 250.0, 64: 322.265625}
#: TCP port of the train's frames: rping's default, as the NIC's first peer will use.
RPING_PORT = 7174


def frame_train(count, rng):
    """Ethernet/IPv4/TCP frames of random sizes (60..1514 bytes without FCS)."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    frames = []
    for i in range(count):
        size = rng.choice([6, 64, 512, 1460, rng.randint(6, 1460)])
        pkt = (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
               / IP(src="192.0.2.1", dst="192.0.2.2", id=i)
               / TCP(sport=49152, dport=RPING_PORT, seq=1 + 1460 * i, flags="PA")
               / rng.randbytes(size))
        frames.append(bytes(pkt))
    return frames


def tcp_payload(frame):
    return frame[14 + 20 + 20:]


def run_engine(name, factory, width, packets, out_dir):
    from iwarp_nic.crc import CRC32CEngine, CRC32Engine

    engine = {"crc32": CRC32Engine, "crc32c": CRC32CEngine}[factory](width)
    train, results = out_dir / f"{name}.train", out_dir / f"{name}.json"
    write_train(train, packets)
    started = time.monotonic()
    _, trace = run_cocotb(f"iwarp_{factory}_w{width}", engine, "iwarp_tb.sim_train",
                          test_dir=Path(__file__).parent, waves=True,
                          env={"WIDTH": width, "TRAIN": train, "RESULTS": results,
                               "PERIOD_PS": round(1e6 / CLOCK_MHZ[width])})
    wave = out_dir / f"{name}{trace.suffix}"
    wave.write_bytes(trace.read_bytes())
    data = json.loads(results.read_text())
    data.update(engine=engine, wave=wave, seconds=time.monotonic() - started)
    return data


def tshark_fcs(pcap):
    """Count frames tshark finds with good and bad FCS, or None without tshark."""
    if facilities.tshark():
        return None
    done = subprocess.run(["tshark", "-n", "-r", str(pcap), "-o", "eth.check_fcs:TRUE",
                           "-T", "fields", "-e", "eth.fcs.status"],
                          capture_output=True, text=True, check=True)
    status = done.stdout.split()
    return status.count("1"), status.count("0")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="make sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=8, choices=sorted(CLOCK_MHZ),
                        help="datapath bytes per beat (default 8: 10G at 156.25 MHz)")
    parser.add_argument("--packets", type=int, default=300, help="frames in the train")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=toolchain.BUILD / "sim")
    args = parser.parse_args(argv)

    toolchain.setup()
    args.out.mkdir(parents=True, exist_ok=True)
    frames = frame_train(args.packets, random.Random(args.seed))
    payloads = [tcp_payload(f) for f in frames]
    mhz = CLOCK_MHZ[args.width]
    runs = {
        "crc32 (Ethernet FCS)": ("crc32", frames, iwarp_model.crc32),
        "crc32c (MPA CRC)": ("crc32c", payloads, iwarp_model.crc32c),
    }
    print(f"Simulating the CRC engines at {args.width} bytes/beat, {mhz} MHz nominal "
          f"(Verilator {toolchain.verilator_version()}), {args.packets} frames, seed {args.seed}")
    rows, failures, fcs = [], 0, None
    for label, (factory, packets, model) in runs.items():
        r = run_engine(factory, factory, args.width, packets, args.out)
        expected = [model(p) for p in packets]
        wrong = sum(a != b for a, b in zip(r["crcs"], expected)) + abs(
            len(expected) - len(r["crcs"]))
        failures += wrong
        total = sum(len(p) for p in packets)
        cycles = r["out_cycles"][-1] - r["first_in_cycle"] + 1
        latency = [o - i for i, o in zip(r["last_in_cycles"], r["out_cycles"])]
        rows.append((label, len(packets), total, cycles, total / cycles,
                     total * 8 * mhz / cycles / 1000, max(latency), wrong, r["wave"]))
        if factory == "crc32":
            fcs = r["crcs"]

    pcap = args.out / "run.pcap"
    ns_per_byte = 1000 / (mhz * args.width)
    with PcapWriter(pcap, fcs=True) as writer:
        t = 0
        for frame, crc in zip(frames, fcs):
            writer.write(frame + crc.to_bytes(4, "little"), round(t))
            t += (len(frame) + 4 + 20) * ns_per_byte  # FCS, preamble+SFD and inter-frame gap

    head = ("engine", "packets", "bytes", "cycles", "B/cycle", "Gb/s", "latency", "wrong")
    print(f"\n{head[0]:<22}" + "".join(f"{h:>10}" for h in head[1:]))
    for label, n, total, cycles, bpc, gbps, lat, wrong, _ in rows:
        print(f"{label:<22}{n:>10}{total:>10}{cycles:>10}{bpc:>10.3f}{gbps:>10.2f}"
              f"{lat:>10}{wrong:>10}")
    print(f"\n(B/cycle: bytes per clock cycle, {args.width} is one full beat every cycle; "
          f"latency: cycles from a packet's last beat to its CRC)")
    verdict = tshark_fcs(pcap)
    note = ("tshark not installed: FCS not cross-checked" if verdict is None
            else f"tshark: {verdict[0]} good FCS, {verdict[1]} bad")
    print(f"pcap:      {pcap} ({len(frames)} frames with the engine's FCS; {note})")
    for row in rows:
        print(f"waveform:  {row[-1]}")
    if verdict is not None and (verdict[0] != len(frames) or verdict[1]):
        failures += 1
    print("RESULT: " + ("PASS, every CRC equals the model's" if not failures
                        else f"FAIL, {failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""``make bench``: cycle-exact benchmarks from simulation, as records with goals.

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
"""

import json
import random
import sys

from . import toolchain
from .beats import to_columns
from .runner import BeatPlayer
from .sim import CLOCK_MHZ

RESULTS = toolchain.BUILD / "bench" / "results.json"


def record(name, config, value, unit, goal=None, higher_is_better=True):
    meets = None if goal is None else (value >= goal if higher_is_better else value <= goal)
    return {"name": name, "config": config, "value": value, "unit": unit, "goal": goal,
            "meets": meets}


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


BENCHMARKS = [crc_engines]


def table(records):
    head = ("name", "config", "value", "unit", "goal", "meets")
    rows = [[str(r[h]) if r[h] is not None else "-" for h in head] for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def main():
    toolchain.setup()
    records = [r for bench in BENCHMARKS for r in bench()]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(records, indent=1) + "\n")
    print(table(records))
    missed = sum(r["meets"] is False for r in records)
    print(f"\n{len(records)} records, {missed} goals missed -> {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

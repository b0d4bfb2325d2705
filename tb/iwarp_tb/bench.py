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


#: The ECP5 the fits target, and the core clock the Fmax records must reach.
FIT_PART = {"device": "LFE5UM5G-85F", "package": "CABGA554", "speed": 8}
FIT_TARGET_MHZ = 156.25
FIT_SEED = 1


def crc_fits():
    """LUT4, FF and Fmax records of the CRC32c engine at 8 and 64 bytes fitted alone on
    :data:`FIT_PART`; :class:`boards.build.BuildError` if yosys or nextpnr fails."""
    from boards.fit import fit
    from iwarp_nic.crc import CRC32CEngine

    for width in (8, 64):
        report = fit(CRC32CEngine(width), f"iwarp_crc32c_w{width}", target_mhz=FIT_TARGET_MHZ,
                     seed=FIT_SEED, **FIT_PART)
        config = f"{width} B/beat, nextpnr seed {report['seed']}"
        used = {name: counts["used"] for name, counts in report["utilisation"].items()}
        yield record("crc32c engine LUT4 (ECP5 85F)", config, used["LUT4"], "LUT4")
        yield record("crc32c engine FF (ECP5 85F)", config, used["FF"], "FF")
        yield record(f"crc32c engine Fmax (ECP5 85F, speed {FIT_PART['speed']})", config,
                     report["clocks"]["clk"]["fmax_mhz"], "MHz", FIT_TARGET_MHZ)


BENCHMARKS = [crc_engines, crc_fits]


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

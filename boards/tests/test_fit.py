"""Fitting one component alone (boards.fit): one real out-of-context fit of a skid buffer (a few
seconds of yosys and nextpnr), one real breakdown of two, the argument checks and the command
line."""

import gc
import json

import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from boards import build, fit
from iwarp_nic.stream import BeatLayout, SkidBuffer


def test_fit_skid_buffer(tmp_path):
    """The real flow: a report of the board report's schema, every port kept, Fmax on target."""
    report = fit.fit(SkidBuffer(BeatLayout(8)), "skid_w8", target_mhz=156.25, seed=2,
                     out=tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert set(report) == {"clocks", "utilisation", "build_seconds", "device", "seed"}
    assert set(report["clocks"]) == {"clk"}
    clock = report["clocks"]["clk"]
    assert set(clock) == {"fmax_mhz", "target_mhz"}
    assert clock["target_mhz"] == 156.25
    assert clock["fmax_mhz"] > clock["target_mhz"]
    assert set(report["utilisation"]) == {"LUT4", "FF", "EBR", "DSP"}
    for counts in report["utilisation"].values():
        assert set(counts) == {"used", "available"}
        assert 0 <= counts["used"] <= counts["available"]
    # Two 73-bit payload registers (data, keep, last): nothing was optimised away for lack of
    # pins, and out-of-context mode counted no I/O cell.
    assert report["utilisation"]["FF"]["used"] >= 2 * 73
    assert report["utilisation"]["LUT4"]["available"] == 83640
    assert report["device"] == "LFE5UM5G-85F-8BG554"
    assert report["seed"] == 2
    assert report["build_seconds"] > 0
    assert (tmp_path / "top.lpf").read_text() == 'FREQUENCY NET "clk" 156.25 MHZ;\n'
    nextpnr = json.loads((tmp_path / build.NEXTPNR_REPORT).read_text())
    assert nextpnr["utilization"]["TRELLIS_IO"]["used"] == 0  # out of context: no I/O buffers


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_fit_rejects_bad_arguments(tmp_path):
    """Bad arguments fail before the build folder is touched."""
    marker = tmp_path / "keep"
    marker.write_text("")

    def attempt(component=None, name="x", **kwargs):
        component = SkidBuffer(BeatLayout(1)) if component is None else component
        kwargs.setdefault("target_mhz", 100)
        fit.fit(component, name, out=tmp_path, **kwargs)

    with pytest.raises(TypeError, match="wiring.Component"):
        attempt(object())
    with pytest.raises(ValueError, match="folder name"):
        attempt(name="../x")
    with pytest.raises(ValueError, match="target_mhz"):
        attempt(target_mhz=0)
    with pytest.raises(ValueError, match="nextpnr-ecp5 knows"):
        attempt(device="LCMXO2-7000HC")
    with pytest.raises(ValueError, match="nextpnr-ecp5 knows"):
        attempt(package="BG554")
    assert marker.exists()
    gc.collect()  # the unfitted components warn when collected: here, under the filter


def test_device_names():
    assert build.nextpnr_device_flags("LFE5U-25F", "CABGA256", 6) == [
        "--25k", "--package", "CABGA256", "--speed", "6"]
    assert build.lattice_device_name("LFE5UM5G-85F", "CABGA554", 8) == "LFE5UM5G-85F-8BG554"
    assert build.lattice_device_name("LFE5U-25F", "TQFP144", 6) == "LFE5U-25F-6SG144"


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_main(monkeypatch, capsys, tmp_path):
    """The command line fits a module of iwarp_nic.tops, exit status 1 below target; or prints
    its breakdown."""
    calls = []

    def fake_fit(component, name, **kwargs):
        calls.append((type(component).__name__, name, kwargs))
        fmax = 200.0 if kwargs["seed"] == 1 else 100.0
        return {"clocks": {"clk": {"fmax_mhz": fmax, "target_mhz": kwargs["target_mhz"]}},
                "utilisation": {"LUT4": {"used": 1, "available": 2}},
                "build_seconds": 1.0, "device": "D", "seed": kwargs["seed"]}

    monkeypatch.setattr(fit, "fit", fake_fit)
    assert fit.main(["iwarp_crc32c_w8", "--target", "156.25", "--out", str(tmp_path)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert calls[0][:2] == ("CRC32CEngine", "iwarp_crc32c_w8")
    assert calls[0][2]["target_mhz"] == 156.25 and calls[0][2]["out"] == str(tmp_path)
    assert fit.main(["iwarp_skid_w8", "--seed", "2"]) == 1
    assert "clock clk" in capsys.readouterr().err
    monkeypatch.setattr(fit, "breakdown", lambda component, name, out=None: {
        "top": dict.fromkeys(fit.CELLS.values(), 7)})
    assert fit.main(["iwarp_crc32c_w8", "--breakdown"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["top", *["7"] * len(fit.CELLS)]
    with pytest.raises(SystemExit) as exit_info:
        fit.main(["no_such_module"])
    assert exit_info.value.code != 0
    assert "iwarp_crc32c_w64" in capsys.readouterr().err
    gc.collect()  # the components main built for the fake fit warn when collected


class _TwoSkids(wiring.Component):
    """Two skid buffers of 73-bit beats in a row, as submodules ``first`` and ``second``."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(BeatLayout(8))),
                          "o": Out(stream.Signature(BeatLayout(8)))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.first = first = SkidBuffer(BeatLayout(8))
        m.submodules.second = second = SkidBuffer(BeatLayout(8))
        wiring.connect(m, wiring.flipped(self.i), first.i)
        wiring.connect(m, first.o, second.i)
        wiring.connect(m, second.o, wiring.flipped(self.o))
        return m


def test_breakdown(tmp_path):
    """Each block's cells, its submodules' included: the two equal buffers cost the same, each
    at least its two 73-bit registers, and the top is their sum (it has no logic of its own)."""
    result = fit.breakdown(_TwoSkids(), "two_skids", out=tmp_path)
    assert json.loads((tmp_path / "breakdown.json").read_text()) == result
    assert set(result) == {"top", "top.first", "top.second"}
    first, second, top = result["top.first"], result["top.second"], result["top"]
    assert set(top) == set(fit.CELLS.values())
    assert first == second
    assert first["FF"] >= 2 * 73 and first["LUT4"] > 0
    assert top == {kind: first[kind] + second[kind] for kind in top}
    lines = fit.format_breakdown(result, depth=1).splitlines()
    assert lines[0].split() == ["block", *fit.CELLS.values()]
    assert [line.split()[0] for line in lines[1:]] == ["top", "first", "second"]
    assert fit.format_breakdown(result, depth=0).splitlines()[1:] == [lines[1]]

"""Pieces every ECP5 board top shares: the PLL and the build report.

* :func:`pll_config` computes EHXPLLL dividers for a target frequency and checks every ECP5 limit;
  :class:`Ecp5Pll` instantiates the PLL with them (and, optionally, a phase-shifted copy).
* :class:`ClockTarget`, :func:`summarise`, :func:`failures` and :func:`format_summary` turn a
  nextpnr ``--report`` file into the project's board report (see :mod:`boards.build`).

Nothing here depends on a particular board; a board module adds its platform, pins and clocks.
"""

import sys
from dataclasses import dataclass
from fractions import Fraction

from amaranth import Const, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "stretched",
    "PLL_LIMITS", "PllConfig", "pll_config", "Ecp5Pll",
    "ClockTarget", "UTILISATION_CELLS", "summarise", "failures", "format_summary",
]

# ---------------------------------------------------------------------------------------------
# PLL

#: ECP5 sysCLOCK PLL operating ranges in Hz (Lattice ECP5 family datasheet, PLL timing table)
#: and the divider ranges the EHXPLLL primitive accepts.
PLL_LIMITS = {
    "f_in": (8_000_000, 400_000_000),
    "f_pfd": (3_125_000, 400_000_000),
    "f_vco": (400_000_000, 800_000_000),
    "f_out": (3_125_000, 400_000_000),
    "clki_div": (1, 128),
    "clkfb_div": (1, 80),
    "clkop_div": (1, 128),
}


@dataclass(frozen=True)
class PllConfig:
    """One EHXPLLL setting with CLKOP as both the output and the feedback path.

    ``f_out = f_in / clki_div * clkfb_div`` and ``f_vco = f_out * clkop_div``; frequencies are
    exact :class:`~fractions.Fraction` values in Hz.
    """

    clki_div: int
    clkfb_div: int
    clkop_div: int
    f_in: Fraction
    f_target: Fraction

    @property
    def f_pfd(self) -> Fraction:
        return self.f_in / self.clki_div

    @property
    def f_out(self) -> Fraction:
        return self.f_pfd * self.clkfb_div

    @property
    def f_vco(self) -> Fraction:
        return self.f_out * self.clkop_div

    @property
    def error(self) -> Fraction:
        """Relative error of the achieved output frequency against the target."""
        return abs(self.f_out - self.f_target) / self.f_target


def _within(name, value):
    low, high = PLL_LIMITS[name]
    return low <= value <= high


def pll_config(f_in_hz, f_out_hz, *, max_error=0.001) -> PllConfig:
    """The EHXPLLL dividers that turn ``f_in_hz`` into the frequency nearest ``f_out_hz``.

    Every candidate respects :data:`PLL_LIMITS` (input, phase detector, VCO and output ranges,
    divider ranges). Among those with the smallest frequency error, the one with the highest phase
    detector frequency (least jitter) wins, then the one whose VCO is nearest the middle of its
    range. Frequencies may be ``int``, ``float`` (taken at their exact decimal value) or
    ``Fraction``.

    Raises :class:`ValueError` when an input is out of range or when no setting comes within
    ``max_error`` (relative) of the target.
    """
    f_in = Fraction(str(f_in_hz)) if isinstance(f_in_hz, float) else Fraction(f_in_hz)
    f_target = Fraction(str(f_out_hz)) if isinstance(f_out_hz, float) else Fraction(f_out_hz)
    if not _within("f_in", f_in):
        raise ValueError(f"PLL input {float(f_in) / 1e6:g} MHz is outside the ECP5 range "
                         f"{PLL_LIMITS['f_in'][0] / 1e6:g}..{PLL_LIMITS['f_in'][1] / 1e6:g} MHz")
    if not _within("f_out", f_target):
        raise ValueError(f"PLL output {float(f_target) / 1e6:g} MHz is outside the ECP5 range "
                         f"{PLL_LIMITS['f_out'][0] / 1e6:g}..{PLL_LIMITS['f_out'][1] / 1e6:g} MHz")
    vco_mid = Fraction(sum(PLL_LIMITS["f_vco"]), 2)
    best, best_key = None, None
    fb_low, fb_high = PLL_LIMITS["clkfb_div"]
    op_low, op_high = PLL_LIMITS["clkop_div"]
    for clki_div in range(PLL_LIMITS["clki_div"][0], PLL_LIMITS["clki_div"][1] + 1):
        f_pfd = f_in / clki_div
        if not _within("f_pfd", f_pfd):
            continue
        # Only the two feedback dividers either side of the exact ratio can be nearest.
        exact = f_target / f_pfd
        for clkfb_div in {int(exact), int(exact) + 1}:
            if not fb_low <= clkfb_div <= fb_high:
                continue
            f_out = f_pfd * clkfb_div
            if not _within("f_out", f_out):
                continue
            for clkop_div in range(op_low, op_high + 1):
                if not _within("f_vco", f_out * clkop_div):
                    continue
                config = PllConfig(clki_div, clkfb_div, clkop_div, f_in, f_target)
                key = (config.error, -f_pfd, abs(config.f_vco - vco_mid))
                if best_key is None or key < best_key:
                    best, best_key = config, key
    if best is None or best.error > Fraction(str(max_error)):
        nearest = "none" if best is None else f"{float(best.f_out) / 1e6:.6f} MHz"
        raise ValueError(f"no ECP5 PLL setting turns {float(f_in) / 1e6:g} MHz into "
                         f"{float(f_target) / 1e6:g} MHz within {max_error:%} (nearest: {nearest})")
    return best


class Ecp5Pll(wiring.Component):
    """An ECP5 EHXPLLL producing ``clk_out`` from ``clk_in`` and, optionally, a copy of it
    shifted late by ``shifted_deg`` degrees, ``clk_shifted`` (RGMII's transmit clock wants 90).

    ``config`` is a :class:`PllConfig` (from :func:`pll_config`). ``locked`` is the PLL's LOCK
    output, asynchronous to both clocks: synchronise it (e.g. into a reset) before use. The PLL
    runs from power-up; it has no reset input.

    ``clk_shifted`` is CLKOS with CLKOP's divider: its phase against CLKOP is set in eighths of a
    VCO period (CPHASE whole periods, FPHASE eighths), so ``shifted_deg`` must be a multiple of
    ``360 / (8 * clkop_div)`` degrees (:class:`ValueError` otherwise; 100 -> 125 MHz has
    ``clkop_div`` 5, steps of 9 degrees).

    With ``divided_by`` (an integer of 2 or more), ``clk_divided`` is CLKOS2 at ``clk_out``'s
    frequency divided by it (its divider ``clkop_div * divided_by``, at most 128), in no set
    phase against the others: for a domain reached through clock-domain crossings only.
    """

    def __init__(self, config: PllConfig, *, shifted_deg=None, divided_by=None):
        if not isinstance(config, PllConfig):
            raise TypeError(f"config must be a PllConfig, not {config!r}")
        self.config = config
        self.shift_eighths = None
        members = {"clk_in": In(1), "clk_out": Out(1), "locked": Out(1)}
        if divided_by is not None:
            if (not isinstance(divided_by, int) or divided_by < 2
                    or config.clkop_div * divided_by > 128):
                raise ValueError(f"divided_by must be an integer of 2 or more with CLKOP's "
                                 f"divider times it at most 128, not {divided_by!r}")
            members["clk_divided"] = Out(1)
        self.divided_by = divided_by
        if shifted_deg is not None:
            eighths = Fraction(str(shifted_deg)) * 8 * config.clkop_div / 360
            if eighths.denominator != 1 or not 0 <= eighths < 8 * config.clkop_div:
                raise ValueError(f"a phase of {shifted_deg} degrees is not a multiple of "
                                 f"{360 / (8 * config.clkop_div):g} degrees in 0..360")
            self.shift_eighths = int(eighths)
            members["clk_shifted"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        # Coarse phase of half an output period, as Lattice's tools set it; CLKOP is also the
        # feedback, so the loop aligns it to CLKI whatever this value is.
        cphase = c.clkop_div // 2
        outputs = {}                    # CLKOS and CLKOS2, when used
        if self.shift_eighths is not None:
            outputs.update(
                a_FREQUENCY_PIN_CLKOS=f"{float(c.f_out) / 1e6:.6f}",
                p_OUTDIVIDER_MUXB="DIVB",
                p_CLKOS_ENABLE="ENABLED",
                p_CLKOS_DIV=c.clkop_div,
                p_CLKOS_CPHASE=cphase + self.shift_eighths // 8,
                p_CLKOS_FPHASE=self.shift_eighths % 8,
                o_CLKOS=self.clk_shifted,
            )
        if self.divided_by is not None:
            div = c.clkop_div * self.divided_by
            outputs.update(
                a_FREQUENCY_PIN_CLKOS2=f"{float(c.f_out / self.divided_by) / 1e6:.6f}",
                p_OUTDIVIDER_MUXC="DIVC",
                p_CLKOS2_ENABLE="ENABLED",
                p_CLKOS2_DIV=div,
                p_CLKOS2_CPHASE=div // 2,
                p_CLKOS2_FPHASE=0,
                o_CLKOS2=self.clk_divided,
            )
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{float(c.f_in) / 1e6:.6f}",
            a_FREQUENCY_PIN_CLKOP=f"{float(c.f_out) / 1e6:.6f}",
            a_ICP_CURRENT="12",
            a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED",
            p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA",
            p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=c.clki_div,
            p_CLKFB_DIV=c.clkfb_div,
            p_CLKOP_DIV=c.clkop_div,
            p_CLKOP_CPHASE=cphase,
            p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            i_CLKI=self.clk_in,
            i_CLKFB=self.clk_out,
            i_RST=Const(0),
            i_STDBY=Const(0),
            i_PHASESEL0=Const(0),
            i_PHASESEL1=Const(0),
            i_PHASEDIR=Const(1),
            i_PHASESTEP=Const(1),
            i_PHASELOADREG=Const(1),
            i_PLLWAKESYNC=Const(0),
            i_ENCLKOP=Const(0),
            o_CLKOP=self.clk_out,
            o_LOCK=self.locked,
            **outputs,
        )
        return m


# ---------------------------------------------------------------------------------------------
# Report

#: nextpnr-ecp5 utilisation cell types and the names the board report gives them.
UTILISATION_CELLS = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "EBR": "DP16KD",
                     "DSP": "MULT18X18D"}


@dataclass(frozen=True)
class ClockTarget:
    """A clock the board report checks: ``name`` in the report, the ``net`` that carries it (the
    name of a Signal of the top, which nextpnr keeps, possibly behind a submodule prefix), and
    its target in Hz. ``aliases``: other names the net may keep (yosys keeps one of a net's
    names, and may prefer a submodule's, such as a reset synchroniser's clock input)."""

    name: str
    net: str
    target_hz: float
    aliases: tuple = ()


def _fmax_entry(fmax, clock):
    """nextpnr's fmax record for ``clock``: its net's or an alias's exact name, with or without
    nextpnr's decoration (``$glbnet$``), or the only one that is its net once that and a
    hierarchy prefix (``submodule.``, the name yosys may keep for a net after flattening) are
    taken off."""
    for name in (clock.net, *clock.aliases):
        exact = [v for k, v in fmax.items() if name in (k, k.rsplit("$", 1)[-1])]
        if exact:
            return exact[0]
    matches = [v for k, v in fmax.items()
               if k.rsplit("$", 1)[-1].rsplit(".", 1)[-1] == clock.net]
    return matches[0] if len(matches) == 1 else None


def summarise(nextpnr, clocks, *, device, seed, build_seconds):
    """The board report (the schema :mod:`boards.build` writes) from a parsed nextpnr report.

    A clock nextpnr timed no path for gets ``fmax_mhz: None`` (and fails :func:`failures`).
    """
    fmax = nextpnr.get("fmax", {})
    util = nextpnr.get("utilization", {})
    report_clocks = {}
    for clock in clocks:
        entry = _fmax_entry(fmax, clock)
        report_clocks[clock.name] = {
            "fmax_mhz": None if entry is None else round(entry["achieved"], 2),
            "target_mhz": round(clock.target_hz / 1e6, 4),
        }
    utilisation = {}
    for name, cell in UTILISATION_CELLS.items():
        counts = util.get(cell, {})
        utilisation[name] = {"used": counts.get("used", 0), "available": counts.get("available", 0)}
    return {
        "clocks": report_clocks,
        "utilisation": utilisation,
        "build_seconds": round(build_seconds, 1),
        "device": device,
        "seed": seed,
    }


def failures(report):
    """Why ``report`` fails: one line per clock without a timed path or below its target."""
    problems = []
    for name, clock in report["clocks"].items():
        if clock["fmax_mhz"] is None:
            problems.append(f"clock {name}: nextpnr timed no path (is the net name right?)")
        elif clock["fmax_mhz"] < clock["target_mhz"]:
            problems.append(f"clock {name}: {clock['fmax_mhz']:.2f} MHz < target "
                            f"{clock['target_mhz']:g} MHz")
    return problems


def format_summary(board, report):
    """A readable multi-line summary of ``report`` for ``board``."""
    lines = [f"{board}: {report['device']}, nextpnr seed {report['seed']}",
             f"  {'resource':<6} {'used':>7} {'available':>10} {'%':>6}"]
    for name, counts in report["utilisation"].items():
        share = 100 * counts["used"] / counts["available"] if counts["available"] else 0.0
        lines.append(f"  {name:<6} {counts['used']:>7} {counts['available']:>10} {share:>5.1f}%")
    lines.append(f"  {'clock':<6} {'Fmax MHz':>9} {'target':>9}")
    for name, clock in report["clocks"].items():
        fmax = "-" if clock["fmax_mhz"] is None else f"{clock['fmax_mhz']:.2f}"
        ok = clock["fmax_mhz"] is not None and clock["fmax_mhz"] >= clock["target_mhz"]
        lines.append(f"  {name:<6} {fmax:>9} {clock['target_mhz']:>9g}  "
                     f"{'PASS' if ok else 'FAIL'}")
    lines.append(f"  build time {report['build_seconds']:.1f} s")
    return "\n".join(lines)


def print_report(name, report, build_dir, artefacts) -> int:
    """Print the summary and where ``artefacts`` (``{label: path}``) are; print each failure
    with the log folder; return the exit status (1 if any clock or tool failed)."""
    print(format_summary(name, report))
    for label, path in artefacts.items():
        print(f"  {label:<9} {path}")
    problems = failures(report)
    for problem in problems:
        print(f"FAIL {problem} (logs in {build_dir})", file=sys.stderr)
    return 1 if problems else 0


def stretched(m, event, cycles, name, domain="sync"):
    """High for ``cycles`` cycles of ``domain`` after each ``event`` (re-armed by each)."""
    left = Signal(range(cycles), name=name)
    with m.If(event):
        m.d[domain] += left.eq(cycles - 1)
    with m.Elif(left != 0):
        m.d[domain] += left.eq(left - 1)
    return left != 0

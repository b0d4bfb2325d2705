"""Pieces every ECP5 board top shares: the PLL, the CRC soak load, and the build report.

* :func:`pll_config` computes EHXPLLL dividers for a target frequency and checks every ECP5 limit;
  :class:`Ecp5Pll` instantiates the PLL with them.
* :class:`PatternGenerator` is a board-independent source of pseudo-random packets;
  :class:`CrcSoak` feeds it through the CRC32c engine and folds every result into one register, so
  that a board top can route a few bits of it to LEDs and synthesis keeps the whole datapath.
* :class:`ClockTarget`, :func:`summarise`, :func:`failures` and :func:`format_summary` turn a
  nextpnr ``--report`` file into the project's board report (see :mod:`boards.build`).

Nothing here depends on a particular board; a board module adds its platform, pins and clocks.
"""

import sys
from dataclasses import dataclass
from fractions import Fraction

from amaranth import Cat, Const, Instance, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from iwarp_nic.crc import CRC32CEngine
from iwarp_nic.stream import BeatStream, check_data_bytes

__all__ = [
    "PLL_LIMITS", "PllConfig", "pll_config", "Ecp5Pll",
    "PatternGenerator", "CrcSoak", "fold_step", "xor_fold",
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
    """An ECP5 EHXPLLL producing one clock, ``clk_out``, from ``clk_in``.

    ``config`` is a :class:`PllConfig` (from :func:`pll_config`). ``locked`` is the PLL's LOCK
    output, asynchronous to both clocks: synchronise it (e.g. into a reset) before use. The PLL
    runs from power-up; it has no reset input.
    """

    clk_in: In(1)
    clk_out: Out(1)
    locked: Out(1)

    def __init__(self, config: PllConfig):
        if not isinstance(config, PllConfig):
            raise TypeError(f"config must be a PllConfig, not {config!r}")
        self.config = config
        super().__init__()

    def elaborate(self, platform):
        c = self.config
        m = Module()
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
            # Coarse phase of half an output period, as Lattice's tools set it; CLKOP is also
            # the feedback, so the loop aligns it to CLKI whatever this value is.
            p_CLKOP_CPHASE=c.clkop_div // 2,
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
        )
        return m


# ---------------------------------------------------------------------------------------------
# Load: pattern generator, CRC engine, fold

_MASK64 = (1 << 64) - 1


def _xorshift64(x):
    """Marsaglia's xorshift64 (13, 7, 17): a full-period linear (LFSR-class) generator."""
    x ^= (x << 13) & _MASK64
    x ^= x >> 7
    x ^= (x << 17) & _MASK64
    return x


def _xorshift64_hw(x):
    """:func:`_xorshift64` on a 64-bit Amaranth value."""
    a = x ^ (x << 13)[:64]
    b = a ^ (a >> 7)
    return b ^ (b << 17)[:64]


def _splitmix64(seed, index):
    """A well-mixed non-zero 64-bit word for ``(seed, index)``: distinct generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) or 1


class PatternGenerator(wiring.Component):
    """An endless stream of pseudo-random packets of 1..``max_len`` bytes.

    Payload bytes come from xorshift64 generators (one per 64 data bits) stepped once per
    transfer; packet lengths from another one stepped once per packet. A 14-bit draw ``r`` for
    ``max_len`` = 9000 becomes ``r + 1`` when ``r < max_len`` and ``(r - 2**13) + 1`` otherwise,
    so every length in 1..``max_len`` occurs (lengths up to 2**13 slightly more often).

    Contract:

    * ``o`` obeys the stream rules of :mod:`iwarp_nic.stream`: ``keep`` is all ones except on
      ``last`` beats, where it is contiguous from lane 0 and non-zero;
    * ``o.valid`` is always high; one beat per cycle while ``o.ready`` is high, and ``o.payload``
      holds still while ``o.ready`` is low;
    * the sequence depends only on ``seed`` (any integer), not on back-pressure.

    Parameters
    ----------
    data_bytes : int
        Beat width, one of :data:`iwarp_nic.stream.DATA_BYTES`.
    max_len : int
        Longest packet in bytes, 1..65535.
    seed : int
        Selects the sequence.
    """

    def __init__(self, data_bytes, *, max_len=9000, seed=1):
        self.data_bytes = check_data_bytes(data_bytes)
        if not isinstance(max_len, int) or not 1 <= max_len <= 0xFFFF:
            raise ValueError(f"max_len must be an integer in 1..65535, not {max_len!r}")
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, not {seed!r}")
        self.max_len = max_len
        self.seed = seed
        super().__init__({"o": Out(BeatStream(data_bytes))})

    def _length(self, r):
        """Map a draw ``r`` in 0..2**bits-1 to a length in 1..max_len (Python or Amaranth)."""
        top = 1 << (self.max_len.bit_length() - 1)
        if isinstance(r, int):
            return (r if r < self.max_len else r - top) + 1
        return Mux(r < self.max_len, r, r - top)[:self.max_len.bit_length()] + 1

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        bits = self.max_len.bit_length()

        lanes = [Signal(64, name=f"lane{i}", init=_splitmix64(self.seed, i))
                 for i in range((8 * n + 63) // 64)]
        # The length generator's reset state is one step past the draw that sized packet 1.
        len_seed = _splitmix64(self.seed, len(lanes))
        len_rng = Signal(64, init=_xorshift64(len_seed))
        remaining = Signal(range(self.max_len + 1),
                           init=self._length(len_seed & ((1 << bits) - 1)))
        next_len = Signal.like(remaining)
        m.d.comb += next_len.eq(self._length(len_rng[:bits]))

        last = Signal()
        m.d.comb += last.eq(remaining <= n)
        keep = Signal(n)
        if n == 1:
            m.d.comb += keep.eq(1)
        else:
            # On the last beat `remaining` is 1..n; n itself has zero low bits and keeps all lanes.
            with m.Switch(Mux(last, remaining[:(n - 1).bit_length()], 0)):
                with m.Case(0):
                    m.d.comb += keep.eq((1 << n) - 1)
                for k in range(1, n):
                    with m.Case(k):
                        m.d.comb += keep.eq((1 << k) - 1)

        m.d.comb += [
            self.o.valid.eq(1),
            self.o.payload.data.eq(Cat(*lanes)[:8 * n]),
            self.o.payload.keep.eq(keep),
            self.o.payload.last.eq(last),
        ]
        with m.If(self.o.ready):
            m.d.sync += [lane.eq(_xorshift64_hw(lane)) for lane in lanes]
            with m.If(last):
                m.d.sync += [remaining.eq(next_len), len_rng.eq(_xorshift64_hw(len_rng))]
            with m.Else():
                m.d.sync += remaining.eq(remaining - n)
        return m


def fold_step(acc, value):
    """The fold :class:`CrcSoak` applies per result: rotate a 32-bit ``acc`` left by one, XOR."""
    return (((acc << 1) | (acc >> 31)) & 0xFFFF_FFFF) ^ value


def xor_fold(value, width):
    """XOR the ``width``-bit slices of an Amaranth value together (its top slice zero-padded)."""
    parts = [value[i:i + width] for i in range(0, len(value), width)]
    result = parts[0]
    for part in parts[1:]:
        result = result ^ part
    return result


class CrcSoak(wiring.Component):
    """:class:`PatternGenerator` into ``CRC32CEngine``, every CRC folded into ``fold``.

    After each result ``crc`` the engine delivers, ``fold`` becomes ``fold_step(fold, crc)``
    (starting from 0) and ``packets`` counts it (wrapping at 2**32). The engine's result stream is
    always ready. ``gen`` and ``crc`` are the two submodules, exposed for testbenches.

    Parameters are those of :class:`PatternGenerator`.
    """

    fold: Out(32)
    packets: Out(32)

    def __init__(self, data_bytes, *, max_len=9000, seed=1):
        self.gen = PatternGenerator(data_bytes, max_len=max_len, seed=seed)
        self.crc = CRC32CEngine(data_bytes)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.gen = self.gen
        m.submodules.crc = self.crc
        wiring.connect(m, self.gen.o, self.crc.i)
        m.d.comb += self.crc.o.ready.eq(1)
        with m.If(self.crc.o.valid):
            m.d.sync += [
                self.fold.eq(self.fold.rotate_left(1) ^ self.crc.o.payload),
                self.packets.eq(self.packets + 1),
            ]
        return m


# ---------------------------------------------------------------------------------------------
# Report

#: nextpnr-ecp5 utilisation cell types and the names the board report gives them.
UTILISATION_CELLS = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "EBR": "DP16KD",
                     "DSP": "MULT18X18D"}


@dataclass(frozen=True)
class ClockTarget:
    """A clock the board report checks: ``name`` in the report, the ``net`` that carries it (the
    name of the top's Signal, which nextpnr keeps), and its target in Hz."""

    name: str
    net: str
    target_hz: float


def _fmax_entry(fmax, net):
    """nextpnr's fmax record for ``net``: an exact name, or one nextpnr decorated (``$glbnet$``)."""
    if net in fmax:
        return fmax[net]
    matches = [v for k, v in fmax.items() if k.rsplit("$", 1)[-1] == net]
    return matches[0] if len(matches) == 1 else None


def summarise(nextpnr, clocks, *, device, seed, build_seconds):
    """The board report (the schema :mod:`boards.build` writes) from a parsed nextpnr report.

    A clock nextpnr timed no path for gets ``fmax_mhz: None`` (and fails :func:`failures`).
    """
    fmax = nextpnr.get("fmax", {})
    util = nextpnr.get("utilization", {})
    report_clocks = {}
    for clock in clocks:
        entry = _fmax_entry(fmax, clock.net)
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


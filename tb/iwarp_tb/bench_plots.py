"""PNG plots of ``make bench``'s records (matplotlib, drawn off-screen).

:func:`draw` reads the records that carry a ``point`` (see :func:`iwarp_tb.bench.record`) and
writes, next to the results file:

* ``rdma_goodput.png``: RDMA goodput per direction (Gb/s) against the message size, one panel
  per datapath width, one line per operation, each with its wire ceiling
  (:func:`iwarp_tb.sim.ceiling` times the line rate) dashed in the same colour;
* ``rdma_latency.png``: the 8-octet latency (ns) of each operation, one panel per width, the
  goal (P2) drawn where a record has one.

A plot whose records are missing (a selection that did not run that benchmark) is not drawn.
"""

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

from .sim import CLOCK_MHZ, ceiling  # noqa: E402

OPS = ("write", "read", "send")


def _by_width(records, name, unit):
    """``{width: [record, ...]}`` of the records in ``unit`` whose name starts with ``name``
    and that carry a point."""
    widths = defaultdict(list)
    for rec in records:
        if rec["name"].startswith(name) and rec["unit"] == unit and "point" in rec:
            widths[rec["point"]["width"]].append(rec)
    return dict(sorted(widths.items()))


def _panels(count):
    fig, axes = plt.subplots(1, count, figsize=(5.5 * count, 4.2), squeeze=False)
    return fig, axes[0]


def goodput(records):
    """The figure of goodput per direction against the message size (the ``RDMA goodput per
    direction`` records), or ``None`` without such records."""
    widths = _by_width(records, "RDMA goodput per direction", "Gb/s")
    if not widths:
        return None
    fig, axes = _panels(len(widths))
    for ax, (width, recs) in zip(axes, widths.items()):
        line_gbps = width * 8 * CLOCK_MHZ[width] / 1000
        for op, colour in zip(OPS, ("C0", "C1", "C2")):
            points = sorted((r["point"]["size"], r["value"]) for r in recs
                            if r["point"]["op"] == op)
            if not points:
                continue
            sizes = [size for size, _ in points]
            ax.plot(sizes, [gbps for _, gbps in points], "o-", color=colour, label=op)
            ax.plot(sizes, [line_gbps * ceiling(op, size) for size in sizes], "--",
                    color=colour, linewidth=0.8, label=f"{op} ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (octets)")
        ax.set_ylabel("goodput per direction (Gb/s)")
        ax.set_title(f"{width} B/beat at {CLOCK_MHZ[width]:g} MHz, both directions")
        ax.set_ylim(0, line_gbps * 1.05)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def latency(records):
    """The figure of the 8-octet latency of each operation in ns (the ``RDMA latency``
    records in ns), or ``None`` without such records."""
    widths = _by_width(records, "RDMA latency", "ns")
    if not widths:
        return None
    fig, axes = _panels(len(widths))
    for ax, (width, recs) in zip(axes, widths.items()):
        recs = sorted(recs, key=lambda r: OPS.index(r["point"]["op"]))
        bars = ax.bar([r["point"]["op"] for r in recs], [r["value"] for r in recs],
                      color=["C0", "C1", "C2"][:len(recs)])
        ax.bar_label(bars, fmt="%.0f ns")
        for rec in recs:
            if rec["goal"] is not None:
                ax.axhline(rec["goal"], color="red", linestyle="--", linewidth=1,
                           label=f"goal ({rec['point']['op']}): {rec['goal']} ns")
                ax.legend(fontsize="small")
        ax.set_ylabel("doorbell to the last octet in host memory (ns)")
        ax.set_title(f"8-octet latency, {width} B/beat at {CLOCK_MHZ[width]:g} MHz")
        ax.grid(True, axis="y", alpha=0.3)
    return fig


def draw(records, folder: Path) -> list[Path]:
    """Every plot the records allow, as PNG files in ``folder``; the paths written."""
    written = []
    for name, figure in (("rdma_goodput", goodput), ("rdma_latency", latency)):
        fig = figure(records)
        if fig is None:
            continue
        fig.tight_layout()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written

"""make bench's PNG plots: the lines and bars drawn are the records' values, the dashed lines
the wire's ceiling of :func:`iwarp_tb.sim.ceiling` at each width's line rate, and the files
are PNG images of the figure's size."""

import pytest

from iwarp_tb import bench_plots
from iwarp_tb.bench import record
from iwarp_tb.sim import CLOCK_MHZ, ceiling

SIZES = (64, 4096, 1 << 20)


def goodput_records(widths=(1, 8)):
    """Made-up goodput records (the value encodes width, operation and size)."""
    return [record("RDMA goodput per direction", "c", width + i + size / 1e6, "Gb/s",
                   point={"width": width, "op": op, "size": size})
            for width in widths for i, op in enumerate(bench_plots.OPS) for size in SIZES]


def latency_records():
    recs = []
    for width in (1, 8):
        for i, op in enumerate(("send", "write", "read")):
            point = {"width": width, "op": op}
            recs.append(record("RDMA latency", "c", 100 * i + width, "cycles", point=point))
            p2 = width == 8 and op == "write"
            recs.append(record("RDMA latency" + (" (P2)" if p2 else ""), "c",
                               1000.0 * i + width, "ns", 600 if p2 else None,
                               higher_is_better=False, point=point))
    return recs


def test_goodput_lines_are_the_records_and_the_ceiling():
    records = goodput_records()
    fig = bench_plots.goodput(records + latency_records())
    assert len(fig.axes) == 2
    for ax, width in zip(fig.axes, (1, 8)):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(bench_plots.OPS + tuple(f"{op} ceiling"
                                                               for op in bench_plots.OPS))
        line_gbps = width * 8 * CLOCK_MHZ[width] / 1000
        for i, op in enumerate(bench_plots.OPS):
            assert list(lines[op].get_xdata()) == list(SIZES)
            assert list(lines[op].get_ydata()) == [width + i + size / 1e6 for size in SIZES]
            assert list(lines[f"{op} ceiling"].get_ydata()) == pytest.approx(
                [line_gbps * ceiling(op, size) for size in SIZES])
        assert ax.get_xscale() == "log"


def test_latency_bars_are_the_ns_records_in_operation_order():
    fig = bench_plots.latency(latency_records() + goodput_records())
    assert len(fig.axes) == 2
    for ax, width in zip(fig.axes, (1, 8)):
        labels = [tick.get_text() for tick in ax.get_xticklabels()]
        assert labels == list(bench_plots.OPS)
        values = {"send": 0, "write": 1000, "read": 2000}
        assert [bar.get_height() for bar in ax.patches] == [values[op] + width for op in labels]
        goals = [line.get_ydata()[0] for line in ax.get_lines()]
        assert goals == ([600] if width == 8 else [])


def test_draw_writes_pngs_of_the_runs_it_has(tmp_path):
    written = bench_plots.draw(goodput_records(widths=(8,)), tmp_path)
    assert written == [tmp_path / "rdma_goodput.png"]
    data = written[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (round(5.5 * 110), round(4.2 * 110))
    assert bench_plots.draw([record("TCP goodput", "c", 1.0, "Gb/s")], tmp_path / "x") == []

"""``make sim`` end to end, small: two NICs doing every operation, then a NIC against the
model doing every kind of work, every octet checked, and Wireshark reading both captures as
the FPDUs and RDMAP messages the runs sent."""

import pytest

from iwarp_model.pcap import read_pcap
from iwarp_tb import sim


def test_ceiling():
    """The wire's ceiling for a Write at MTU 1500: 1440 octets of payload in each full segment
    (MULPDU 1454 less 14 of DDP/RDMAP header) in 1460 + 78 octets of line."""
    assert sim.ceiling("write", 1440 * 100) == pytest.approx(1440 / 1538)
    assert round(sim.ceiling("write", 1 << 20), 3) == 0.936
    assert sim.segments("send", 1436) == 1 and sim.segments("send", 1437) == 2


@pytest.mark.cocotb
@pytest.mark.tshark
def test_make_sim_small(tmp_path, capsys):
    assert sim.main(["--size", "3000", "--count", "3", "--qps", "2", "--seed", "3",
                     "--model-count", "12", "--no-wave", "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert "RESULT: PASS" in report and "errors:    0" in report
    assert report.count(", 0 bad; RDMAP") == 2
    _, frames = read_pcap(tmp_path / "run.pcap")
    assert len(frames) > 100
    _, frames = read_pcap(tmp_path / "model.pcap")
    assert len(frames) > 12

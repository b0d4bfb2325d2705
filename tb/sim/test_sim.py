"""``make sim`` end to end: the main job passes, and Wireshark agrees with the hardware's FCS."""

import pytest

from iwarp_model.pcap import read_pcap
from iwarp_tb import sim


@pytest.mark.tshark
def test_make_sim_small(tmp_path, capsys):
    assert sim.main(["--packets", "40", "--seed", "3", "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert "tshark: 40 good FCS, 0 bad" in report
    assert "RESULT: PASS" in report
    linktype, frames = read_pcap(tmp_path / "run.pcap")
    assert len(frames) == 40 and linktype & 0xFFFF == 1
    assert all((tmp_path / f"{name}.json").exists() for name in ("crc32", "crc32c"))

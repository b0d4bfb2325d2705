"""The interop matrix (``make interop``) from a JUnit XML: every cell as the tests came out."""

from iwarp_tb.siw import matrix

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tb.siw.test_nic_vs_siw" name="test_rping_nic_client_vs_siw_server[stock]"/>
<testcase classname="tb.siw.test_nic_vs_siw" name="test_rping_nic_server_vs_siw_client[rev1]">
<failure message="boom"/></testcase>
<testcase classname="tb.siw.test_nic_vs_siw" name="test_ucmatose_nic_server_vs_siw_client[p2p]">
<skipped message="no qemu"/></testcase>
<testcase classname="tb.siw.test_nic_vs_siw" name="test_ib_write_bw_nic_client_vs_siw_server[crc]"/>
<testcase classname="tb.siw" name="test_rping_nic_client_vs_siw_server_impaired[split]"/>
<testcase classname="tb.siw.test_nic_vs_siw" name="test_something_else"/>
</testsuite></testsuites>"""


def row(text, tool, role):
    line = next(line for line in text.splitlines() if line.startswith(f"| {tool} | {role} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][2:]


def test_matrix(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    found = matrix.results(junit)
    assert found == {("rping", "client", "stock"): "pass", ("rping", "server", "rev1"): "FAIL",
                     ("ucmatose", "server", "p2p"): "skip",
                     ("ib_write_bw", "client", "crc"): "pass"}
    text = matrix.table(found)
    assert row(text, "rping", "client") == ["pass", "—", "—", "—"]
    assert row(text, "rping", "server") == ["—", "—", "FAIL", "—"]
    assert row(text, "ucmatose", "server") == ["cannot work¹"] * 3 + ["skip"]
    assert row(text, "ib_write_bw", "client") == ["—", "pass", "—", "—"]
    assert row(text, "ib_read_bw", "server") == ["—", "—", "cannot work²", "—"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{matrix.BEGIN}\nold\n{matrix.END}\nafter\n")
    assert matrix.main([str(junit), "--readme", str(readme)]) == 1      # a failure
    assert readme.read_text() == f"intro\n{matrix.BEGIN}\n{text}{matrix.END}\nafter\n"

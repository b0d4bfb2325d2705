"""What a run of :mod:`iwarp_model.perftest` against Linux perftest (``ib_<op>_bw -R``) on siw
must show, whichever end runs the model's application (the model itself,
``tb/siw/test_perftest_vs_siw.py``, or the simulated NIC through its driver,
``tb/siw/test_nic_vs_siw.py``):

* the guest's tool exits 0 after one attempt and prints a result row of the run's size and
  iterations;
* where the figures cross the comm channel they agree: perftest's write/read server prints the
  R1-R5 report the model's client sent (peak and average to two decimals), and the model's
  write/read server got the report perftest's client printed;
* the data, where the model's end can see it: perftest fills its buffer with random octets,
  so what its client wrote into the model's buffer (every slot its address steps reach), what
  the model's client read from perftest's, and the Sends the model's server took are not
  zeros; the model's server took every Send and Wrote the credits perftest's window needs;
* tshark (:func:`check_capture`) reads the run's capture as two MPA connections (comm and
  test) carrying exactly the run's RDMAP messages, a Good CRC32 on every FPDU where CRCs were
  negotiated, nothing malformed. perftest's short comm Sends are why the RPC-over-RDMA
  heuristic stays off (:data:`iwarp_tb.tshark.TSHARK`): tshark would try them as RPC and call
  them malformed.
"""

from collections import Counter

from iwarp_model import perftest
from iwarp_tb import tshark

__all__ = ["EXCHANGES", "credits", "messages", "check_guest", "check_client", "check_server",
           "check_capture"]

#: Lock-step exchanges on the comm connection per op: version, cycle buffer, cache line and
#: MTU, the K handshakes, and for write/read the five report messages R1-R5.
EXCHANGES = {"write": 16, "read": 16, "send": 11}


def credits(iters):
    """The credit Writes of ``ib_send_bw -R``'s server for ``iters`` Sends: one whenever the
    count taken, modulo its receive depth, is a multiple of a third of that depth."""
    depth = perftest.rx_depth(iters)
    return sum((n % depth) % (depth // 3) == 0 for n in range(1, iters + 1))


def messages(op, iters, *, rtrs=0):
    """The RDMAP messages of a run by tshark's names: a Send each way per comm exchange, the
    ``iters`` operations (a Read is a Request and a Response), ``ib_send_bw``'s credit
    Writes, and ``rtrs`` peer-to-peer RTRs (zero-length Writes)."""
    want = Counter({"Send": 2 * EXCHANGES[op], "Write": rtrs})
    if op == "read":
        want.update({"Read Request": iters, "Read Response": iters})
    else:
        want.update({"Send" if op == "send" else "Write": iters})
    if op == "send":
        want["Write"] += credits(iters)
    return +want


def check_guest(guest, size, iters):
    """The guest's tool succeeded with a row of ``size`` and ``iters``; returns the row."""
    assert guest.rc == 0, guest.transcript
    row = guest.row
    assert row[:2] == [str(size), str(iters)], guest.transcript
    assert guest.fields["attempts"] == "1"
    return row


def check_client(op, size, iters, guest, result):
    """The model's client (``result``, a ClientResult or the exception it raised) against
    perftest's server."""
    assert isinstance(result, perftest.ClientResult), (result, guest.transcript)
    row = check_guest(guest, size, iters)
    assert result.peer_version == 6.06
    assert result.report.size == size and result.report.iters == iters
    assert result.exchanges == EXCHANGES[op]
    if op != "send":
        assert row[2] == f"{result.report.bw_peak:.2f}"
        assert row[3] == f"{result.report.bw_avg:.2f}"
    assert result.remote.rkey != 0 and result.remote.vaddr != 0
    if op == "read":
        assert any(result.buffer.memory[:size])


def check_server(op, size, iters, guest, served):
    """The model's server (``served``, a ServerResult or the exception it raised) against
    perftest's client."""
    assert isinstance(served, perftest.ServerResult), (served, guest.transcript)
    row = check_guest(guest, size, iters)
    assert served.peer_version == 6.06
    assert served.exchanges == EXCHANGES[op]
    if op == "send":
        assert served.received == iters and served.credits == credits(iters)
        assert any(served.buffer.memory)
    else:
        report = served.report
        assert (report.size, report.iters) == (size, iters)
        assert row[2:5] == [f"{report.bw_peak:.2f}", f"{report.bw_avg:.2f}",
                            f"{report.msg_rate:.6f}"]
    if op == "write":
        step = -(-size // 64) * 64 if size <= 2048 else 0
        for offset in range(0, 4096, step) if step else [0]:
            assert any(served.buffer.memory[offset:offset + size]), offset


def check_capture(pcap, op, iters, *, crc, rtrs=0):
    """tshark's reading of the run's capture: two MPA Requests and Replies, exactly
    :func:`messages`, a Good CRC32 on every FPDU if ``crc`` (else none checked), nothing
    malformed and no expert error."""
    root, expert = tshark.decode(pcap)
    assert [len(tshark.fields(root, f"iwarp_mpa.{name}")) for name in ("req", "rep")] == [2, 2]
    assert tshark.rdmap_messages(root) == messages(op, iters, rtrs=rtrs)
    checks = [f.get("showname") for f in tshark.fields(root, "iwarp_mpa.crc_check")]
    fpdus = len(tshark.fields(root, "iwarp_mpa.fpdu"))
    assert fpdus >= sum(messages(op, iters, rtrs=rtrs).values())
    assert len(checks) == (fpdus if crc else 0), checks
    assert all("(Good CRC32)" in check for check in checks), checks
    tshark.check_clean(root, expert)

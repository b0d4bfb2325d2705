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
  zeros; the model's server took every Send and Wrote the credits perftest's window needs.
"""

from iwarp_model import perftest

__all__ = ["check_guest", "check_client", "check_server"]


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
    if op == "send":
        assert result.exchanges == 11
    else:
        assert result.exchanges == 16
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
    if op == "send":
        assert served.exchanges == 11 and served.received == iters
        depth = perftest.rx_depth(iters)
        assert served.credits == sum((n % depth) % (depth // 3) == 0
                                     for n in range(1, iters + 1))
        assert any(served.buffer.memory)
    else:
        assert served.exchanges == 16
        report = served.report
        assert (report.size, report.iters) == (size, iters)
        assert row[2:5] == [f"{report.bw_peak:.2f}", f"{report.bw_avg:.2f}",
                            f"{report.msg_rate:.6f}"]
    if op == "write":
        step = -(-size // 64) * 64 if size <= 2048 else 0
        for offset in range(0, 4096, step) if step else [0]:
            assert any(served.buffer.memory[offset:offset + size]), offset

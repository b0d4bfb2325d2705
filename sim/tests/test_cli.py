"""``python -m iwarp_model`` as subprocesses: serve + connect print the perf table, rping's
server and client exchange validated pings, and the errors are one line with their exit code
(connection refused, MPA reject)."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from iwarp_model import cli

SIM = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(SIM) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def model(*args, **options):
    return subprocess.run([sys.executable, "-m", "iwarp_model", *args], env=ENV,
                          capture_output=True, text=True, timeout=60, **options)


class Server:
    """A ``serve`` or ``rping --server`` subprocess on a free port of 127.0.0.1."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", "iwarp_model", *args,
                                      "--bind", "127.0.0.1", "--port", "0"], env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert match, (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port = match.group(1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        out, err = self.proc.communicate(timeout=10)
        return out, err


@pytest.fixture
def server():
    srv = Server("serve")
    yield srv
    srv.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TABLE = re.compile(r"#bytes\s+#iterations\s+BW average\[MB/sec\]\s+t_avg\[usec\]\n"
                   r"\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)")


@pytest.mark.parametrize("op,size,extra", [("write", 65536, []), ("read", 4096, ["--crc"]),
                                           ("send", 1000, ["--markers", "--mpa-rev", "1"]),
                                           ("atomic", 8, [])])
def test_connect_prints_the_table(server, op, size, extra, tmp_path):
    pcap = tmp_path / "c.pcap"
    done = model("connect", "127.0.0.1", "--port", server.port, "--op", op, "--size",
                 str(size), "--iters", "20", "--pcap", str(pcap), *extra)
    assert done.returncode == 0, done.stderr
    match = TABLE.search(done.stdout)
    assert match, done.stdout
    assert (int(match.group(1)), int(match.group(2))) == (size, 20)
    assert float(match.group(3)) > 0 and float(match.group(4)) > 0
    assert pcap.stat().st_size > 20 * size // 2


def test_server_serves_clients_at_once(server):
    clients = [subprocess.Popen([sys.executable, "-m", "iwarp_model", "connect", "127.0.0.1",
                                 "--port", server.port, "--op", "write", "--size", "4096",
                                 "--iters", "50"], env=ENV, stdout=subprocess.PIPE, text=True)
               for _ in range(3)]
    outs = [c.communicate(timeout=60)[0] for c in clients]
    assert all(c.returncode == 0 for c in clients)
    assert all(TABLE.search(out) for out in outs)
    out, _err = server.stop()
    assert out.count("write 4096 B x 50 done") == 3


def test_refused_connection_is_one_clean_line():
    port = str(free_port())
    done = model("connect", "127.0.0.1", "--port", port, "--op", "write", "--size", "8",
                 "--iters", "1")
    assert done.returncode == cli.EXIT_NO_CONNECTION
    assert done.stderr == f"error: connection refused by 127.0.0.1:{port}\n"
    assert done.stdout == ""


def test_mpa_reject_is_one_clean_line(server):
    done = model("connect", "127.0.0.1", "--port", server.port, "--op", "send", "--size",
                 "8", "--iters", "100000")
    assert done.returncode == cli.EXIT_REJECTED
    assert done.stderr == ("error: MPA Request rejected: send test of 100000 iterations: "
                           "at most 65536\n")


def test_bad_arguments_exit_2():
    assert model("connect", "127.0.0.1", "--port", "1", "--op", "atomic", "--size", "16",
                 "--iters", "1").returncode == cli.EXIT_USAGE
    assert model("rping", "--client", "127.0.0.1", "--port", "1",
                 "--size", "8").returncode == cli.EXIT_USAGE


def test_rping_server_and_client():
    srv = Server("rping", "--server", "--verbose")
    try:
        done = model("rping", "--client", "127.0.0.1", "--port", srv.port, "--count", "10",
                     "--verbose", "--crc")
    finally:
        out, err = srv.stop()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 10 and all(line.startswith("ping data: rdma-ping-") for line in lines)
    assert out.count("server ping data: ") == 10

"""The memory target's peer: the model's NIC writing and reading a target's data region with
no help from the target's host (RFC 5040 sections 5.3 and 5.4: tagged Writes and Reads placed
and answered by the NIC alone), as a scenario any rig can run.

Each step is a generator that yields conditions (callables) to wait for and returns its
result: :func:`run` drives one on a rig whose ``run_until(condition, timeout_cycles=)``
moves the simulation (:class:`~iwarp_tb.nicmodel.NicModelRig`); a cocotb test drives the
same generators with its own awaits (``tb/board``). :class:`TargetPeer` keeps what the data
region must hold, so any step can check it through Reads.
"""

from iwarp_model.apps import Host
from iwarp_model.engine import Connection, ConnState
from iwarp_model.mr import Access
from iwarp_model.verbs import SendFlags, SendWR, WcStatus, WrOpcode
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.apps.target import DATA, DATA_STAG, RPING_PORT

__all__ = ["TargetPeer", "run"]

_SETTLED = (ConnState.ESTABLISHED, ConnState.CLOSED, ConnState.TERMINATED)


def run(rig, steps, *, timeout_cycles):
    """Drive generator ``steps`` on ``rig``; return its result."""
    try:
        condition = next(steps)
        while True:
            rig.run_until(condition, timeout_cycles=timeout_cycles)
            condition = steps.send(None)
    except StopIteration as done:
        return done.value


class TargetPeer:
    """The model's NIC (its :class:`~iwarp_model.transport.frames.FrameEndpoint`
    ``endpoint``) as the peer of a memory target at ``ip`` (a string) whose data region is
    ``span`` octets from :data:`~iwarp_nic.apps.target.DATA`, zeros at first.
    :attr:`expect` is what the region must hold after the peer's writes."""

    def __init__(self, endpoint, ip, span):
        self.endpoint, self.ip, self.span = endpoint, ip, span
        self.expect = bytearray(span)

    def connect(self):
        """A model initiator (CRCs asked for, IRD and ORD 16) connects to the target; returns
        its host, a buffer as large as the data region, and its connection."""
        host = Host("peer", ird=16, ord=16)
        buffer = host.register(self.span, Access.LOCAL_WRITE)
        conn = Connection(host.qp, active=True, crc=True)
        self.endpoint.connect(self.ip, RPING_PORT, conn)
        yield lambda: conn.state in _SETTLED
        assert conn.state == ConnState.ESTABLISHED, (conn.state, conn.reason)
        return host, buffer, conn

    @staticmethod
    def completions(host, count):
        """Waits for ``count`` completions of ``host``'s send queue; returns them."""
        got = []
        yield lambda: got.extend(host.send_cq.poll_cq(count - len(got))) or len(got) == count
        return got

    def write_and_read(self, rng, *, count=8):
        """A new connection (:meth:`connect`), :meth:`writes` and :meth:`read_back` on it;
        returns what :meth:`connect` does."""
        host, buffer, conn = yield from self.connect()
        yield from self.writes(host, buffer, rng, count=count)
        yield from self.read_back(host, buffer, count)
        return host, buffer, conn

    def writes(self, host, buffer, rng, *, count=8):
        """``count`` Writes of random octets at random places in the data region, all
        posted at once: every completion good."""
        spans, at = [], 0
        for _ in range(count):
            at += rng.randrange(200)
            length = rng.randint(1, self.span // count - 200)
            spans.append((at, length))
            at += length
        for offset, length in spans:
            data = rng.randbytes(length)
            buffer.memory[offset:offset + length] = data
            self.expect[offset:offset + length] = data
        host.qp.post_send([SendWR(k, WrOpcode.RDMA_WRITE, [buffer.sge(offset, length)],
                                  SendFlags.SIGNALED, remote_addr=DATA + offset,
                                  rkey=DATA_STAG)
                           for k, (offset, length) in enumerate(spans)])
        done = yield from self.completions(host, count)
        assert [w.status for w in done] == [WcStatus.SUCCESS] * count

    def read_back(self, host, buffer, count=8):
        """Reads the whole data region into ``buffer`` in ``count`` pieces, all outstanding
        at once (the target's IRD is 8): every completion good, the octets read equal to
        :attr:`expect`."""
        buffer.memory[:] = bytes(self.span)
        step = -(-self.span // count)
        pieces = [(at, min(step, self.span - at)) for at in range(0, self.span, step)]
        host.qp.post_send([SendWR(100 + k, WrOpcode.RDMA_READ, [buffer.sge(offset, length)],
                                  SendFlags.SIGNALED, remote_addr=DATA + offset,
                                  rkey=DATA_STAG)
                           for k, (offset, length) in enumerate(pieces)])
        done = yield from self.completions(host, len(pieces))
        assert [w.status for w in done] == [WcStatus.SUCCESS] * len(pieces)
        assert bytes(buffer.memory[:self.span]) == bytes(self.expect)

    @staticmethod
    def write_below(host, buffer, conn, *, below=0x200):
        """A Write ``below`` octets under the data region, in no region a peer may name:
        the target answers with RFC 5040's Terminate (DDP, tagged, base or bounds)."""
        host.qp.post_send(SendWR(99, WrOpcode.RDMA_WRITE, [buffer.sge(0, 64)],
                                 SendFlags.SIGNALED, remote_addr=DATA - below,
                                 rkey=DATA_STAG))
        yield lambda: conn.state != ConnState.ESTABLISHED
        assert conn.state == ConnState.TERMINATED, (conn.state, conn.reason)
        assert conn.terminate_received is not None, conn.reason
        assert conn.terminate_received.code == ErrorCode.DDP_TAGGED_BASE_BOUNDS, \
            conn.terminate_received

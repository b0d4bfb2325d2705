"""Sharing the DMA writer and reader between clients: round-robin command arbiters that send
each command's data (writes) and its completion or read data back to the client that issued it.

No bus protocol here beyond valid/ready streams; the AXI4 side is :mod:`.write` and
:mod:`.read`. Client ports have flat names (``i_write0_command``, ``o_read1_data``, ...) so that
:mod:`iwarp_nic.axis` names them ``s_axis_write0_command_*``, ``m_axis_read1_data_*``.
"""

from amaranth import Cat, Module, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import is_zero
from ..roundrobin import round_robin
from ..stream import BeatStream
from .split import DATA_BYTES, DmaCommand, DmaDone

__all__ = ["WriteArbiter", "ReadArbiter", "client_name", "write_clients", "read_clients"]


def client_name(kind, k, what, flow):
    """The port name of client ``k``'s ``what`` stream: ``i_write0_command`` and the like."""
    return f"{'i' if flow == In else 'o'}_{kind}{k}_{what}"


def write_clients(data_bytes, clients):
    """The client-side members of ``clients`` write clients: command, data and done each."""
    members = {}
    for k in range(clients):
        members[client_name("write", k, "command", In)] = In(stream.Signature(DmaCommand))
        members[client_name("write", k, "data", In)] = In(BeatStream(data_bytes))
        members[client_name("write", k, "done", Out)] = Out(stream.Signature(DmaDone))
    return members


def read_clients(data_bytes, clients):
    """The client-side members of ``clients`` read clients: command and data each."""
    members = {}
    for k in range(clients):
        members[client_name("read", k, "command", In)] = In(stream.Signature(DmaCommand))
        members[client_name("read", k, "data", Out)] = Out(BeatStream(data_bytes, err=True))
    return members


def _check(data_bytes, clients, depth):
    if not isinstance(data_bytes, int) or data_bytes not in DATA_BYTES:
        raise ValueError(f"data_bytes must be one of {DATA_BYTES}, not {data_bytes!r}")
    if not isinstance(clients, int) or not 1 <= clients <= 16:
        raise ValueError(f"clients must be an integer from 1 to 16, not {clients!r}")
    if not isinstance(depth, int) or not 3 <= depth <= 1024:
        raise ValueError(f"depth must be an integer from 3 to 1024, not {depth!r}")


def _one_hot_mux(sel, values):
    """``values[k]`` for the one set bit ``k`` of ``sel`` (an AND-OR tree, no compare)."""
    width = len(Value.cast(values[0]))
    out = 0
    for k, value in enumerate(values):
        out = out | (Value.cast(value) & sel[k].replicate(width))
    return out


def _arbitrate(m, requests, o_command, routes):
    """Round-robin grant of one command per cycle from ``requests`` (client command streams)
    into the register ``o_command``; each grant pushes the client's one-hot number into each
    ``(fifo, when)`` of ``routes`` for which ``when(payload)`` holds."""
    take = Signal()
    grant = round_robin(m, Cat(r.valid for r in requests), take, "command")
    payload = requests[0].payload.shape()(_one_hot_mux(grant, [r.payload for r in requests]))
    room = 1
    for fifo, _ in routes:
        room = room & fifo.w_rdy
    can = (~o_command.valid | o_command.ready) & room
    for k, request in enumerate(requests):
        m.d.comb += request.ready.eq(can & grant[k])
    m.d.comb += take.eq(can & grant.any())
    for fifo, when in routes:
        m.d.comb += [fifo.w_data.eq(grant), fifo.w_en.eq(take & when(payload))]
    with m.If(o_command.ready):
        m.d.sync += o_command.valid.eq(0)
    with m.If(take):
        m.d.sync += [o_command.valid.eq(1), Value.cast(o_command.payload).eq(payload)]


def _merge(m, route, sources, sink, *, packets):
    """Pass ``sources[k]`` to ``sink`` for the client ``k`` at the head of ``route``; the entry
    is used up by a ``last`` beat (``packets``) or by any transfer."""
    head = route.r_data
    valid = 0
    for k, source in enumerate(sources):
        valid = valid | (head[k] & source.valid)
        m.d.comb += source.ready.eq(route.r_rdy & head[k] & sink.ready)
    m.d.comb += [sink.valid.eq(route.r_rdy & valid),
                 sink.payload.eq(_one_hot_mux(head, [s.payload for s in sources]))]
    end = sink.payload.last if packets else 1
    m.d.comb += route.r_en.eq(sink.valid & sink.ready & end)


def _steer(m, route, source, sinks, *, packets):
    """Pass ``source`` to ``sinks[k]`` for the client ``k`` at the head of ``route``; the entry
    is used up by a ``last`` beat (``packets``) or by any transfer."""
    head = route.r_data
    ready = 0
    for k, sink in enumerate(sinks):
        ready = ready | (head[k] & sink.ready)
        m.d.comb += [sink.valid.eq(route.r_rdy & head[k] & source.valid),
                     sink.payload.eq(source.payload)]
    m.d.comb += source.ready.eq(route.r_rdy & ready)
    end = source.payload.last if packets else 1
    m.d.comb += route.r_en.eq(source.valid & source.ready & end)


class WriteArbiter(wiring.Component):
    """Share one :class:`~.write.DmaWriter` between ``clients`` write clients, round robin per
    command.

    Ports
    -----
    i_write<k>_command : In(stream.Signature(DmaCommand)), for each client ``k``
    i_write<k>_data : In(BeatStream(data_bytes))
    o_write<k>_done : Out(stream.Signature(DmaDone))
        A client's commands, data packets (one per command of length 1 or more) and
        completions, with the meaning :class:`~.write.DmaWriter` gives them. A client may offer
        a command's data before, with or after the command, but must not make it wait for
        anything else (another command's acceptance or completion): the writer takes packets in
        the order of the commands it granted, from whichever clients.
    o_command, o_data, i_done
        To the writer's ``i_command``, ``i_data``, ``o_done``.

    Arbitration: each cycle the first client after the last one granted that offers a command
    is granted (client 0 first after reset); its command goes to ``o_command`` (a register) and
    its number into two FIFOs of ``depth`` entries: one says whose packet ``o_data`` carries
    next, the other whose ``i_done`` comes next. A command of length 0 has no packet, so it
    enters only the second. Data packets pass whole; ``i_done`` is steered to its client.

    Throughput: one command per cycle; data and completions pass combinationally at one per
    cycle, with no bubble between packets of different clients. Latency: a command is offered on
    ``o_command`` the cycle after it is granted; its packet may pass two cycles after the grant
    (the FIFO's latency). At most ``depth`` commands wait for their completions; then granting
    stops. Back-pressure: each stream stalls only its own path.
    """

    def __init__(self, data_bytes, clients, *, depth=16):
        _check(data_bytes, clients, depth)
        self.data_bytes, self.clients, self.depth = data_bytes, clients, depth
        members = write_clients(data_bytes, clients)
        members.update({
            "o_command": Out(stream.Signature(DmaCommand)),
            "o_data": Out(BeatStream(data_bytes)),
            "i_done": In(stream.Signature(DmaDone)),
        })
        super().__init__(members)

    def port(self, k, what):
        """Client ``k``'s ``command``, ``data`` or ``done`` stream."""
        return getattr(self, client_name("write", k, what, Out if what == "done" else In))

    def elaborate(self, platform):
        m = Module()
        c = self.clients
        m.submodules.data_route = data_route = SyncFIFOBuffered(width=c, depth=self.depth)
        m.submodules.done_route = done_route = SyncFIFOBuffered(width=c, depth=self.depth)
        _arbitrate(m, [self.port(k, "command") for k in range(c)], self.o_command,
                   [(data_route, lambda p: ~is_zero(p.length)), (done_route, lambda p: 1)])
        _merge(m, data_route, [self.port(k, "data") for k in range(c)], self.o_data,
               packets=True)
        _steer(m, done_route, self.i_done, [self.port(k, "done") for k in range(c)],
               packets=False)
        return m


class ReadArbiter(wiring.Component):
    """Share one :class:`~.read.DmaReader` between ``clients`` read clients, round robin per
    command.

    Ports
    -----
    i_read<k>_command : In(stream.Signature(DmaCommand)), for each client ``k``
    o_read<k>_data : Out(BeatStream(data_bytes, err=True))
        A client's commands and the packets they return, with the meaning
        :class:`~.read.DmaReader` gives them (a length-0 command returns nothing).
    o_command, i_data
        To the reader's ``i_command`` and ``o_data``.

    Arbitration as in :class:`WriteArbiter`: the granted client's number enters a FIFO of
    ``depth`` entries (not for a length-0 command), and each packet on ``i_data`` goes to the
    client at its head. A client that stalls its ``o_read<k>_data`` stalls the reader's data for
    every client behind it (there is no buffer). Throughput: one command per cycle, and data at
    one beat per cycle with no bubble between packets of different clients.
    """

    def __init__(self, data_bytes, clients, *, depth=16):
        _check(data_bytes, clients, depth)
        self.data_bytes, self.clients, self.depth = data_bytes, clients, depth
        members = read_clients(data_bytes, clients)
        members.update({
            "o_command": Out(stream.Signature(DmaCommand)),
            "i_data": In(BeatStream(data_bytes, err=True)),
        })
        super().__init__(members)

    def port(self, k, what):
        """Client ``k``'s ``command`` or ``data`` stream."""
        return getattr(self, client_name("read", k, what, Out if what == "data" else In))

    def elaborate(self, platform):
        m = Module()
        c = self.clients
        m.submodules.route = route = SyncFIFOBuffered(width=c, depth=self.depth)
        _arbitrate(m, [self.port(k, "command") for k in range(c)], self.o_command,
                   [(route, lambda p: ~is_zero(p.length))])
        _steer(m, route, self.i_data, [self.port(k, "data") for k in range(c)], packets=True)
        return m


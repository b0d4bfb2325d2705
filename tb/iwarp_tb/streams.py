"""Drive and watch valid/ready streams in either simulator, with random back-pressure.

The handshake logic is written once, against a two-method *bus* adapter:

* ``set(signal, value)`` drives a DUT input;
* ``await edge(*signals)`` waits for the next rising clock edge and returns the values the
  signals had *at* that edge (the values the DUT sampled).

:class:`AmaranthBus` adapts an ``amaranth.sim`` testbench context, :class:`CocotbBus` a cocotb
clock. A :class:`StreamPort` names a stream's ``valid``, ``ready`` and payload fields in that
simulator (``StreamPort.amaranth(dut.i)`` or ``StreamPort.axis(dut, "s_axis")``).
"""

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .beats import Beat, Packet, from_beats, to_beats

__all__ = ["AmaranthBus", "CocotbBus", "StreamPort", "send", "recv", "send_packets",
           "recv_packets", "StreamTimeout", "tcp_chunks", "collector", "until_quiet"]

# AXI-Stream signal suffix for each beat field (iwarp_nic.axis uses the same names).
AXIS_SUFFIX = {"data": "tdata", "keep": "tkeep", "last": "tlast", "err": "tuser"}


class StreamTimeout(AssertionError):
    """The DUT made no transfer for too long: a hang, reported instead of waited on."""


class AmaranthBus:
    def __init__(self, ctx):
        self.ctx = ctx

    def set(self, signal, value):
        self.ctx.set(signal, value)

    async def edge(self, *signals):
        _clk, _rst, *values = await self.ctx.tick().sample(*signals)
        return values


class CocotbBus:
    def __init__(self, clock):
        from cocotb.triggers import RisingEdge

        self._edge = RisingEdge(clock)

    def set(self, signal, value):
        signal.value = value

    async def edge(self, *signals):
        await self._edge
        return [int(s.value) for s in signals]


@dataclass
class StreamPort:
    valid: Any
    ready: Any
    fields: dict  # payload field name -> signal

    @classmethod
    def amaranth(cls, iface):
        """A ``stream.Interface``: struct payload fields by name, a plain payload as ``data``."""
        payload = iface.payload
        layout = getattr(payload, "shape", lambda: None)()
        if hasattr(layout, "members"):
            fields = {name: payload[name] for name, _ in layout}
        else:
            fields = {"data": payload}
        return cls(iface.valid, iface.ready, fields)

    @classmethod
    def axis(cls, dut, prefix):
        """AXI-Stream ports ``<prefix>_tvalid``, ``_tready``, ``_tdata`` [, ``_tkeep``, ``_tlast``,
        ``_tuser``] of a generated module (see :mod:`iwarp_nic.axis`)."""
        fields = {}
        for name, suffix in AXIS_SUFFIX.items():
            handle = getattr(dut, f"{prefix}_{suffix}", None)
            if handle is not None:
                fields[name] = handle
        return cls(getattr(dut, f"{prefix}_tvalid"), getattr(dut, f"{prefix}_tready"), fields)


async def send(bus, port: StreamPort, transfers: Iterable[dict], *, rng: random.Random = None,
               idle=0.0, timeout: int = 10_000):
    """Offer each transfer in turn, holding it until accepted; before each one, insert idle
    cycles (valid low) with probability ``idle`` per cycle (a number, or a function giving it
    each cycle). Raises :class:`StreamTimeout` when one transfer waits ``timeout`` cycles for
    ``ready``."""
    chance = idle if callable(idle) else lambda: idle
    bus.set(port.valid, 0)
    for transfer in transfers:
        while rng is not None and rng.random() < chance():
            bus.set(port.valid, 0)
            await bus.edge()
        for name, value in transfer.items():
            bus.set(port.fields[name], int(value))
        bus.set(port.valid, 1)
        waited = 0
        while not (await bus.edge(port.ready))[0]:
            waited += 1
            if waited > timeout:
                raise StreamTimeout(f"transfer {transfer} not accepted in {timeout} cycles")
    bus.set(port.valid, 0)


async def recv(bus, port: StreamPort, count: int, *, packets: bool = False,
               rng: random.Random = None, stall: float = 0.0, timeout: int = 10_000):
    """Accept ``count`` transfers (or ``count`` packets: transfers up to the ``count``-th with
    ``last`` set), holding ``ready`` low with probability ``stall`` per cycle. Raises
    :class:`StreamTimeout` after ``timeout`` cycles with ``ready`` high and nothing offered."""
    names = list(port.fields)
    signals = [port.valid] + [port.fields[n] for n in names]
    got, done, waited = [], 0, 0
    while done < count:
        ready = rng is None or rng.random() >= stall
        bus.set(port.ready, int(ready))
        valid, *values = await bus.edge(*signals)
        if ready and valid:
            transfer = dict(zip(names, values))
            got.append(transfer)
            done += 1 if not packets else int(bool(transfer.get("last", 1)))
            waited = 0
        elif ready:
            waited += 1
            if waited > timeout:
                raise StreamTimeout(f"no transfer for {timeout} cycles after {len(got)} "
                                    f"({done} of {count} {'packets' if packets else 'transfers'})")
    bus.set(port.ready, 0)
    return got


async def send_packets(bus, port: StreamPort, packets: Iterable[bytes], data_bytes: int, **kw):
    """Send whole packets as beats (``err`` driven only if the port has it)."""
    def transfers():
        for packet in packets:
            for beat in to_beats(packet, data_bytes):
                fields = beat._asdict()
                if "err" not in port.fields:
                    del fields["err"]
                yield fields
    await send(bus, port, transfers(), **kw)


async def recv_packets(bus, port: StreamPort, count: int, data_bytes: int, **kw) -> list[Packet]:
    """Receive ``count`` whole packets, checking every beat against the stream rules."""
    got = await recv(bus, port, count, packets=True, **kw)
    return from_beats((Beat(t["data"], t["keep"], t["last"], t.get("err", 0)) for t in got),
                      data_bytes)


def tcp_chunks(rng: random.Random, octets: bytes, sizes=(1, 7, 64, 1000, 1460)) -> list[bytes]:
    """``octets`` cut into pieces of sizes drawn from ``sizes``, as TCP may deliver a stream."""
    out, at = [], 0
    while at < len(octets):
        size = rng.choice(sizes)
        out.append(octets[at:at + size])
        at += size
    return out


def collector(got: dict, key, port, *, data_bytes: int | None = None,
              rng: random.Random | None = None, stall: float = 0.0):
    """An Amaranth testbench that takes whatever the output ``port`` offers, for ever, into
    ``got[key]``: transfers, or whole packets of ``data_bytes`` beats. Run it as a monitor."""
    async def bench(ctx):
        bus, stream_port = AmaranthBus(ctx), StreamPort.amaranth(port)
        got[key] = []
        while True:
            if data_bytes:
                got[key] += await recv_packets(bus, stream_port, 1, data_bytes, rng=rng,
                                               stall=stall, timeout=1 << 30)
            else:
                got[key] += await recv(bus, stream_port, 1, rng=rng, stall=stall,
                                       timeout=1 << 30)
    return bench


async def until_quiet(ctx, ports, cycles: int):
    """Tick until none of the Amaranth ``ports`` has offered anything for ``cycles`` cycles."""
    quiet = 0
    while quiet < cycles:
        await ctx.tick()
        quiet = 0 if any(ctx.get(port.valid) for port in ports) else quiet + 1

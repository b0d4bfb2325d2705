# amaranth: UnusedElaboratable=no
"""StreamReceiver (deframer, segment parser, segment placer, STag table) against the model.

The model frames a stream of segments (RDMA Writes of 0 octets to 4 KiB, or 64 KiB less the
header, into regions of the stream's PD, Read Requests, Atomic Requests), with CRC and
markers each on and off; the octets go in as chunks of random sizes, with random idles and
stalls on every output. The STag table is loaded from the model's ``MrTable`` through
``i_write``. Each Write must be placed at its host address with its payload, the other
segments forwarded, as the model's engine does; a Write that breaks a check must get its
Terminate code with nothing placed after it; a bad CRC must give the deframer's CRC event and
stop placement.
"""

import random

import pytest

from iwarp_model.mr import Access
from iwarp_model.wire.fpdu import Framer
from iwarp_model.wire.rdmap import AtomicRequest, Opcode, ReadRequest, Segment
from iwarp_nic.ddp.receive import StreamReceiver
from iwarp_nic.errors import TerminateCode
from iwarp_nic.mpa.deframer import ErrorKind
from iwarp_tb.amsim import run
from iwarp_tb.receive import configure
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    recv,
    recv_packets,
    send_packets,
    tcp_chunks,
)

IDLE = STALL = 0.2


class Table(HostTable):
    def __init__(self, rng):
        super().__init__(rng, 64, pds=2)
        self.pd, other = self.pds
        self.regions = [self.table.reg_mr(self.pd, bytearray(size), access,
                                          iova=rng.getrandbits(44))
                        for size, access in ((70000, Access.REMOTE_WRITE),
                                             (4096, Access.REMOTE_WRITE | Access.REMOTE_READ),
                                             (100, Access.REMOTE_READ))]
        self.regions.append(self.table.reg_mr(other, bytearray(64), Access.REMOTE_WRITE))

    def good_write(self, rng, longest=4096):
        region = self.regions[rng.randrange(2)]
        length = min(rng.choice([0, 1, 5, 64, rng.randrange(longest + 1)]), region.length)
        to = region.iova + rng.randrange(region.length - length + 1)
        return Segment(Opcode.WRITE, rng.randbytes(length), rng.random() < 0.5,
                       stag=region.stag, to=to).encode()


def traffic(rng, table, count, longest=4096):
    out = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.7:
            out.append(table.good_write(rng, longest))
        elif pick < 0.85:
            out.append(Segment(Opcode.ATOMIC_REQUEST, msn=rng.getrandbits(32),
                               header=AtomicRequest.cmp_swap(*(rng.getrandbits(b) for b in
                                                               (32, 32, 64, 64, 64)))).encode())
        else:
            out.append(Segment(Opcode.READ_REQUEST, msn=rng.getrandbits(32),
                               header=ReadRequest(*(rng.getrandbits(b) for b in
                                                    (32, 64, 32, 32, 64)))).encode())
    return out


def simulate(n, table, ulpdus, *, crc, markers, seed, corrupt=None, fifo_bytes=16384,
             idle=IDLE, stall=STALL):
    """Frame ``ulpdus`` and feed them in; ``corrupt``: the index of an FPDU whose last octet
    is flipped. Returns what came out."""
    rng = random.Random(seed)
    framer = Framer(crc=crc, markers=markers)
    fpdus = [framer.frame(u) for u in ulpdus]
    if corrupt is not None:
        fpdus[corrupt] = fpdus[corrupt][:-1] + bytes([fpdus[corrupt][-1] ^ 1])
    kept = ulpdus[:corrupt] if corrupt is not None else ulpdus
    placed, forwarded, fault = table.receive(table.pd.handle, kept)
    dut = StreamReceiver(n, stag_entries=64, fifo_bytes=fifo_bytes)
    got = {"extra": []}
    state = {"done": False}

    async def source(ctx):
        bus = AmaranthBus(ctx)
        await configure(ctx, dut, [table.write(r) for r in table.regions], table.pd.handle,
                        crc=crc, markers=markers)
        await send_packets(bus, StreamPort.amaranth(dut.i), tcp_chunks(rng, b"".join(fpdus)), n,
                           rng=random.Random(seed + 1), idle=idle)
        for _ in range(400):
            await ctx.tick()
        state["done"] = True

    def receiver(key, port, count, offset, packets=False):
        async def bench(ctx):
            bus, r = AmaranthBus(ctx), random.Random(seed + offset)
            if packets:
                got[key] = await recv_packets(bus, StreamPort.amaranth(port), count, n, rng=r,
                                              stall=stall)
            else:
                got[key] = await recv(bus, StreamPort.amaranth(port), count, rng=r, stall=stall)
            ctx.set(port.ready, 1)
            while not state["done"]:
                await ctx.tick()
                if ctx.get(port.valid):
                    got["extra"].append(key)
        return bench

    benches = [
        receiver("places", dut.o_place, len(placed), 2),
        receiver("data", dut.o_data, len(placed), 3, packets=True),
        receiver("headers", dut.o_header, len(forwarded), 4),
        receiver("payloads", dut.o_payload, sum(bool(p) for _, p in forwarded), 5, True),
        receiver("faults", dut.o_fault, int(fault is not None), 6),
        receiver("errors", dut.o_error, int(corrupt is not None), 7),
        receiver("completions", dut.o_complete, 0, 8),
        receiver("reads", dut.o_read_done, 0, 9),
    ]
    run(dut, source, *benches, name=f"ddp_receive_w{n}")
    assert [(p["addr"], bytes(d)) for p, d in zip(got["places"], got["data"])] == placed
    assert [h["opcode"] for h in got["headers"]] == [op for op, _ in forwarded]
    assert [bytes(p) for p in got["payloads"]] == [p for _, p in forwarded if p]
    if fault is not None:
        code, ulpdu = fault
        layer, etype, ecode = code.value
        assert TerminateCode(got["faults"][0]["code"]).value == layer << 12 | etype << 8 | ecode
        assert got["faults"][0]["offending_length"] == len(ulpdu)
    if corrupt is not None:
        assert ErrorKind(got["errors"][0]["data"]) == ErrorKind.CRC
    assert not got["extra"]
    return placed, fault


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("crc, markers", [(True, True), (False, False), (True, False)])
def test_traffic(n, crc, markers):
    rng = random.Random(n * 4 + crc * 2 + markers)
    table = Table(rng)
    # At one octet a beat, Writes of up to 1000 octets (two markers apart at most).
    ulpdus = traffic(rng, table, 12 if n == 1 else 40, longest=1000 if n == 1 else 4096)
    placed, fault = simulate(n, table, ulpdus, crc=crc, markers=markers, seed=n)
    assert fault is None and len(placed) > 3


@pytest.mark.parametrize("n", [8, 64])
def test_longest(n):
    """A Write of 64 KiB less the DDP header, then a short one, with a FIFO large enough for
    two long ones (markers off: an FPDU that long cannot carry them, its pointer would not
    fit)."""
    rng = random.Random(3)
    table = Table(rng)
    region = table.regions[0]
    ulpdus = [Segment(Opcode.WRITE, rng.randbytes(length), stag=region.stag,
                      to=region.iova + k).encode() for k, length in enumerate((65535 - 14, 100))]
    simulate(n, table, ulpdus, crc=True, markers=False, seed=n, fifo_bytes=131072,
             idle=0, stall=0)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_violations(n):
    """Bad STag, foreign PD, bounds, rights, each after good traffic: the Terminate code, and
    nothing placed after it."""
    rng = random.Random(40 + n)
    table = Table(rng)
    own, _, read_only, foreign = table.regions
    bad = [Segment(Opcode.WRITE, b"abc", stag=own.stag ^ 0x10, to=own.iova).encode(),
           Segment(Opcode.WRITE, b"abc", stag=foreign.stag, to=foreign.iova).encode(),
           Segment(Opcode.WRITE, b"abc", stag=own.stag, to=own.iova + own.length - 2).encode(),
           Segment(Opcode.WRITE, b"abc", stag=read_only.stag, to=read_only.iova).encode()]
    codes = set()
    for k, segment in enumerate(bad):
        ulpdus = traffic(rng, table, 3, 300) + [segment] + traffic(rng, table, 3, 300)
        _, fault = simulate(n, table, ulpdus, crc=True, markers=bool(k % 2), seed=k)
        codes.add(fault[0])
    assert len(codes) == 4


@pytest.mark.parametrize("n", [1, 8, 64])
def test_bad_crc(n):
    """A bad CRC stops placement at that FPDU: the ones before are placed, none after."""
    rng = random.Random(60 + n)
    table = Table(rng)
    ulpdus = [table.good_write(rng, 500) for _ in range(6)]
    placed, _ = simulate(n, table, ulpdus, crc=True, markers=True, seed=n, corrupt=3)
    assert len(placed) <= 3

"""The memory target's plan (``iwarp_nic.apps.target``) against independent encodings: the
model's (``sim/iwarp_model``: RFC 5040's Read Request header, RFC 5044/6581's MPA frames and
their negotiation) and the testbench's struct unpacking of the descriptors and commands.

The whole plan runs against Linux siw's rping in ``tb/siw/test_nic_vs_siw.py``
(``test_rping_target_vs_siw_client``); here each piece is checked alone, quickly, including
the Requests siw never sends.
"""

import pytest

from iwarp_model.wire import mpa
from iwarp_model.wire.rdmap import ReadRequest
from iwarp_nic.apps.target import (
    DATA,
    DATA_STAG,
    IRD,
    MAX_ULPDU,
    RECV,
    RECV_BYTES,
    RECV_STAG,
    RQ,
    ZEROS,
    BadRequest,
    Slot,
    TargetPlan,
)
from iwarp_nic.host.formats import SQ_INLINE_OFFSET, RqWqe, SqFlags, SqWqe
from iwarp_nic.host.nicmap import CommandOp
from iwarp_nic.mpa.negotiate import Rtr
from iwarp_tb.harness import unpack

PLAN = TargetPlan()


def entry(ram, layout, at):
    return unpack(layout, int.from_bytes(ram[at:at + layout.size // 8], "little"))


def commands(writes):
    """The commands a register program issues: ``[(op, fields)]``, from its mailbox words
    and its writes to ``command``; and the octets it wrote to ``frame_data``."""
    m = PLAN.map
    mailbox, issued, frame = {}, [], b""
    for offset, word in writes:
        if m.offset("cmd_args") <= offset < m.offset("cmd_args", 15) + 4:
            mailbox[(offset - m.offset("cmd_args")) // 4] = word
        elif offset == m.offset("command"):
            op = CommandOp(word)
            value = sum(v << 32 * k for k, v in mailbox.items())
            issued.append((op, unpack(PLAN.layouts[op], value & (1 << PLAN.layouts[op].size)
                                      - 1)))
        elif offset == m.offset("frame_data"):
            frame += word.to_bytes(4, "little")
    return issued, frame


def test_image():
    """The receive entries name the four buffers of the receive region; the send entries
    hold a Read into the data region (its header's sink STag and offset already in place),
    a fenced and a plain 16-octet Send of zeros, and a Write from the data region."""
    ram = PLAN.image()
    for k in range(4):
        assert entry(ram, RqWqe, RQ + 32 * k) | {"_reserved0": 0, "_reserved1": 0} == {
            "addr": RECV + RECV_BYTES * k, "lkey": RECV_STAG, "length": RECV_BYTES,
            "sges": 1, "_reserved0": 0, "_reserved1": 0}
    read, go_a, write, go_b = (entry(ram, SqWqe, PLAN.slot(s)) for s in Slot)
    assert (read["opcode"], read["length"], read["sink_stag"], read["sink_to"]) == \
        (1, 28, DATA_STAG, DATA)
    assert read["source"] == PLAN.slot(Slot.READ) + SQ_INLINE_OFFSET
    assert (go_a["opcode"], go_a["length"], go_a["source"], go_a["flags"]) == \
        (3, 16, ZEROS, SqFlags.FENCE | SqFlags.SIGNALED)
    assert (go_b["opcode"], go_b["length"], go_b["source"], go_b["flags"]) == \
        (3, 16, ZEROS, SqFlags.SIGNALED)
    assert (write["opcode"], write["source"]) == (0, DATA)
    assert ram[ZEROS:ZEROS + 32] == bytes(32)


def test_ping_patches():
    """rping's 16 octets (address, STag, size, big-endian) turn the Read into RFC 5040's
    Read Request of that buffer into the data region, and the Write into one of the given
    size to the second buffer."""
    ram = bytearray(PLAN.image())
    addr, stag, size = 0x0000_7F12_3456_7890, 0x1234_5678, 64
    info = addr.to_bytes(8, "big") + stag.to_bytes(4, "big") + size.to_bytes(4, "big")
    for offset, octets in PLAN.read_patch(info):
        ram[offset:offset + len(octets)] = octets
    inline = PLAN.slot(Slot.READ) + SQ_INLINE_OFFSET
    assert bytes(ram[inline:inline + ReadRequest.SIZE]) == \
        ReadRequest(DATA_STAG, DATA, size, stag, addr).encode()
    read = entry(ram, SqWqe, PLAN.slot(Slot.READ))
    assert (read["sink_stag"], read["sink_to"], read["size"], read["length"]) == \
        (DATA_STAG, DATA, size, 28)
    second = (addr + 4096).to_bytes(8, "big") + (stag ^ 1).to_bytes(4, "big") + bytes(4)
    for offset, octets in PLAN.write_patch(second, size):
        ram[offset:offset + len(octets)] = octets
    write = entry(ram, SqWqe, PLAN.slot(Slot.WRITE))
    assert (write["opcode"], write["length"], write["stag"], write["to"], write["source"]) == \
        (0, size, stag ^ 1, addr + 4096, DATA)


REQUESTS = {
    "rev2": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(1, 1)),
             Rtr.NONE, 1),
    "rev2-crc": (mpa.MpaFrame(reply=False, crc=True, revision=2,
                              enhanced=mpa.EnhancedData(4, 2)), Rtr.NONE, 1),
    "rev1": (mpa.MpaFrame(reply=False, crc=False, revision=1), Rtr.NONE, 1),
    "rev2-plain": (mpa.MpaFrame(reply=False, crc=True, revision=2), Rtr.NONE, 1),
    "ird0": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(0, 1)),
             Rtr.NONE, 0),
    "p2p-write-read": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        1, 1, peer_to_peer=True, rtr_write=True, rtr_read=True)), Rtr.WRITE, 1),
    "p2p-send": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        1, 1, peer_to_peer=True, rtr_send=True)), Rtr.SEND, 1),
    "p2p-read": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        1, 1, peer_to_peer=True, rtr_read=True)), Rtr.READ, 1),
    "private": (mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(1, 1),
                             private_data=b"rdma_cm data"), Rtr.NONE, 1),
}


@pytest.mark.parametrize("name", REQUESTS)
def test_accept(name):
    """The Reply decodes as RFC 5044/6581 say and negotiates with the Request to CRCs on, the
    Request's revision, the RTR taken; the engine is opened with what was negotiated (ORD at
    most the peer's IRD, RFC 6581 section 9.1) before the Reply is sent."""
    request, rtr, ord_ = REQUESTS[name]
    issued, frame = commands(PLAN.accept(3, request.encode()))
    reply = mpa.MpaFrame.decode(frame, reply=True)
    negotiated = mpa.negotiate(request, reply)
    assert negotiated.crc and reply.revision == request.revision
    assert not reply.markers and not reply.reject and reply.private_data == b""
    if request.enhanced is not None and request.revision == 2:
        assert (reply.enhanced.ird, reply.enhanced.ord) == (IRD, ord_)
        assert reply.enhanced.peer_to_peer == request.enhanced.peer_to_peer
    else:
        assert reply.enhanced is None
    if rtr != Rtr.NONE:
        assert {Rtr.SEND: negotiated.rtr_send, Rtr.WRITE: negotiated.rtr_write,
                Rtr.READ: negotiated.rtr_read}[rtr]
        assert [negotiated.rtr_send, negotiated.rtr_write, negotiated.rtr_read].count(True) == 1
    [(op1, engine), (op2, gather), (op3, sent)] = issued
    assert (op1, op2, op3) == (CommandOp.ENGINE_OPEN, CommandOp.GATHER, CommandOp.FRAME)
    assert engine | {"rtr_source": 0} == {
        "pd": 1, "ird": IRD, "ord": ord_, "initiator": 0, "rtr": rtr, "rtr_source": 0,
        "max_ulpdu": MAX_ULPDU, "crc": 1, "markers": 0, "conn": 3}
    assert (gather["op"].name, gather["conn"], gather["crc"], gather["markers"]) == \
        ("FPDUS", 3, 1, 0)
    assert (sent["conn"], sent["length"]) == (3, len(reply.encode()))


@pytest.mark.parametrize("octets", [
    b"MPA ID Rep Frame" + bytes([0x10, 2, 0, 4]) + bytes(4),          # a Reply
    b"MPA ID Req Frame" + bytes([0x00, 3, 0, 0]),                      # revision 3
    b"MPA ID Req Frame" + bytes([0xC0, 2, 0, 0]),                      # markers
    b"MPA ID Req Frame" + bytes([0x10, 2, 0, 2]) + bytes(2),           # S with 2 octets
    b"MPA ID Req Frame" + bytes([0x10, 2, 0, 8]) + bytes(4),           # short
    b"MPA ID Req Frame" + bytes([0x00, 2, 0x02, 0x01]) + bytes(513),   # PD_Length 513
    b"MPA ID Req Fra",                                                 # truncated
    mpa.MpaFrame(reply=False, crc=False, revision=2, enhanced=mpa.EnhancedData(
        1, 1, peer_to_peer=True)).encode(),                            # p2p with no RTR
])
def test_refused(octets):
    with pytest.raises(BadRequest):
        PLAN.accept(0, octets)


def test_programs():
    """start: the addresses and keys, both regions (the data region remotely readable and
    writable, the receive buffers not), the completion queue; arm: the queue pair's rings, its
    four receives, the gather and the listen."""
    issued, _ = commands(PLAN.start(mac=0x0200_0000_0005, ip=0xC0A8_0132, keys=1 << 100))
    assert [op for op, _ in issued] == [CommandOp.MR_WRITE, CommandOp.MR_WRITE,
                                        CommandOp.CQ_OPEN]
    receive, data = (fields["entry"] for _, fields in issued[:2])
    assert (issued[0][1]["index"], receive["access"].value, receive["host_addr"],
            receive["length"]) == (RECV_STAG >> 8, 1, RECV, 4 * RECV_BYTES)
    assert (issued[1][1]["index"], data["access"].value, data["iova"], data["length"]) == \
        (DATA_STAG >> 8, 7, DATA, PLAN.ram_bytes - DATA)
    writes = dict(PLAN.start(mac=0x0200_0000_0005, ip=0xC0A8_0132, keys=1 << 100))
    assert writes[PLAN.map.offset("ip")] == 0xC0A8_0132
    issued, _ = commands(PLAN.arm(2, port=7))
    [(_, qp), (_, gather), (_, tcp)] = issued
    assert (qp["cqs"]["conn"], qp["sq"]["log2_entries"], qp["rq"]["base"]) == (2, 2, RQ)
    assert (gather["op"].name, gather["conn"]) == ("START", 2)
    assert (tcp["op"].name, tcp["conn"], tcp["local_port"]) == ("LISTEN", 2, 7)
    assert (PLAN.map.offset("rq_doorbell", 2), 4) in PLAN.arm(2)


def test_bad_size():
    with pytest.raises(ValueError):
        TargetPlan(ram_bytes=6000)

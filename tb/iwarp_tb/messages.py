"""RDMAP messages to send and the model's segments of them, for the DDP emitter's tests and
benchmarks: random messages of every opcode, the ULPDUs the model's engine cuts them into at a
given ``max_ulpdu`` (``max_ulpdu`` less the header per segment, TO or MO advancing, L on the
last, one empty segment for an empty message), and the payload fetches that takes."""

from iwarp_model.wire.rdmap import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    ReadRequest,
    Segment,
)
from iwarp_model.wire.terminate import ErrorCode, Terminate

__all__ = ["TAGGED", "UNTAGGED", "messages", "segments_of", "fetches"]
TAGGED = (Opcode.WRITE, Opcode.READ_RESPONSE)
UNTAGGED = (Opcode.SEND, Opcode.SEND_INVALIDATE, Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE)


def header_for(rng, opcode):
    """A random RDMAP header for an opcode that carries one."""
    return {
        Opcode.READ_REQUEST: lambda: ReadRequest(*(rng.getrandbits(b)
                                                  for b in (32, 64, 32, 32, 64))),
        Opcode.IMMEDIATE_DATA: lambda: ImmediateData(rng.randbytes(8)),
        Opcode.IMMEDIATE_DATA_SE: lambda: ImmediateData(rng.randbytes(8)),
        Opcode.ATOMIC_REQUEST: lambda: AtomicRequest(0, *(rng.getrandbits(b) for b in
                                                          (32, 32, 64, 64, 64, 64, 64))),
        Opcode.ATOMIC_RESPONSE: lambda: AtomicResponse(rng.getrandbits(32), rng.getrandbits(64)),
        Opcode.TERMINATE: lambda: Terminate.for_error(ErrorCode.DDP_TAGGED_BASE_BOUNDS,
                                                      rng.randbytes(rng.randrange(50))),
    }[opcode]()


def segments_of(msg, payload, max_ulpdu):
    """The model's ULPDUs of a Write, Read Response or Send of any variant (``msg`` as the
    emitter's ``Message`` fields)."""
    opcode = Opcode(msg["opcode"])
    tagged = opcode in TAGGED
    step = max_ulpdu - (14 if tagged else 18)
    ulpdus, offset = [], 0
    while True:
        chunk = payload[offset:offset + step]
        last = offset + len(chunk) >= len(payload)
        where = ({"stag": msg["stag"], "to": (msg["to"] + offset) % (1 << 64)} if tagged
                 else {"msn": msg["msn"], "mo": offset, "inv_stag": msg["inv_stag"]})
        ulpdus.append(Segment(opcode, chunk, last, **where).encode())
        offset += len(chunk)
        if last:
            return ulpdus


def messages(rng, count, max_ulpdu):
    """``count`` random messages, every opcode in turn, as (``Message`` fields, payload, the
    model's ULPDUs)."""
    out = []
    opcodes = [Opcode(k % 12) for k in range(count)]
    rng.shuffle(opcodes)
    for opcode in opcodes:
        msg = {"opcode": int(opcode), "stag": 0, "to": 0, "msn": rng.getrandbits(32),
               "inv_stag": 0}
        if opcode in TAGGED or opcode in UNTAGGED:
            payload = rng.randbytes(rng.choice([0, 1, 5, rng.randrange(3 * max_ulpdu),
                                                rng.randrange(300)]))
            if opcode in TAGGED:
                msg.update(stag=rng.getrandbits(32),
                           to=rng.choice([rng.getrandbits(64), (1 << 64) - 3]), msn=0)
            elif opcode in (Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE):
                msg["inv_stag"] = rng.getrandbits(32)
            ulpdus = segments_of(msg, payload, max_ulpdu)
        else:
            header = header_for(rng, opcode)
            payload = header.encode()
            ulpdus = [Segment(opcode, msn=msg["msn"], header=header).encode()]
        msg["length"] = len(payload)
        out.append((msg, payload, ulpdus))
    return out


def fetches(max_ulpdu, items):
    """(payload, offset, length) of every fetch, in order."""
    out = []
    for msg, payload, _ in items:
        step = max_ulpdu - (14 if msg["opcode"] in TAGGED else 18)
        for offset in range(0, len(payload), step):
            out.append((payload, offset, min(step, len(payload) - offset)))
    return out



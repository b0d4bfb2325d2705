"""RFC 6528 section 3: keyed initial sequence numbers, ISN = M + F(localip, localport, remoteip,
remoteport, secretkey), M a 32-bit timer that ticks every 4 microseconds.

F is SipHash-2-4 (J.-P. Aumasson, D. J. Bernstein, "SipHash: a fast short-input PRF",
INDOCRYPT 2012) under a 128-bit secret key, truncated to its low 32 bits, over the 12 bytes
local_ip | local_port | remote_ip | remote_port, each field big-endian (network order). The
Python reference is :func:`iwarp_model.siphash.siphash24`.
"""

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, eq, lt
from ..headers import Field, HeaderFormat

__all__ = ["SipHash24", "IsnGenerator", "ISN_TUPLE", "TICKS_PER_SECOND"]

#: The bytes F hashes: the connection 4-tuple in network order (12 bytes).
ISN_TUPLE = HeaderFormat("isn_tuple", [
    Field("local_ip", 0, 0, 32),
    Field("local_port", 4, 0, 16),
    Field("remote_ip", 6, 0, 32),
    Field("remote_port", 10, 0, 16),
])

#: RFC 6528 section 3: M is "a timer that is incremented every 4 microseconds".
TICKS_PER_SECOND = 250_000

# Section 2 of the SipHash paper: the state is the key XOR "somepseudorandomlygeneratedbytes".
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)


def _sipround(v0, v1, v2, v3):
    """One SipRound (figure 2.1 of the paper) as combinational logic on four 64-bit values."""
    v0 = (v0 + v1)[:64]
    v2 = (v2 + v3)[:64]
    v1 = v1.rotate_left(13) ^ v0
    v3 = v3.rotate_left(16) ^ v2
    v0 = v0.rotate_left(32)
    v2 = (v2 + v1)[:64]
    v0 = (v0 + v3)[:64]
    v1 = v1.rotate_left(17) ^ v2
    v3 = v3.rotate_left(21) ^ v0
    return v0, v1, v2.rotate_left(32), v3


def _xor_const(value, constant):
    """``value ^ constant`` written bit by bit (an inverter where the constant has a one), so no
    constant operand of the wrong width reaches the Verilog."""
    return Cat(~value[k] if constant >> k & 1 else value[k] for k in range(len(value)))


class SipHash24(wiring.Component):
    """SipHash-2-4 of a ``message_bytes``-byte message, one SipRound per cycle.

    Ports
    -----
    key : In(128)
        The key: ``key[0:64]`` is k0 (key bytes 0..7 read little-endian), ``key[64:128]`` is k1.
        Sampled in the cycle a message is accepted.
    i : In(stream.Signature(8 * message_bytes))
        A message; byte ``j`` in bits ``[8*j, 8*j+8)``.
    o : Out(stream.Signature(64))
        Its hash: the paper's 8 output bytes read little-endian, one per message, in order.

    Latency: ``o.valid`` rises ``rounds + 1`` cycles after the cycle ``i`` transfers, with
    ``rounds`` = 2 * (message_bytes // 8 + 1) + 4 (the compression rounds of every 8-byte word,
    the last one holding the length, then 4 finalisation rounds). Throughput: one message at a
    time; the next is accepted in the cycle ``o`` transfers, so one hash per ``rounds + 1``
    cycles when ``o`` never stalls. The hash is held while ``o.ready`` is low.

    ``message_bytes`` = 0 is allowed (the empty-message test vector) but has a zero-width
    ``i.payload``, which a Verilog port cannot have: use it in simulation only.
    """

    def __init__(self, message_bytes):
        if not isinstance(message_bytes, int) or isinstance(message_bytes, bool) \
                or message_bytes < 0:
            raise ValueError(f"message_bytes must be an integer >= 0, not {message_bytes!r}")
        self.message_bytes = message_bytes
        self.words = message_bytes // 8 + 1
        self.rounds = 2 * self.words + 4
        super().__init__({
            "key": In(128),
            "i": In(stream.Signature(8 * message_bytes)),
            "o": Out(stream.Signature(64)),
        })

    def elaborate(self, platform):
        m = Module()
        words, n = self.words, self.message_bytes
        # The message padded with zeros to 8 * words - 1 bytes, then its length modulo 256.
        padded = Cat(self.i.payload, Const(0, 8 * (8 * words - 1 - n)), Const(n & 0xFF, 8))
        v = [Signal(64, name=f"v{k}") for k in range(4)]
        pending = Signal(64 * words)          # words not yet absorbed, the current one lowest
        count = Signal(range(self.rounds))    # SipRounds done for this message
        k0, k1 = self.key[:64], self.key[64:]

        state = Machine(m, ["IDLE", "ROUND", "DONE"], "state")
        with state.state("IDLE"):
            m.d.comb += self.i.ready.eq(1)
        with state.state("ROUND"):
            r0, r1, r2, r3 = _sipround(*v)
            m.d.sync += [v[0].eq(r0), v[1].eq(r1), v[2].eq(r2), v[3].eq(r3),
                         count.eq(add(count, 1))]
            # After the second round of each word: v0 ^= this word, v3 ^= the next one; after the
            # last word also v2 ^= 0xff, the start of finalisation.
            with m.If(count[0] & lt(count, 2 * words)):
                m.d.sync += [v[0].eq(r0 ^ pending[:64]), pending.eq(pending[64:])]
                if words > 1:
                    m.d.sync += v[3].eq(r3 ^ pending[64:128])
            with m.If(eq(count, 2 * words - 1)):
                m.d.sync += v[2].eq(_xor_const(r2, 0xFF))
            with m.If(eq(count, self.rounds - 1)):
                state.goto("DONE")
        with state.state("DONE"):
            m.d.comb += [self.o.valid.eq(1), self.i.ready.eq(self.o.ready)]
            with m.If(self.o.ready):
                state.goto("IDLE")
        m.d.comb += self.o.payload.eq(v[0] ^ v[1] ^ v[2] ^ v[3])

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                v[0].eq(_xor_const(k0, _INIT[0])),
                v[1].eq(_xor_const(k1, _INIT[1])),
                v[2].eq(_xor_const(k0, _INIT[2])),
                v[3].eq(_xor_const(k1, _INIT[3]) ^ padded[:64]),
                pending.eq(padded),
                count.eq(0),
            ]
            state.goto("ROUND")
        return m


class IsnGenerator(wiring.Component):
    """RFC 6528 initial sequence numbers for new connections.

    ISN = M + F, modulo 2**32: M is the timer's value in the cycle the request is accepted (the
    timer starts at 0 at reset and counts every ``tick_cycles`` = ``round(clock_hz / 250000)``
    cycles, i.e. every 4 us); F is the low 32 bits of SipHash-2-4 under ``key`` of the request's
    4-tuple as :data:`ISN_TUPLE` bytes.

    Ports
    -----
    key : In(128)
        The secret key (k0 = ``key[0:64]``, see :class:`SipHash24`), chosen at random at start-up.
    i : In(stream.Signature(ISN_TUPLE.layout))
        A request: ``{local_ip, local_port, remote_ip, remote_port}``, host order.
    o : Out(stream.Signature(32))
        Its ISN, one per request, in order.

    Latency: ``o.valid`` rises 9 cycles after the cycle ``i`` transfers (8 SipRounds: two words
    of two rounds, four finalisation rounds, one per cycle). One request at a time: the next is
    accepted in the cycle ``o`` transfers, so at most one ISN per 9 cycles.
    """

    def __init__(self, clock_hz):
        if isinstance(clock_hz, bool) or not isinstance(clock_hz, (int, float)) \
                or not clock_hz >= 2 * TICKS_PER_SECOND:
            raise ValueError(f"clock_hz must be a number >= {2 * TICKS_PER_SECOND}, "
                             f"not {clock_hz!r}")
        self.clock_hz = clock_hz
        self.tick_cycles = round(clock_hz / TICKS_PER_SECOND)
        super().__init__({
            "key": In(128),
            "i": In(stream.Signature(ISN_TUPLE.layout)),
            "o": Out(stream.Signature(32)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.hash = hasher = SipHash24(ISN_TUPLE.length)
        m.d.comb += [
            hasher.key.eq(self.key),
            hasher.i.payload.eq(ISN_TUPLE.pack(self.i.payload)),
            hasher.i.valid.eq(self.i.valid),
            self.i.ready.eq(hasher.i.ready),
        ]

        timer = Signal(32)                                 # M
        prescale = Signal(range(self.tick_cycles))
        with m.If(eq(prescale, self.tick_cycles - 1)):
            m.d.sync += [prescale.eq(0), timer.eq(add(timer, 1))]
        with m.Else():
            m.d.sync += prescale.eq(add(prescale, 1))

        timer_at_request = Signal(32)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += timer_at_request.eq(timer)
        m.d.comb += [
            self.o.payload.eq((timer_at_request + hasher.o.payload[:32])[:32]),
            self.o.valid.eq(hasher.o.valid),
            hasher.o.ready.eq(self.o.ready),
        ]
        return m

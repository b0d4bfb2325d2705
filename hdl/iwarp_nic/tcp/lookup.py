"""RFC 9293 section 3.10.7 (SEGMENT ARRIVES) starts by finding the connection an arriving
segment belongs to from its socket pair; this is that table: an exact-match map from a
:data:`~iwarp_nic.tcp.layouts.ConnKey` (our single local IP aside) to a connection id.

Chained hashing in block RAM, so an insert never fails while connection ids are free:

* a bucket memory (``buckets`` entries) holds the head of each chain;
* a next-pointer memory, indexed by connection id, links a chain's members;
* a key memory, indexed by connection id, holds each connection's key and an in-use bit.

The bucket of a key is a keyed hash (:func:`bucket_hash`) under the secret ``hash_key``, so a
peer that does not know it cannot choose 4-tuples that pile up in one chain.
"""

from amaranth import Cat, Module, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, eq, lt, ne
from .layouts import ConnKey, ConnRef, conn_bits

__all__ = ["ConnLookup", "LookupResult", "InsertRequest", "RemoveRequest", "bucket_hash",
           "hash_round1", "hash_round2"]


def LookupResult(conns):
    """The answer to a lookup: ``hit``, and on a hit the connection id ``conn`` (else 0)."""
    return data.StructLayout({"hit": 1, "conn": conn_bits(conns)})


def InsertRequest(conns):
    """Add the entry ``key`` -> ``conn``."""
    return data.StructLayout({"key": ConnKey, "conn": conn_bits(conns)})


def RemoveRequest(conns):
    """Drop the entry of connection ``conn``, if it has one."""
    return ConnRef(conns)


def _link(conns):
    """A chain pointer: ``valid`` and the connection id it points at."""
    return data.StructLayout({"valid": 1, "conn": conn_bits(conns)})


#: A key memory entry: the connection's key, and whether the connection is in the table.
_KeyEntry = data.StructLayout({"key": ConnKey, "used": 1})


def bucket_hash(m, key, hash_key, bits, name):
    """A ``bits``-bit Signal named ``name``: the bucket index of the :data:`ConnKey` ``key``
    under the 32-bit secret ``hash_key`` (combinational, two 32-bit additions deep).

    Two add-rotate-XOR rounds over a = remote_ip ^ hash_key, b = {remote_port, local_port} ^
    (hash_key rotated left by 16):  a += b; b = rotl(b, 7) ^ a; a = rotl(a, 16) + b;
    b = rotl(b, 13) ^ a; h = a ^ rotl(b, 8); the index is the XOR of h's ``bits``-bit slices
    (from bit 0 up, the last one zero-extended). The carries make which keys share a bucket
    depend on the secret. It is a cheap mix, not a PRF: it stops a peer from precomputing
    colliding 4-tuples, not one that can time many lookups to learn the secret.
    """
    a, b = hash_round1(key, hash_key)
    return hash_round2(m, a, b, bits, name)


def hash_round1(key, hash_key):
    """The first addition of :func:`bucket_hash`: ``(a + b, b)`` (32 bits each)."""
    a = key.remote_ip ^ hash_key
    b = Cat(key.local_port, key.remote_port) ^ hash_key.rotate_left(16)
    return (a + b)[:32], b


def hash_round2(m, a, b, bits, name):
    """The rest of :func:`bucket_hash` from :func:`hash_round1`'s ``(a, b)``: a ``bits``-bit
    Signal named ``name``."""
    b = b.rotate_left(7) ^ a
    a = (a.rotate_left(16) + b)[:32]
    b = b.rotate_left(13) ^ a
    mixed = Signal(32, name=f"{name}_mix")
    index = Signal(bits, name=name)
    m.d.comb += mixed.eq(a ^ b.rotate_left(8))
    folded = mixed[:bits]
    for lo in range(bits, 32, bits):
        folded = folded ^ mixed[lo:lo + bits]
    m.d.comb += index.eq(folded)
    return index


class ConnLookup(wiring.Component):
    """Exact-match table of up to ``conns`` entries ConnKey -> connection id, in block RAM.

    Ports
    -----
    i_lookup : In(stream.Signature(ConnKey))
        A key to look up. ``o_lookup`` answers each one, in order.
    o_lookup : Out(stream.Signature(LookupResult(conns)))
        ``{hit, conn}``; ``conn`` is 0 on a miss. Held while ``o_lookup.ready`` is low; a new
        lookup is accepted only when the previous answer has gone or goes in that cycle.
    i_insert : In(stream.Signature(InsertRequest(conns)))
        Add ``key`` -> ``conn`` at the head of its chain. The caller guarantees that neither
        ``conn`` nor ``key`` is in the table (breaking this can leave a chain that loops; every
        walk still ends, see below, but answers for that chain's keys are then undefined).
    i_remove : In(stream.Signature(RemoveRequest(conns)))
        Drop ``conn``'s entry; a no-op when ``conn`` is not in the table.
    hash_key : In(32)
        The secret of :func:`bucket_hash`, drawn at random at start-up. It must not change while
        the table holds entries (reset empties the table).

    Operations are served one at a time, each seeing the effect of every operation served
    before it. Arbitration takes turns, so nothing starves: when a lookup and an update (insert
    or remove) both wait, the kind not served last goes first, and so between an insert and a
    remove. A lookup also waits while the previous answer is still held on ``o_lookup``.

    Timing, counting from the cycle the request transfers (cycle 0), with ``p`` the position of
    the entry in its chain (0 = head) and ``n`` the length of the chain searched:

    ========================  ==============================  ===========================
    operation                 ``o_lookup.valid`` from cycle   next request accepted from
    ========================  ==============================  ===========================
    lookup, hit               5 + p                           5 + p
    lookup, miss              4 + n (4 on an empty bucket)    4 + n
    insert                    --                              4
    remove, present           --                              4 + p
    remove, absent            --                              2
    ========================  ==============================  ===========================

    A walk follows at most ``conns`` - 1 next pointers, so every operation ends even if the
    caller broke the insert contract. After reset the table is emptied by writing every bucket
    and key entry: the inputs are not ready for the first max(``buckets``, ``conns``) cycles.

    A lookup's or an insert's key is registered as it is accepted and hashed over the next two
    cycles (one addition each) into the bucket register, which addresses the bucket memory
    (read asynchronously); a remove hashes the key read back from the key memory the same
    way. So no path runs from an input through :func:`bucket_hash`, and no cycle chains its
    two additions or one of them with a memory read.

    Parameters
    ----------
    conns : int
        Number of connection ids, ``0 .. conns - 1`` (>= 1).
    buckets : int
        Number of chains, a power of two >= 2 (default: the smallest >= 2 * ``conns``).
    """

    def __init__(self, conns, *, buckets=None):
        if isinstance(conns, bool):
            raise ValueError(f"conns must be a positive integer, not {conns!r}")
        bits = conn_bits(conns)
        if buckets is None:
            buckets = max(2, 1 << (2 * conns - 1).bit_length())
        if (not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 2
                or buckets & (buckets - 1) or buckets > 1 << 32):
            raise ValueError(f"buckets must be a power of two from 2 to 2**32, not {buckets!r}")
        self.conns, self.buckets = conns, buckets
        self.bucket_bits = (buckets - 1).bit_length()
        self._conn_bits = bits
        super().__init__({
            "i_lookup": In(stream.Signature(ConnKey)),
            "o_lookup": Out(stream.Signature(LookupResult(conns))),
            "i_insert": In(stream.Signature(InsertRequest(conns))),
            "i_remove": In(stream.Signature(RemoveRequest(conns))),
            "hash_key": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        conns = self.conns
        link = _link(conns)
        per_conn = max(conns, 2)                 # a memory of depth 1 has a zero-width address
        m.submodules.bucket_mem = bucket_mem = Memory(shape=link, depth=self.buckets, init=[])
        # bucket_rd reads asynchronously at the `bucket` register (below).
        m.submodules.next_mem = next_mem = Memory(shape=link, depth=per_conn, init=[])
        m.submodules.key_mem = key_mem = Memory(shape=_KeyEntry, depth=per_conn, init=[])
        bucket_rd, bucket_wr = bucket_mem.read_port(domain="comb"), bucket_mem.write_port()
        next_rd, next_wr = next_mem.read_port(), next_mem.write_port()
        key_rd, key_wr = key_mem.read_port(), key_mem.write_port()
        # key_rd and next_rd always read the same connection: the one the walk is at.
        walk_addr = Signal(self._conn_bits)
        m.d.comb += [key_rd.addr.eq(walk_addr), next_rd.addr.eq(walk_addr)]

        look, ins, rem, out = self.i_lookup, self.i_insert, self.i_remove, self.o_lookup
        bucket = Signal(self.bucket_bits)        # the bucket of the operation's key
        req_key = Signal(ConnKey)                # the key being looked up or inserted
        # The hash in two cycles, one addition each, from registers: its first round of the
        # key accepted (HASH) or of the key read back for a remove (R_KEY) into `half_a` and
        # `half_b`, then the rest (HASH2, R_HASH2) into `bucket`.
        half_a, half_b = Signal(32), Signal(32)
        accepted_a, accepted_b = hash_round1(req_key, self.hash_key)
        removed_a, removed_b = hash_round1(key_rd.data.key, self.hash_key)
        half_bucket = hash_round2(m, half_a, half_b, self.bucket_bits, "half_bucket")
        conn = Signal(self._conn_bits)           # the connection being inserted or removed
        cur = Signal(self._conn_bits)            # the chain entry the walk is at
        steps = Signal(self._conn_bits)          # next pointers followed so far
        victim_next = Signal(link)               # what the removed entry pointed at
        lookup_last = Signal()                   # the last operation served was a lookup
        insert_last = Signal()                   # the last update served was an insert

        # The answer register behind o_lookup.
        result = Signal(LookupResult(conns))
        result_valid = Signal()
        m.d.comb += [out.valid.eq(result_valid), out.payload.eq(result)]
        with m.If(out.ready):
            m.d.sync += result_valid.eq(0)
        result_free = ~result_valid | out.ready

        def answer(hit, at):
            m.d.sync += [result_valid.eq(1), result.hit.eq(hit), result.conn.eq(at)]

        def forget(which):
            """Mark connection ``which`` as not in the table."""
            m.d.comb += [key_wr.en.eq(1), key_wr.addr.eq(which), key_wr.data.eq(0)]

        def can_follow(pointer):
            return pointer.valid & ne(steps, conns - 1)

        # Defaults: the walk follows the next pointer just read; the bucket is the latched one.
        m.d.comb += [walk_addr.eq(next_rd.data.conn), bucket_rd.addr.eq(bucket)]

        state = Machine(m, ["CLEAR", "IDLE", "HASH", "HASH2", "L_BUCKET", "L_CHECK", "INSERT",
                            "R_KEY", "R_HASH2", "R_HEAD", "R_WALK"], "state", onehot=True)
        with state.state("CLEAR"):
            sweep = Signal(range(max(self.buckets, conns)))
            m.d.sync += sweep.eq(add(sweep, 1))
            m.d.comb += [bucket_wr.en.eq(1), bucket_wr.addr.eq(sweep), bucket_wr.data.eq(0),
                         key_wr.en.eq(lt(sweep, conns)), key_wr.addr.eq(sweep),
                         key_wr.data.eq(0)]
            with m.If(eq(sweep, max(self.buckets, conns) - 1)):
                state.goto("IDLE")

        with state.state("IDLE"):
            updates_wait = ins.valid | rem.valid
            take_lookup = look.valid & result_free & (~lookup_last | ~updates_wait)
            take_remove = ~take_lookup & rem.valid & (insert_last | ~ins.valid)
            take_insert = ~take_lookup & ~take_remove & ins.valid
            m.d.comb += [look.ready.eq(take_lookup), rem.ready.eq(take_remove),
                         ins.ready.eq(take_insert), walk_addr.eq(rem.payload.conn)]
            m.d.sync += req_key.eq(look.payload)
            with m.If(take_lookup):
                m.d.sync += lookup_last.eq(1)
                state.goto("HASH")
            with m.If(take_insert):
                m.d.sync += [lookup_last.eq(0), insert_last.eq(1), conn.eq(ins.payload.conn),
                             req_key.eq(ins.payload.key)]
                m.d.comb += [key_wr.en.eq(1), key_wr.addr.eq(ins.payload.conn),
                             key_wr.data.key.eq(ins.payload.key), key_wr.data.used.eq(1)]
                state.goto("HASH")
            with m.If(take_remove):
                m.d.sync += [lookup_last.eq(0), insert_last.eq(0), conn.eq(rem.payload.conn)]
                state.goto("R_KEY")

        # --- the key accepted (a lookup's or an insert's) -> its bucket -------------------------
        with state.state("HASH"):
            m.d.sync += [half_a.eq(accepted_a), half_b.eq(accepted_b)]
            state.goto("HASH2")
        with state.state("HASH2"):
            m.d.sync += bucket.eq(half_bucket)
            with m.If(lookup_last):
                state.goto("L_BUCKET")
            with m.Else():
                state.goto("INSERT")

        # --- lookup: bucket -> head, then compare and follow next pointers ---------------------
        with state.state("L_BUCKET"):
            head = bucket_rd.data
            m.d.comb += walk_addr.eq(head.conn)
            m.d.sync += [cur.eq(head.conn), steps.eq(0)]
            with m.If(head.valid):
                state.goto("L_CHECK")
            with m.Else():
                answer(0, 0)
                state.goto("IDLE")
        with state.state("L_CHECK"):
            entry, pointer = key_rd.data, next_rd.data
            with m.If(entry.used & (Value.cast(entry.key) == Value.cast(req_key))):
                answer(1, cur)
                state.goto("IDLE")
            with m.Elif(can_follow(pointer)):
                m.d.sync += [cur.eq(pointer.conn), steps.eq(add(steps, 1))]
            with m.Else():
                answer(0, 0)
                state.goto("IDLE")

        # --- insert: the key was written in IDLE; now link it in at the head of its chain ------
        with state.state("INSERT"):
            m.d.comb += [next_wr.en.eq(1), next_wr.addr.eq(conn), next_wr.data.eq(bucket_rd.data),
                         bucket_wr.en.eq(1), bucket_wr.addr.eq(bucket),
                         bucket_wr.data.valid.eq(1), bucket_wr.data.conn.eq(conn)]
            state.goto("IDLE")

        # --- remove: read the entry, hash its key, find its predecessor and unlink it ----------
        with state.state("R_KEY"):
            m.d.sync += [half_a.eq(removed_a), half_b.eq(removed_b),
                         victim_next.eq(next_rd.data)]
            with m.If(key_rd.data.used):
                state.goto("R_HASH2")
            with m.Else():
                state.goto("IDLE")
        with state.state("R_HASH2"):
            m.d.sync += bucket.eq(half_bucket)
            state.goto("R_HEAD")
        with state.state("R_HEAD"):
            head = bucket_rd.data
            m.d.comb += walk_addr.eq(head.conn)
            m.d.sync += [cur.eq(head.conn), steps.eq(0)]
            with m.If(head.valid & (head.conn == conn)):
                m.d.comb += [bucket_wr.en.eq(1), bucket_wr.addr.eq(bucket),
                             bucket_wr.data.eq(victim_next)]
                forget(conn)
                state.goto("IDLE")
            with m.Elif(head.valid):
                state.goto("R_WALK")
            with m.Else():
                forget(conn)
                state.goto("IDLE")
        with state.state("R_WALK"):
            pointer = next_rd.data               # the successor of `cur`
            with m.If(pointer.valid & (pointer.conn == conn)):
                m.d.comb += [next_wr.en.eq(1), next_wr.addr.eq(cur),
                             next_wr.data.eq(victim_next)]
                forget(conn)
                state.goto("IDLE")
            with m.Elif(can_follow(pointer)):
                m.d.sync += [cur.eq(pointer.conn), steps.eq(add(steps, 1))]
            with m.Else():
                forget(conn)
                state.goto("IDLE")
        state.done()
        return m

"""The reader of a digest-verified load: a `reader.Reader` whose reads hash their bytes for a
`planc.manifest.digestcheck.Verifier` on the reader's own thread as they land in the ring slot (or
a host-path part's buffer), while they are in the cache: no second read, no second copy, no second
pass over the slot. A read's whole leaves go through the read-and-hash loop (`native`:
`planc.execute.io.readhash`, one call per request: 256 KiB pieces read and hashed in the cache, or
with PLANC_DIGEST_READ=mapped, from a file read through the page cache, each line copied out of a
mapping of the file into the slot and hashed from the same loads); without it, or for what it does
not hash, the reader hands its bytes over a piece at a time (`Verifier.piece_bytes`: the leaf, 16
MiB by default; `Verifier.stream`) and the verifier hashes them in Python.

`DigestReader(reader, verifier, native)` forwards everything else to `reader` (the pipeline, the report
and `close` see the reader they always see); `abort()` releases reads waiting for earlier ones
when the load fails. A reader whose `read_into` takes no `sink` (a test's stand-in) has its
bytes handed over after each read instead.
"""

from __future__ import annotations

import inspect
import time

from . import readhash


def _takes_sink(reader) -> bool:
    try:
        params = inspect.signature(reader.read_into).parameters
        return "sink" in params and "tail" in params
    except (TypeError, ValueError):
        return False


class DigestReader:
    def __init__(self, reader, verifier, native=None, simd: str | None = None, mapped: bool = False):
        self._reader, self.verifier = reader, verifier
        self._pieces = _takes_sink(reader)
        self._native = native if native is not None and hasattr(reader, "read_hashing") else None
        verifier.hasher = "native" if self._native is not None else "python"
        self._simd = None
        if self._native is not None:
            verifier.hash_extent = self._native.digest
            verifier.simd = self._simd = self._native.level_name(simd)  # PLANC_DIGEST_HASH
        # PLANC_DIGEST_READ=mapped: files read through the page cache copied out of a mapping of them
        self._mapped = (mapped and self._native is not None and self._native.mapped
                        and hasattr(reader, "read_mapped"))
        verifier.read = "mapped" if self._mapped else "pread"
        verifier.paired = self._native is not None  # a leaf across two reads hashed by the later one
        if self._native is not None:  # a leaf across reads end to end: its parts into one state, in order
            for lf in verifier.chain_leaves():
                lf.hasher = self._native.new_state()

    def __getattr__(self, name):
        return getattr(self._reader, name)

    # A failed read (or hash) aborts the verifier: a later read of the same leaf, waiting for this
    # one's bytes, would otherwise wait for ever, and the pool's shutdown with it.
    def read_into(self, rel: str, offset: int, length: int, buf, needed: int) -> int:
        v, deferred = self.verifier, []
        try:
            n = self._read_hashing(rel, offset, length, buf, needed, deferred) if self._native is not None else None
            if n is not None:
                return n
            if self._pieces:
                sink = v.stream(rel, deferred)
                n = self._reader.read_into(rel, offset, length, buf, needed, piece=v.piece_bytes,
                                           tail=v.digest.leaf_bytes, sink=sink)
                sink.flush()
            else:
                n = self._reader.read_into(rel, offset, length, buf, needed)
                v.feed(rel, offset, buf[:needed], deferred)
            v.settle(deferred)  # parts of leaves whose earlier bytes came in another read
        except BaseException as e:
            v.abort(e)
            raise
        return n

    def _read_hashing(self, rel: str, offset: int, length: int, buf, needed: int, deferred: list) -> int | None:
        """The read through the read-and-hash loop, its leaves hashed as they land: a paired leaf
        whose last part begins it (its bytes before the read given to the loop:
        `Verifier.begin_paired`), its whole leaves, and the parts of chained leaves at its ends
        (their own states: the part that begins a leaf read and hashed first, so that the next read
        can go on with it; the part that ends or continues one once the reads before have hashed
        theirs). The rest of its bytes (other parts of shared leaves, an extent's fills) go
        through `feed`. None when the read has none of these or the loop stopped short (then read
        it the usual way)."""
        v = self.verifier
        head = v.paired_head(rel, offset, needed)
        chead, ctail = v.chained_parts(rel, offset, needed)  # never one leaf: ctail begins inside the read
        if head is not None:
            chead = None
        leaves = v.whole_leaves(rel, offset, needed)
        if not leaves and head is None and chead is None and ctail is None:
            return None
        limit, cap = needed, length  # the second call's bytes and its reads' end (all, without a tail read first)
        tail_last = ctail is not None and self._reader.files[rel].direct
        if ctail is not None and not tail_last:
            # the part that begins a chained leaf, read and hashed first; the second call then reads
            # up to its first byte and no further (its bytes are loaded once, as they were hashed)
            x0 = ctail[1].lo - offset
            t0 = time.perf_counter()
            done = self._read(rel, offset + x0, length - x0, buf[x0:], needed - x0, [(0, needed - x0)],
                              {0: (ctail[1].hasher, True, True)}, b"", count=False)
            if done is None:
                return None
            v.chained(rel, ctail[0], ctail[1], offset + needed, b"", time.perf_counter() - t0, start=ctail[1].lo)
            limit = cap = x0
        spans, chained, prefix = [], {}, b""
        if head is not None:
            prefix = v.begin_paired(rel, head[1])
            spans.append((0, head[1].hi - offset))
        elif chead is not None:
            lf = chead[1]
            v.wait_chain(rel, lf, offset)
            spans.append((0, min(lf.hi, offset + needed) - offset))
            chained[0] = (lf.hasher, True, lf.hi > offset + needed)
        spans += [(l0 - offset, l1 - offset) for _, _, l0, l1 in leaves]
        if tail_last:  # O_DIRECT: in the one call, after the rest (its reads begin on a block)
            spans.append((ctail[1].lo - offset, needed))
            chained[len(spans) - 1] = (ctail[1].hasher, True, True)
        t0 = time.perf_counter()
        digests = []
        if limit > 0:  # (none: the tail was the whole read)
            done = self._read(rel, offset, cap, buf, limit, spans, chained, prefix, count=False)
            if done is None:
                if limit == needed:
                    return None  # read it again the usual way, which says why it stopped
                # the tail is read and hashed: the bytes before it the usual way (an error says why)
                self._reader.read_into(rel, offset, limit, buf, limit)
                self._reader.counted(needed - limit, requests=0)
                v.feed(rel, offset, memoryview(buf)[:limit], deferred)
                v.settle(deferred)
                return needed
            digests = done[1]
        self._reader.counted(needed)
        seconds = time.perf_counter() - t0
        if head is not None:
            v.record_paired(rel, head[0], head[1], digests[0], seconds)
            digests, seconds = digests[1:], 0.0
        elif chead is not None:
            v.chained(rel, chead[0], chead[1], offset + spans[0][1], digests[0], seconds, start=offset)
            digests, seconds = digests[1:], 0.0
        if tail_last:
            v.chained(rel, ctail[0], ctail[1], offset + needed, b"", 0.0, start=ctail[1].lo)
            digests = digests[:-1]
        if leaves:
            v.record_leaves(rel, leaves, digests, seconds)
        covered = spans + ([(ctail[1].lo - offset, needed)] if limit < needed else [])
        exts = [st for st, *_ in leaves] + [x[0] for x in (head, chead, ctail) if x is not None]
        if (covered and covered[0][0] == 0 and covered[-1][1] == needed
                and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
                and not any(st.fills and not st.claimed for st in exts)):
            return needed  # the read was its leaves: nothing else to hash (the common read)
        v.feed(rel, offset, memoryview(buf)[:needed], deferred)  # hashed leaves and parts: skipped
        v.settle(deferred)
        return needed

    def _read(self, rel: str, offset: int, length: int, buf, needed: int, spans: list, chained: dict, prefix: bytes,
              count: bool):
        """One call of the loop: (bytes read, digests), or None when it stopped short (the chained
        leaves' states then as they were before it: a call that stops part way has fed some)."""
        states = [c[0] for c in chained.values()]
        for st in states:
            st.save()
        done = None
        if self._mapped:
            done = self._reader.read_mapped(rel, offset, length, buf, needed, spans, self._native, self._simd, prefix,
                                            chained=chained, count=count)
            if done is None:
                for st in states:
                    st.restore()
        if done is None:
            done = self._reader.read_hashing(rel, offset, length, buf, needed, spans, self._native, readhash.PIECE,
                                             self._simd, prefix, chained=chained, count=count)
            if done is None:
                for st in states:
                    st.restore()
        return done

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        v, deferred = self.verifier, []
        try:
            n = self._reader.read_strided(rel, offset, length, stride, count, buf)
            for k in range(count):  # the segments lie packed in the slot, in file order
                v.feed(rel, offset + k * stride, buf[k * length:(k + 1) * length], deferred)
            v.settle(deferred)
        except BaseException as e:
            v.abort(e)
            raise
        return n

    def read_plain(self, rel: str, offset: int, buf) -> None:
        v, deferred = self.verifier, []
        try:
            self._reader.read_plain(rel, offset, buf)
            v.feed(rel, offset, buf, deferred)
            v.settle(deferred)
        except BaseException as e:
            v.abort(e)
            raise

    def abort(self) -> None:
        self.verifier.abort()

    def close(self) -> None:
        self.verifier.abort()  # a read still waiting for an earlier one stops waiting
        self._reader.close()

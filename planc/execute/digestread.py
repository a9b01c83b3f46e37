"""The reader of a digest-verified load: a `reader.Reader` whose reads hash their bytes for a
`planc.manifest.digestcheck.Verifier` on the reader's own thread as they land in the ring slot (or
a host-path part's buffer), while they are in the cache: no second read, no second copy, no second
pass over the slot. A read's whole leaves go through the read-and-hash loop (`native`:
`planc.execute.readhash`, 256 KiB pieces, one call per request); without it, or for what it does
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
    def __init__(self, reader, verifier, native=None):
        self._reader, self.verifier = reader, verifier
        self._pieces = _takes_sink(reader)
        self._native = native if native is not None and hasattr(reader, "read_hashing") else None
        verifier.hasher = "native" if self._native is not None else "python"
        if self._native is not None:
            verifier.hash_extent = self._native.digest

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
        except BaseException:
            v.abort()
            raise
        return n

    def _read_hashing(self, rel: str, offset: int, length: int, buf, needed: int, deferred: list) -> int | None:
        """The read through the read-and-hash loop, its whole leaves hashed as they land, the rest
        of its bytes (parts of shared leaves, an extent's fills) through `feed`; None when the
        read has no whole leaf to hash or the loop stopped short (then read it the usual way)."""
        v = self.verifier
        leaves = v.whole_leaves(rel, offset, needed)
        if not leaves:
            return None
        t0 = time.perf_counter()
        done = self._reader.read_hashing(rel, offset, length, buf, needed, [(l0 - offset, l1 - offset) for _, _, l0, l1 in leaves],
                                         self._native, readhash.PIECE)
        if done is None:
            return None
        n, digests = done
        if v.record_leaves(rel, leaves, digests, time.perf_counter() - t0) and leaves[0][2] == offset \
                and leaves[-1][3] == offset + needed:
            return n  # the read was its whole leaves: nothing else to hash (the common read)
        v.feed(rel, offset, memoryview(buf)[:needed], deferred)  # whole leaves done: skipped
        v.settle(deferred)
        return n

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        v, deferred = self.verifier, []
        try:
            n = self._reader.read_strided(rel, offset, length, stride, count, buf)
            for k in range(count):  # the segments lie packed in the slot, in file order
                v.feed(rel, offset + k * stride, buf[k * length:(k + 1) * length], deferred)
            v.settle(deferred)
        except BaseException:
            v.abort()
            raise
        return n

    def read_plain(self, rel: str, offset: int, buf) -> None:
        v, deferred = self.verifier, []
        try:
            self._reader.read_plain(rel, offset, buf)
            v.feed(rel, offset, buf, deferred)
            v.settle(deferred)
        except BaseException:
            v.abort()
            raise

    def abort(self) -> None:
        self.verifier.abort()

    def close(self) -> None:
        self.verifier.abort()  # a read still waiting for an earlier one stops waiting
        self._reader.close()

"""The reader of a digest-verified load: a `reader.Reader` whose reads hash the leaves the plan gives
them (`planc.manifest.digestcheck`: `Verifier.take`) on the reader's own thread, and never wait for
another read. A request's whole leaves are hashed as they land in the ring slot, while they are in
the cache, by the read-and-hash loop (`native`: `planc.execute.io.readhash`, one call per request);
without it, from the slot after the read. A leaf the read holds part of is hashed from its bytes in
the slot and the leaf's others read from the file; a fill leaf from the file.

`DigestReader(reader, verifier, native)` forwards everything else to `reader` (the pipeline, the report
and `close` see the reader they always see).
"""

from __future__ import annotations

import time

from ...manifest.digest import leaf_digest
from ...manifest.digestcheck import WHOLE
from . import readhash


class DigestReader:
    def __init__(self, reader, verifier, native=None, simd: str | None = None):
        self._reader, self.verifier = reader, verifier
        self._native = native if native is not None and hasattr(reader, "read_hashing") else None
        verifier.hasher = "native" if self._native is not None else "python"
        self._simd = None
        if self._native is not None:
            verifier.simd = self._simd = self._native.level_name(simd)  # PLANC_DIGEST_HASH

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def read_into(self, rel: str, offset: int, length: int, buf, needed: int) -> int:
        task = self.verifier.take(("r", rel, offset, needed))
        if self._native is not None and task.spans:
            t0 = time.perf_counter()
            done = self._reader.read_hashing(rel, offset, length, buf, needed, list(task.spans), self._native,
                                             readhash.PIECE, self._simd)
            if done is not None:
                n, digests = done
                hashed = sum(b - a for a, b in task.spans)
                self.verifier.count(hashed, time.perf_counter() - t0, hashed)
                self._settle(task, buf, digests)
                return n
        n = self._reader.read_into(rel, offset, length, buf, needed)  # the loop stopped short: this says why
        self._settle(task, buf)
        return n

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        task = self.verifier.take(("s", rel, offset, length, stride, count))
        n = self._reader.read_strided(rel, offset, length, stride, count, buf)
        self._settle(task, buf)
        return n

    def read_plain(self, rel: str, offset: int, buf) -> None:
        task = self.verifier.take(("p", rel, offset, len(buf)))
        self._reader.read_plain(rel, offset, buf)
        self._settle(task, buf)

    def _settle(self, task, buf, digests: list | None = None) -> None:
        """The read's leaves once its bytes are in `buf`: the spans' `digests` (the loop's; else
        hashed here from `buf`) given to their owners and witnesses; an owner's digests of its
        witnesses' ranges; the leaves hashed from the file (fills, parts their owner holds)."""
        v, t0 = self.verifier, time.perf_counter()
        mv = memoryview(buf).cast("B")
        if digests is None:
            digests = [leaf_digest(mv[a:b]) for a, b in task.spans]
            v.count(sum(b - a for a, b in task.spans), time.perf_counter() - t0)
        owned = {}
        for (n, a, b), d in zip(task.refs, digests, strict=True):
            lf = task.leaves[n]
            if lf.owner:
                owned[n] = d
            else:
                v.witness(lf, a, b, d)
        for n, lf in enumerate(task.leaves):
            if not lf.owner:
                continue
            t0 = time.perf_counter()
            if lf.kind == WHOLE:
                (lo, _, at), = lf.own
                checks = {(a, b): leaf_digest(mv[at + a - lo:at + b - lo]) for a, b in lf.checks}
                v.count(sum(b - a for a, b in lf.checks), time.perf_counter() - t0)
                v.record(lf, owned[n], checks)
            else:
                d, checks = v.hash_from_file(lf, buf)
                v.count(lf.hi - lf.lo + sum(b - a for a, b in lf.checks), time.perf_counter() - t0)
                v.record(lf, d, checks)

"""A load checked against a digest file (`planc.manifest.digest`): a plan's reads -> the leaves of
the extents they cover (`read_pieces`, `coverage`); a plan + a `Digest` -> a `Verifier` that
hashes the bytes a load reads where they land.

Each file's fingerprint (size, hash of its head) is checked before anything is allocated. Every
extent that the plan's reads touch is checked; its leaves (`Digest.leaf_bytes`) are of three kinds,
fixed from the plan before the load:

- **whole**: one read covers the leaf entirely. The reader's thread hashes it as its bytes land:
  the reader hands them over a piece at a time (`Verifier.piece_bytes`: the leaf, or 1 MiB when
  the leaf is smaller; a leaf's ends on piece boundaries, its pieces in order), a whole leaf's
  piece hashed at once (`_one_whole_leaf`), a piece of a larger leaf into its streaming state
  (`stream`): no lock, no wait. Almost every leaf of a load.
- **shared**: reads cover parts of it and none all of it (a leaf across two requests, the bytes a
  rank skips, a skipped tensor): a streaming xxh3-128 state and a cursor. A read feeds its part
  when the cursor has reached it; when it has not (an earlier read's part is still to come), the
  read keeps its part (`deferred`: a view of its slot, not a copy) and hashes it after its own
  reading (`settle`), waiting then for the earlier read; that read was submitted before it
  (requests go to the pool in plan order, first in, first out), so it is running or done, and it
  never waits for a later one. Bytes of the leaf no read covers are read from the file when the
  cursor reaches them (`fill_bytes`). A shared leaf whose reads are not submitted in file order (a
  rule that reorders) is hashed after the load by reading it whole (`reread_bytes`).
- **fill**: in a touched extent, no read touches it: the first read of the extent reads it from
  the file (`fill_bytes`).

An extent is compared once its last leaf is hashed; a mismatch fails the read that completed it,
so the load fails and no model is returned. Extents no read touches are not verified: nothing of
them is loaded.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from ..base.codes import Code
from ..base.errors import DigestError, printable, shorten
from .digest import FILL_CHUNK, LEAF_BYTES, Digest, _xxh, extent_hash, leaf_digest

WHOLE, SHARED, FILL = 1, 2, 3  # a leaf's kind (0: not yet known while planning)
MIN_PIECE = 1 << 20  # the reader hands over its bytes a leaf at a time, at least this many
PREFIX_MAX = 1 << 20  # a shared leaf whose last part begins a read at most this far into it is "paired"
PIECE_BYTES = None  # or pieces of this many (a power of two, at most a leaf) streamed into their leaf's
# state (bench/reload.py --piece): 256 KiB - 2 MiB pieces, hashed while in the core's cache, ran at
# 0.10-0.29x of a plain load on the H200, sixteen readers trading the interpreter's lock four times
# a piece (docs/reload.md)


def read_pieces(plan) -> dict:
    """file -> [(lo, hi)] of the bytes the plan's reads deliver, in the order they are submitted."""
    sizes = {f.path: f.size_bytes for f in plan.checkpoint.files}
    out: dict = defaultdict(list)
    for r in plan.runs:
        for q in r.requests:
            if q.stride:
                out[q.file] += [(q.offset + k * q.stride, q.offset + k * q.stride + q.length) for k in range(q.count)]
            else:
                out[q.file].append((q.offset, min(q.offset + q.needed, sizes[q.file])))
        for h in r.host_parts:
            for inp in plan.parts[h.part].inputs:
                out[inp.file] += [(o, o + n) for o, n, _ in inp.segments() if n]
    return out


@dataclass
class _Layout:
    """The leaves of one touched extent: `kinds[j]`, and for each shared leaf its gaps and whether
    its reads come in file order."""

    kinds: bytearray
    shared: dict  # j -> (gaps: [(g0, g1)], ordered: bool, split: int | None, before: [(a, b)], chain: bool)


def _layout(pieces: list, size: int, E: int, L: int) -> dict:
    """extent index -> `_Layout`, for the extents `pieces` touch."""
    out: dict = {}
    partial: dict = defaultdict(list)  # leaf (file-wide index) -> parts of reads in it, in submission order

    def extent(k: int) -> _Layout:
        lay = out.get(k)
        if lay is None:
            lay = out[k] = _Layout(bytearray(math.ceil((min((k + 1) * E, size) - k * E) / L)), {})
        return lay

    per = E // L
    for lo, hi in pieces:
        lo, hi = max(lo, 0), min(hi, size)
        if hi <= lo:
            continue
        for k in range(lo // E, (hi - 1) // E + 1):
            extent(k)
        w0 = -(-lo // L)  # leaves wholly inside [lo, hi): w0 .. w1 - 1
        w1 = hi // L + (1 if hi == size and hi % L and hi // L * L >= lo else 0)
        J = w0
        while J < w1:  # the whole leaves, an extent's run at a time
            k, j = divmod(J, per)
            n = min(per - j, w1 - J)
            out[k].kinds[j:j + n] = bytes([WHOLE]) * n
            J += n
        for J in {lo // L, (hi - 1) // L}:
            if not w0 <= J < w1:
                partial[J].append((max(lo, J * L), min(hi, (J + 1) * L)))
    for J, ps in partial.items():
        k, j = divmod(J, per)
        lay = out[k]
        if lay.kinds[j] == WHOLE:
            continue  # another read covers it whole: that one hashes it
        lay.kinds[j] = SHARED
        l0, l1 = J * L, min((J + 1) * L, size)
        gaps, at = [], l0
        for a, b in sorted(ps):
            if a > at:
                gaps.append((at, a))
            at = max(at, b)
        if at < l1:
            gaps.append((at, l1))
        ordered = all(ps[i][0] <= ps[i + 1][0] for i in range(len(ps) - 1))
        sp = sorted(ps)
        m = sp[-1][0]  # paired: the last part begins a read, ends the leaf, and follows every other part
        paired = (ordered and sp[-1][1] == l1 and l0 < m <= l0 + PREFIX_MAX and all(b <= m for _, b in sp[:-1]))
        # chained: its parts end to end from its first byte to its last, each read's (a read's last
        # part begins the leaf, a read's first ends it, any between is a whole read)
        chain = (not paired and ordered and not gaps and len(sp) > 1
                 and all(sp[i][1] == sp[i + 1][0] for i in range(len(sp) - 1)))
        lay.shared[j] = (gaps, ordered, m if paired else None, [p for p in sp[:-1]] if paired else [], chain)
    for lay in out.values():
        for j, kind in enumerate(lay.kinds):
            if not kind:
                lay.kinds[j] = FILL
    return out


def coverage(plan, extent_bytes: int, leaf_bytes: int | None = None) -> dict:
    """What verifying `plan` against a digest of `extent_bytes` extents (`leaf_bytes` leaves) costs:
    extents hashed in the ring, bytes the verifier reads itself (`fill_bytes`: parts of touched
    extents no read covers; `reread_bytes`: shared leaves whose reads are out of file order;
    `prefix_bytes`: with the read-and-hash loop, the bytes of paired leaves that reads before their
    last part loaded, read again), extents not touched."""
    E = extent_bytes
    L = min(LEAF_BYTES, E) if leaf_bytes is None else leaf_bytes
    pieces = read_pieces(plan)
    touched = fill = reread = prefix = total = 0
    for f in plan.checkpoint.files:
        total += math.ceil(f.size_bytes / E)
        for k, lay in _layout(pieces.get(f.path, []), f.size_bytes, E, L).items():
            touched += 1
            lo = k * E
            for j, kind in enumerate(lay.kinds):
                n = min(lo + (j + 1) * L, f.size_bytes) - (lo + j * L)
                if kind == FILL:
                    fill += n
                elif kind == SHARED:
                    gaps, ordered, split, _, _ = lay.shared[j]
                    if ordered:
                        fill += sum(b - a for a, b in gaps)
                    else:
                        reread += n
                    if split is not None:
                        prefix += split - (lo + j * L) - sum(b - a for a, b in gaps)
    return {"extent_bytes": E, "leaf_bytes": L, "extents": total, "extents_verified": touched,
            "extents_untouched": total - touched, "fill_bytes": fill, "reread_bytes": reread, "prefix_bytes": prefix}


class _Leaf:
    """A shared leaf's streaming state: bytes [lo, hi) of a file, fed in order at `cursor`."""

    __slots__ = ("j", "lo", "hi", "gaps", "reread", "cursor", "hasher", "done", "cond", "split", "before", "begun",
                 "prefix", "loaded", "unmatched", "chain")

    def __init__(self, j: int, lo: int, hi: int, gaps: list, reread: bool, split: int | None = None,
                 before: list = (), chain: bool = False):
        self.j, self.lo, self.hi, self.gaps, self.reread = j, lo, hi, deque(gaps), reread
        self.cursor, self.hasher, self.done = lo, _xxh(), False
        self.cond = threading.Condition()
        # paired (`Verifier.paired`): the read that begins at `split` hashes the leaf, its bytes
        # before `split` read again (`prefix`) and compared with those the reads `before` loaded
        self.split, self.before, self.begun = split, list(before), False
        self.prefix: bytes | None = None
        self.loaded: list = []  # (a, the bytes a read loaded at [a, b)), until compared
        self.unmatched = len(self.before)
        self.chain = chain  # chained: with `Verifier.paired`, `hasher` is the loop's state (the reader's `chain_state`)


class _Extent:
    """One touched extent: its leaves' kinds and digests, how many are still to be hashed."""

    __slots__ = ("index", "lo", "hi", "expect", "kinds", "digests", "done", "left", "shared", "fills", "claimed",
                 "closed", "lock")

    def __init__(self, index: int, lo: int, hi: int, expect: bytes, lay: _Layout, L: int):
        self.index, self.lo, self.hi, self.expect, self.kinds = index, lo, hi, expect, lay.kinds
        n = len(lay.kinds)
        self.digests, self.done, self.left = bytearray(16 * n), bytearray(n), n
        self.shared = {j: _Leaf(j, lo + j * L, min(lo + (j + 1) * L, hi), gaps, not ordered, split, before, chain)
                       for j, (gaps, ordered, split, before, chain) in lay.shared.items()}
        self.fills = [j for j, kind in enumerate(lay.kinds) if kind == FILL]
        self.claimed = self.closed = False
        self.lock = threading.Lock()


class _Stream:
    """One read's pieces: a whole leaf's pieces after its first go into its streaming xxh3-128
    state with the least Python (the readers take it in turn under the interpreter's lock; a
    piece is 512 KiB); the leaf's digest recorded with its last piece. Any other piece goes
    through `Verifier.feed`. A whole leaf whose pieces stopped short is never recorded, so its
    extent is never compared and `finish` fails the load (`[digest-incomplete]`): never silent."""

    __slots__ = ("v", "rel", "deferred", "at", "hi", "h", "st", "j", "hashed", "seconds")

    def __init__(self, v: "Verifier", rel: str, deferred: list):
        self.v, self.rel, self.deferred = v, rel, deferred
        self.at = self.hi = -1
        self.h = self.st = None
        self.j = self.hashed = 0
        self.seconds = 0.0

    def __call__(self, at: int, view) -> None:
        if at == self.at:
            end = at + view.nbytes
            if end <= self.hi:
                t0 = time.perf_counter()
                self.h.update(view)
                self.at = end
                if end == self.hi:
                    self._close()
                self.seconds += time.perf_counter() - t0
                return
        self.v.feed(self.rel, at, view, self.deferred, self)

    def begin(self, st: "_Extent", j: int, l0: int, l1: int, first) -> None:
        h = _xxh()
        h.update(first)
        self.h, self.st, self.j, self.at, self.hi = h, st, j, l0 + first.nbytes, l1

    def _close(self) -> None:
        st, j, n = self.st, self.j, self.hi - self.st.lo - self.j * self.v.digest.leaf_bytes
        d = self.h.digest()
        self.h, self.st, self.at, self.hi = None, None, -1, -1
        self.hashed += n
        self.v._record(self.rel, st, [(j, d)])

    def flush(self) -> None:
        """The read's counters into the verifier's (after its last piece)."""
        if self.hashed or self.seconds:
            self.v._count(self.hashed, self.seconds)
            self.hashed, self.seconds = 0, 0.0


class Verifier:
    """A load's digest check (see the module's docstring). `check_files()` before anything is
    allocated; on the readers' threads `feed(file, offset, bytes, deferred)` as the bytes of a read
    land and `settle(deferred)` after its last byte; `finish()` after the last read; `abort()` when
    the load fails (a read waiting for an earlier one gives up)."""

    WAIT = 0.05  # seconds between checks of `aborted` while waiting for an earlier read

    def __init__(self, plan, digest: Digest):
        self.plan, self.digest = plan, digest
        self.root = plan.checkpoint.root
        self.aborted = False
        self.cause: BaseException | None = None  # the first failure that aborted the load (a mismatch)
        self.hasher = "python"  # or "native": the reader's read-and-hash loop (planc.execute.io.readhash)
        self.simd: str | None = None  # the loop's level for long leaves (readhash.LEVELS), with "native"
        self.read = "pread"  # or "mapped": how the loop gets bytes read through the page cache (PLANC_DIGEST_READ)
        self.hash_extent = extent_hash  # an extent's hash from its leaves' digests (the loop's own, with it)
        self.fill_bytes = self.reread_bytes = self.hashed_bytes = self.prefix_bytes = 0
        # A shared leaf whose last part begins a read ("paired") is hashed by that read, with the
        # bytes before it read again and compared with those the earlier reads loaded: set by a
        # reader that hashes whole reads in machine code (`planc.execute.io.digestread`), before any read
        self.paired = False
        self.verify_seconds = self.wait_seconds = 0.0
        self._thread_stats: dict = {}  # reader thread -> [hashed bytes, seconds, of those bytes hashed in the loop]
        self._lock = threading.Lock()
        self.states: dict = {}
        E, L = digest.extent_bytes, digest.leaf_bytes
        self.piece_bytes = max(MIN_PIECE, L) if PIECE_BYTES is None else min(PIECE_BYTES, L)
        pieces = read_pieces(plan)
        for f in plan.checkpoint.files:
            fd = digest.files.get(f.path)
            if fd is None:
                raise DigestError(f"digest file {printable(digest.path)} has no entry for {printable(f.path)}: it is "
                                  f"the digest of another checkpoint", code=Code.DIGEST_OTHER)
            if fd.size_bytes != f.size_bytes:
                raise DigestError(f"{printable(os.path.join(self.root, f.path))}: {f.size_bytes:,} bytes, the digest file "
                                  f"{printable(digest.path)} says {fd.size_bytes:,}: it is the digest of another "
                                  f"checkpoint (or the file changed)", code=Code.DIGEST_OTHER)
            self.states[f.path] = {k: _Extent(k, k * E, min((k + 1) * E, f.size_bytes), fd.extents[k], lay, L)
                                   for k, lay in _layout(pieces.get(f.path, []), f.size_bytes, E, L).items()}

    def check_files(self) -> None:
        """Each file's head against the digest's (a digest of another checkpoint of the same sizes)."""
        from .digest import _head_hash

        for f in self.plan.checkpoint.files:
            path = os.path.join(self.root, f.path)
            fd = os.open(path, os.O_RDONLY)
            try:
                got = _head_hash(fd, f.size_bytes, self.digest.head_bytes, path)
            finally:
                os.close(fd)
            if got != self.digest.files[f.path].head:
                raise DigestError(f"{printable(path)}: its first {min(f.size_bytes, self.digest.head_bytes):,} bytes "
                                  f"differ from those the digest file {printable(self.digest.path)} records: it is the "
                                  f"digest of another checkpoint", code=Code.DIGEST_OTHER)

    # -- on the readers' threads
    def stream(self, rel: str, deferred: list) -> "_Stream":
        """The sink of one read of `rel`: call it with each piece `(file_offset, view)` as it lands,
        the pieces of a leaf in file order; then `settle(deferred)`."""
        return _Stream(self, rel, deferred)

    def feed(self, rel: str, offset: int, data, deferred: list | None = None, stream: "_Stream | None" = None) -> None:
        """Hash the leaves in `data` (file bytes from `offset`): whole leaves at once (or, through
        `stream`, begun here and continued by the stream's next pieces), parts of shared leaves at
        their cursor. A part whose cursor is behind goes to `deferred` (then `settle` it after the
        read), or is waited for here when `deferred` is None."""
        exts = self.states.get(rel)
        if not exts:
            return
        t0 = time.perf_counter()
        mv = memoryview(data)
        if stream is not None and mv.ndim == 1 and mv.format == "B" and self._one_whole_leaf(rel, exts, offset, mv, t0):
            return
        mv = mv.cast("B")
        digest = leaf_digest
        end = offset + len(mv)
        E, L = self.digest.extent_bytes, self.digest.leaf_bytes
        hashed = 0
        for k in range(offset // E, (end - 1) // E + 1 if end > offset else 0):
            st = exts.get(k)
            if st is None:
                continue
            a, b = max(offset, st.lo), min(end, st.hi)
            got = []
            for j in range((a - st.lo) // L, (b - 1 - st.lo) // L + 1):
                l0 = st.lo + j * L
                l1 = min(l0 + L, st.hi)
                kind = st.kinds[j]
                if kind == WHOLE:
                    if st.done[j] or a > l0:
                        continue  # hashed by another read that covers it whole, or begun by this one's stream
                    if l1 <= b:
                        got.append((j, digest(mv[l0 - offset:l1 - offset])))
                        hashed += l1 - l0
                    elif stream is not None:  # the leaf's first piece: the stream takes the rest
                        stream.begin(st, j, l0, l1, mv[l0 - offset:b - offset])
                elif kind == SHARED:
                    lf = st.shared[j]
                    if self.paired and lf.split is not None:
                        if max(a, l0) < lf.split:  # a part before the last: its bytes kept to compare
                            self.publish(rel, lf, max(a, l0), min(b, l1, lf.split), mv, offset)
                            continue
                        if lf.done:
                            continue  # hashed whole by the loop with its last part
                        self.begin_paired(rel, lf, want=False)  # the last part: the bytes before it first
                    if not lf.reread and not self._feed_shared(rel, st, lf, max(a, l0), min(b, l1), mv, offset,
                                                                wait=deferred is None):
                        deferred.append((rel, st, lf, max(a, l0), min(b, l1), mv, offset))
            if got:
                self._record(rel, st, got)
            if st.fills and not st.claimed:
                self._claim_fills(rel, st)
        self._count(hashed, time.perf_counter() - t0)

    def _one_whole_leaf(self, rel: str, exts: dict, offset: int, mv, t0: float) -> bool:
        """The common piece: exactly one whole leaf, not yet hashed, of an extent with no fills left
        to claim. Hashed and recorded with the least work (the readers take this path in turn under
        the interpreter's lock); False for anything else, which `feed`'s general path takes."""
        E, L = self.digest.extent_bytes, self.digest.leaf_bytes
        st = exts.get(offset // E)
        if st is None or (st.fills and not st.claimed):
            return False
        j, r = divmod(offset - st.lo, L)
        if r or j >= len(st.kinds) or st.kinds[j] != WHOLE or st.done[j]:
            return False
        if offset + mv.nbytes != min(st.lo + (j + 1) * L, st.hi):
            return False
        self._record(rel, st, [(j, leaf_digest(mv))])
        self._count(mv.nbytes, time.perf_counter() - t0)
        return True

    def whole_leaves(self, rel: str, offset: int, needed: int) -> list:
        """The whole leaves inside file bytes [offset, offset + needed) not yet hashed: [(extent,
        leaf index, lo, hi)] in file order, for a reader that hashes them as they land
        (`record_leaves`); `feed` then takes the rest of the read's bytes."""
        exts = self.states.get(rel)
        if not exts:
            return []
        E, L = self.digest.extent_bytes, self.digest.leaf_bytes
        end, out = offset + needed, []
        for k in range(offset // E, (end - 1) // E + 1 if end > offset else 0):
            st = exts.get(k)
            if st is None:
                continue
            for j in range(max(0, -(-(offset - st.lo) // L)), len(st.kinds)):
                l0, l1 = st.lo + j * L, min(st.lo + (j + 1) * L, st.hi)
                if l1 > end:
                    break
                if st.kinds[j] == WHOLE and not st.done[j]:
                    out.append((st, j, l0, l1))
        return out

    def record_leaves(self, rel: str, leaves: list, digests: list, seconds: float = 0.0) -> None:
        """The digests of `whole_leaves`' leaves, hashed by the reader in the read-and-hash loop."""
        by: dict = {}
        for (st, j, l0, l1), d in zip(leaves, digests, strict=True):
            by.setdefault(id(st), (st, []))[1].append((j, d))
        n = sum(l1 - l0 for *_, l0, l1 in leaves)
        self._count(n, seconds, n)
        for st, got in by.values():
            self._record(rel, st, got)

    def _count(self, hashed: int, seconds: float, loop: int = 0) -> None:
        acc = self._thread_stats.get(threading.get_ident())
        if acc is None:  # each reader thread adds to its own counters: no lock taken per piece
            acc = self._thread_stats.setdefault(threading.get_ident(), [0, 0.0, 0])
        acc[0] += hashed
        acc[1] += seconds
        acc[2] += loop

    def settle(self, deferred: list) -> None:
        """The parts `feed` kept: each hashed once the earlier reads of its leaf are."""
        if not deferred:
            return
        t0 = time.perf_counter()
        for rel, st, lf, a, b, mv, offset in deferred:
            self._feed_shared(rel, st, lf, a, b, mv, offset, wait=True)
        deferred.clear()
        with self._lock:
            self.verify_seconds += time.perf_counter() - t0

    def _feed_shared(self, rel: str, st: _Extent, lf: _Leaf, a: int, b: int, mv, offset: int, wait: bool) -> bool:
        """Bytes [a, b) of shared leaf `lf` (in `mv`, file bytes from `offset`) at its cursor; False
        when the cursor is behind `a` and `wait` is False."""
        done = None
        with lf.cond:
            self._fill(rel, lf)
            if lf.cursor < a and not lf.done:
                if not wait:
                    return False
                self._wait_cursor(rel, lf, a)
            if lf.cursor < b and not lf.done:
                lf.hasher.update(mv[lf.cursor - offset:b - offset])
                with self._lock:
                    self.hashed_bytes += b - lf.cursor
                lf.cursor = b
                self._fill(rel, lf)
            lf.cond.notify_all()
            if lf.cursor >= lf.hi and not lf.done:
                lf.done = True
                done = lf.hasher.digest()
        if done is not None:
            self._record(rel, st, [(lf.j, done)])
        return True

    # -- paired leaves
    def paired_head(self, rel: str, offset: int, needed: int):
        """(extent, leaf) of the paired leaf whose last part begins at `offset` and ends inside
        [offset, offset + needed), not yet hashed; else None."""
        exts = self.states.get(rel)
        if not exts or not offset:
            return None
        E, L = self.digest.extent_bytes, self.digest.leaf_bytes
        st = exts.get((offset - 1) // E)
        if st is None:
            return None
        lf = st.shared.get((offset - 1 - st.lo) // L)
        if lf is None or lf.split != offset or lf.hi > offset + needed or lf.done:
            return None
        return st, lf

    def begin_paired(self, rel: str, lf: _Leaf, want: bool = True) -> bytes:
        """The paired leaf's bytes before its last part, read from the file (once), compared with
        those the earlier reads loaded (`publish`) and hashed into its streaming state, whose cursor
        then stands at the last part; returned when `want` (for a reader that hashes the leaf
        itself: read again if they were already compared and let go)."""
        with lf.cond:
            if lf.begun:
                if not want:
                    return b""
                return lf.prefix if lf.prefix is not None else self._read_file(rel, lf.lo, lf.split)
            data = self._read_file(rel, lf.lo, lf.split)
            for a, got in lf.loaded:
                self._compare(rel, lf, a, got, data)
            lf.loaded.clear()
            lf.prefix = data if lf.unmatched else None
            lf.hasher = _xxh()
            lf.hasher.update(data)
            lf.cursor, lf.begun = lf.split, True
            loaded = len(data) - sum(g1 - g0 for g0, g1 in lf.gaps)  # the gaps: bytes no read loads (a header)
            lf.gaps.clear()
            with self._lock:
                self.prefix_bytes += loaded
                self.hashed_bytes += loaded
                self.fill_bytes += len(data) - loaded
            lf.cond.notify_all()
            return data

    def publish(self, rel: str, lf: _Leaf, a: int, b: int, mv, offset: int) -> None:
        """Bytes [a, b) a read loaded of a paired leaf before its last part: compared with the
        bytes its hash was taken of, now or once they are read (`begin_paired`)."""
        got = bytes(mv[a - offset:b - offset])
        with lf.cond:
            if lf.begun:
                self._compare(rel, lf, a, got, lf.prefix)
                if not lf.unmatched:
                    lf.prefix = None
            else:
                lf.loaded.append((a, got))

    def _compare(self, rel: str, lf: _Leaf, a: int, got: bytes, prefix: bytes | None) -> None:
        lf.unmatched -= 1
        if prefix is None or prefix[a - lf.lo:a - lf.lo + len(got)] != got:
            err = DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{a:,}, {a + len(got):,}) read twice "
                              f"during the load (loaded, and again to hash their leaf) differ: the file changed while "
                              f"it was loaded; no model was returned", code=Code.DIGEST_MISMATCH)
            self.abort(err)
            raise err

    def record_paired(self, rel: str, st: _Extent, lf: _Leaf, digest: bytes, seconds: float = 0.0) -> None:
        """The paired leaf's digest, hashed in the read-and-hash loop by the reader of its last part
        (after `begin_paired`)."""
        with lf.cond:
            if lf.done:
                return
            lf.done, lf.cursor = True, lf.hi
            lf.cond.notify_all()
        self._count(lf.hi - lf.split, seconds, lf.hi - lf.split)
        self._record(rel, st, [(lf.j, digest)])

    def _read_file(self, rel: str, lo: int, hi: int) -> bytes:
        return b"".join(self._chunks(rel, lo, hi))

    def _wait_cursor(self, rel: str, lf: _Leaf, a: int) -> None:
        """Under `lf.cond`: wait until the leaf's cursor reaches `a` (an earlier read's part hashed)."""
        t0 = time.perf_counter()
        while lf.cursor < a and not lf.done:
            if self.aborted:
                if isinstance(self.cause, DigestError):
                    raise self.cause  # a mismatch found on another thread: its file and range
                raise DigestError("the load failed elsewhere while this read waited to be hashed",
                                  code=Code.DIGEST_ABORTED)
            lf.cond.wait(self.WAIT)
            self._fill(rel, lf)
        with self._lock:
            self.wait_seconds += time.perf_counter() - t0

    # -- chained leaves
    def chain_leaves(self):
        """Every chained leaf (for a reader that hashes them in the loop: `Verifier.paired`)."""
        for exts in self.states.values():
            for st in exts.values():
                for lf in st.shared.values():
                    if lf.chain:
                        yield lf

    def chained_parts(self, rel: str, offset: int, needed: int) -> tuple:
        """(head, tail) of a read of [offset, offset + needed): head (extent, leaf) the chained leaf
        it begins inside, tail the chained leaf that begins inside it and goes on after it; None
        for either it lacks."""
        exts = self.states.get(rel)
        if not exts or needed <= 0:
            return None, None
        end = offset + needed
        E, L = self.digest.extent_bytes, self.digest.leaf_bytes
        out = []
        for at in (offset, end - 1):
            st = exts.get(at // E)
            lf = st.shared.get((at - st.lo) // L) if st is not None else None
            out.append((st, lf) if lf is not None and lf.chain and not lf.done else None)
        head, tail = out
        if head is not None and head[1].lo >= offset:
            head = None  # begins with the read: the tail, or a whole leaf
        if tail is not None and (tail[1].hi <= end or tail[1].lo < offset):
            tail = None  # ends inside it (a whole leaf), or is the head, held
        return head, tail

    def wait_chain(self, rel: str, lf: _Leaf, at: int) -> None:
        """Until the chained leaf's bytes before `at` are hashed (by the reads before)."""
        with lf.cond:
            if lf.cursor < at:
                self._wait_cursor(rel, lf, at)
            if lf.cursor != at:
                raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{lf.lo:,}, {lf.hi:,}) were "
                                  f"hashed out of order", code=Code.DIGEST_INCOMPLETE)

    def chained(self, rel: str, st: _Extent, lf: _Leaf, upto: int, digest: bytes, seconds: float = 0.0,
                start: int = 0) -> None:
        """The loop hashed the chained leaf's bytes [start, upto) into its state: its cursor moves
        on; `digest` (its last part) is the leaf's."""
        with lf.cond:
            lf.cursor = upto
            if digest:
                lf.done = True
            lf.cond.notify_all()
        self._count(upto - start, seconds, upto - start)
        if digest:
            self._record(rel, st, [(lf.j, digest)])

    def _fill(self, rel: str, lf: _Leaf) -> None:
        """Hash the bytes of a shared leaf no read covers once its cursor reaches them."""
        while lf.gaps and lf.gaps[0][0] <= lf.cursor:
            g0, g1 = lf.gaps.popleft()
            if g1 > lf.cursor:
                n = self._hash_file(rel, lf.hasher, lf.cursor, g1)
                with self._lock:
                    self.fill_bytes += n
                lf.cursor = g1

    def _claim_fills(self, rel: str, st: _Extent) -> None:
        """The leaves of `st` no read touches, read from the file by the first read of the extent."""
        with st.lock:
            if st.claimed:
                return
            st.claimed = True
        L = self.digest.leaf_bytes
        got, n = [], 0
        for j in st.fills:
            h = _xxh()
            n += self._hash_file(rel, h, st.lo + j * L, min(st.lo + (j + 1) * L, st.hi))
            got.append((j, h.digest()))
        with self._lock:
            self.fill_bytes += n
        self._record(rel, st, got)

    def _hash_file(self, rel: str, hasher, lo: int, hi: int) -> int:
        for data in self._chunks(rel, lo, hi):
            hasher.update(data)
        return hi - lo

    def _chunks(self, rel: str, lo: int, hi: int):
        """Bytes [lo, hi) of `rel` read from the file, FILL_CHUNK at a time (a file that ends first: DigestError)."""
        path = os.path.join(self.root, rel)
        fd = os.open(path, os.O_RDONLY)
        try:
            at = lo
            while at < hi:
                data = os.pread(fd, min(FILL_CHUNK, hi - at), at)
                if not data:
                    raise DigestError(f"{printable(path)}: ended at {at:,} bytes while hashing it", code=Code.DIGEST_READ)
                yield data
                at += len(data)
        finally:
            os.close(fd)

    def _record(self, rel: str, st: _Extent, got: list) -> None:
        """Leaf digests of `st`; the extent compared once its last leaf is in."""
        with st.lock:
            for j, d in got:
                if not st.done[j]:  # a leaf two reads cover whole is hashed by the first
                    st.done[j] = 1
                    st.digests[16 * j:16 * j + 16] = d
                    st.left -= 1
            complete = st.left == 0 and not st.closed
            if complete:
                st.closed = True
        if complete and self.hash_extent(bytes(st.digests)) != st.expect:
            err = self.mismatch(rel, st)
            self.abort(err)
            raise err

    def abort(self, cause: BaseException | None = None) -> None:
        """Stop waiting reads; `cause`, the first one given, is what they raise (a mismatch)."""
        if cause is not None and self.cause is None:
            self.cause = cause
        self.aborted = True

    # -- after the last read
    def finish(self) -> dict:
        L = self.digest.leaf_bytes
        for rel, exts in self.states.items():  # paired leaves: each loaded part compared with what was hashed
            for st in exts.values():
                for lf in st.shared.values():
                    if self.paired and lf.split is not None and lf.begun and lf.unmatched:
                        raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{lf.lo:,}, {lf.split:,}) "
                                          f"were hashed but never compared with the bytes loaded",
                                          code=Code.DIGEST_INCOMPLETE)
        for rel, exts in self.states.items():
            for st in exts.values():
                if st.closed:
                    continue
                if st.fills and not st.claimed:
                    self._claim_fills(rel, st)
                for lf in st.shared.values():
                    with lf.cond:
                        if lf.done:
                            continue
                        if lf.reread:
                            lf.hasher = _xxh()
                            n = self._hash_file(rel, lf.hasher, lf.lo, lf.hi)
                            self.reread_bytes += n
                            lf.cursor = lf.hi
                        else:
                            self._fill(rel, lf)
                        if lf.cursor < lf.hi:
                            raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{lf.cursor:,}, "
                                              f"{lf.hi:,}) were never hashed", code=Code.DIGEST_INCOMPLETE)
                        lf.done = True
                        d = lf.hasher.digest()
                    self._record(rel, st, [(lf.j, d)])
                if not st.closed:
                    j = st.done.index(0)
                    raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{st.lo + j * L:,}, "
                                      f"{min(st.lo + (j + 1) * L, st.hi):,}) were never hashed",
                                      code=Code.DIGEST_INCOMPLETE)
        return self.summary()

    def summary(self) -> dict:
        n = sum(len(e) for e in self.states.values())
        per = list(self._thread_stats.values())
        hashed = self.hashed_bytes + sum(a[0] for a in per)
        seconds = self.verify_seconds + sum(a[1] for a in per)
        return {"ok": True, "kind": "digest", "digest_file": self.digest.path, "extent_bytes": self.digest.extent_bytes,
                "leaf_bytes": self.digest.leaf_bytes, "extents": n, "hashed_bytes": hashed, "hasher": self.hasher,
                "simd": self.simd, "read": self.read if self.hasher == "native" else None,
                "loop_bytes": sum(a[2] for a in per),
                "fill_bytes": self.fill_bytes, "reread_bytes": self.reread_bytes, "prefix_bytes": self.prefix_bytes,
                "verify_seconds": round(seconds, 6), "wait_seconds": round(self.wait_seconds, 6)}

    def mismatch(self, rel: str, st: _Extent) -> DigestError:
        path = os.path.join(self.root, rel)
        names = sorted({i.tensor for p in self.plan.parts for i in p.inputs
                        if i.file == rel and i.start < st.hi and i.start + (i.count - 1) * i.stride + (i.seg or i.nbytes) > st.lo})
        listed = ", ".join(shorten(n, 80) for n in names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        return DigestError(f"{printable(path)}: bytes [{st.lo:,}, {st.hi:,}) do not match the digest file "
                           f"{printable(self.digest.path)} (extent {st.index}); tensors in them: {listed or 'none (header)'}; "
                           f"the file is damaged or not the checkpoint the digest was made of; no model was returned",
                           code=Code.DIGEST_MISMATCH)

"""A load checked against a digest file (`planc.manifest.digest`): a plan + a digest's leaf size ->
who hashes each leaf (`assign`, proved by `check_owners`); a plan + a `Digest` -> a `Verifier`
that the readers' threads give each leaf's digest as the load reads it.

Each file's fingerprint (size, hash of its head) is checked before anything is allocated. Every
extent that the plan's reads touch is checked, leaf by leaf (`Digest.leaf_bytes`). Before the load,
each touched leaf gets exactly one **owner** among the reads that touch it, whose digest of the leaf
goes into the extent's hash; every other read that touches it is a **witness**:

- an owner that holds the leaf **whole** hashes it as its bytes land in the slot (the read-and-hash
  loop, `planc.execute.io.digestread`). The scheduler cuts requests on the file's slot grid, so a
  leaf that divides the slot lies inside one request unless an extent (a run, a skipped tensor)
  ends in it: almost every leaf of a load is of this kind, with one reader and no witness.
- an owner that holds **part** of the leaf (no read holds it whole: the one holding most of it)
  reads the whole leaf from the file and hashes it, comparing the bytes it holds with the file's as
  it goes; a leaf no read touches, in a touched extent (a **fill**), is read and hashed by the
  extent's first read.
- a witness digests the ranges of the leaf it holds (in the loop, as they land); its owner digests
  the same ranges of what it hashed (`Leaf.checks`), and the two are compared, whichever comes
  second. Bytes two reads loaded of one leaf are so compared as each read loaded them: the file
  changing between them is a mismatch.

No read waits for another. An extent is compared once its last leaf is in; a mismatch fails the
read that completed it, so the load fails and no model is returned. Extents no read touches are not
verified: nothing of them is loaded.
"""

from __future__ import annotations

import math
import os
import threading
from collections import defaultdict, deque
from typing import NamedTuple

from ..base.codes import Code
from ..base.errors import DigestError, ReadError, printable, shorten
from .digest import LEAF_BYTES, Digest, _xxh, extent_hash

WHOLE, PART, FILL = "whole", "part", "fill"
HASH_CHUNK = 256 << 10  # bytes of a file a reader holds at once to hash a leaf it reads whole: 16 readers, 4 MiB


class Leaf(NamedTuple):
    """A leaf one read hashes: bytes [lo, hi) of `file`, leaf `j` of extent `extent`."""
    file: str
    extent: int
    j: int
    lo: int
    hi: int
    owner: bool  # its digest goes into the extent's hash (else: a witness, compared with the owner)
    kind: str  # WHOLE (the read holds all of it), PART (some), FILL (none)
    own: tuple  # the read's bytes in it: ((file lo, file hi, where they lie in the read's buffer), ...)
    checks: tuple = ()  # an owner's: the witnesses' byte ranges in it, ((lo, hi), ...), digested for them


class Task(NamedTuple):
    """What one read of the plan hashes: its `leaves` in file order, and `spans`, the ranges of its
    buffer hashed as they are (the read-and-hash loop's spans): each a whole leaf, or a witness's
    part of one; `refs[k]` is (index into `leaves`, file lo, file hi) of span k."""
    leaves: tuple
    spans: tuple
    refs: tuple


def plan_reads(plan) -> list:
    """The plan's reads in the order the load submits them: (key, file, ((file lo, file hi, buffer
    at), ...)), `key` what the reader is called with (`Verifier.take`)."""
    sizes = {f.path: f.size_bytes for f in plan.checkpoint.files}
    out = []
    for r in plan.runs:
        for q in r.requests:
            size = sizes[q.file]
            if q.stride:
                own = tuple((o, min(o + q.length, size), k * q.length)
                            for k, o in ((k, q.offset + k * q.stride) for k in range(q.count)))
                out.append((("s", q.file, q.offset, q.length, q.stride, q.count), q.file, own))
            else:
                out.append((("r", q.file, q.offset, q.needed), q.file, ((q.offset, min(q.offset + q.needed, size), 0),)))
        for h in r.host_parts:
            for inp in plan.parts[h.part].inputs:
                for o, n, _ in inp.segments():
                    if n:
                        out.append((("p", inp.file, o, n), inp.file, ((o, o + n, 0),)))
    return out


def assign(plan, extent_bytes: int, leaf_bytes: int) -> tuple[dict, dict]:
    """(tasks: read key -> deque of `Task`, in plan order; extents: (file, index) -> leaves in it)
    for the extents the plan's reads touch. A touched leaf's owner: the first read that holds it
    whole, else the one that holds most of it (the first of those); a fill's: the extent's first read."""
    E, L = extent_bytes, leaf_bytes
    per = E // L
    sizes = {f.path: f.size_bytes for f in plan.checkpoint.files}
    reads = plan_reads(plan)
    touch: dict = defaultdict(dict)  # file -> leaf (file-wide index) -> {read index: its bytes in it}
    for i, (_, rel, own) in enumerate(reads):
        t = touch[rel]
        for a, b, at in own:
            for J in range(a // L, (b - 1) // L + 1 if b > a else a // L):
                lo, hi = J * L, min((J + 1) * L, sizes[rel])
                t.setdefault(J, {}).setdefault(i, []).append((max(a, lo), min(b, hi), at + max(a, lo) - a))
    per_read: dict = defaultdict(list)  # read index -> [Leaf]
    extents: dict = {}
    for rel, t in touch.items():
        size = sizes[rel]
        first: dict = {}  # extent -> its first read
        for J, by in t.items():
            k = J // per
            extents.setdefault((rel, k), math.ceil((min((k + 1) * E, size) - k * E) / L))
            lo, hi = J * L, min((J + 1) * L, size)
            readers = sorted(by)
            first[k] = min(first.get(k, readers[0]), readers[0])
            whole = {i for i in readers if any(a == lo and b == hi for a, b, _ in by[i])}
            owner = min(whole) if whole else max(readers, key=lambda i: (sum(b - a for a, b, _ in by[i]), -i))
            checks = tuple(sorted({(a, b) for i in readers if i != owner for a, b, _ in by[i]} - {(lo, hi)}))
            for i in readers:
                own = tuple(x for x in by[i] if x[0] == lo and x[1] == hi)[:1] if i in whole else tuple(by[i])
                per_read[i].append(Leaf(rel, k, J - k * per, lo, hi, i == owner, WHOLE if i in whole else PART, own,
                                        checks if i == owner else ()))
        for k, i in first.items():
            for j in range(extents[(rel, k)]):
                if k * per + j not in t:
                    lo = (k * per + j) * L
                    per_read[i].append(Leaf(rel, k, j, lo, min(lo + L, size), True, FILL, ()))
    tasks: dict = defaultdict(deque)
    for i, (key, _, _) in enumerate(reads):
        leaves = tuple(sorted(per_read.get(i, ()), key=lambda lf: lf.lo))
        refs = [(n, a, b, at) for n, lf in enumerate(leaves) if lf.kind == WHOLE or (lf.kind == PART and not lf.owner)
                for a, b, at in lf.own]
        tasks[key].append(Task(leaves, tuple((at, at + b - a) for _, a, b, at in refs),
                               tuple((n, a, b) for n, a, b, _ in refs)))
    return dict(tasks), extents


def check_owners(tasks: dict, extents: dict) -> None:
    """Raise DigestError unless every leaf of every touched extent has exactly one owner, every
    leaf a read hashes lies where that read is (a WHOLE leaf's one range all of it, a PART leaf's
    ranges inside it), and each witness's range is one its owner digests."""
    owners: dict = defaultdict(list)
    witnessed: dict = defaultdict(set)
    for queue in tasks.values():
        for task in queue:
            for lf in task.leaves:
                if (lf.file, lf.extent) not in extents or not 0 <= lf.j < extents[(lf.file, lf.extent)]:
                    raise DigestError(f"{_leaf(lf)} is not a leaf of a touched extent", code=Code.DIGEST_INCOMPLETE)
                ranges = [(a, b) for a, b, _ in lf.own]
                if (lf.kind == WHOLE and ranges != [(lf.lo, lf.hi)]) or (
                        lf.kind == PART and not (ranges and all(lf.lo <= a < b <= lf.hi for a, b in ranges))) or (
                        lf.kind == FILL and ranges):
                    raise DigestError(f"{_leaf(lf)}: the bytes a read holds of it are not where its kind says",
                                      code=Code.DIGEST_INCOMPLETE)
                key = (lf.file, lf.extent, lf.j)
                if lf.owner:
                    owners[key].append({(lf.lo, lf.hi), *lf.checks})
                else:
                    witnessed[key].update(ranges)
    for (rel, k), n in extents.items():
        for j in range(n):
            got = owners.get((rel, k, j), [])
            if len(got) != 1:
                raise DigestError(f"{printable(rel)}: leaf {j} of extent {k} has {len(got)} owners, not one: its "
                                  f"digest would be {'missing' if not got else 'taken twice'}",
                                  code=Code.DIGEST_INCOMPLETE)
            if not witnessed.get((rel, k, j), set()) <= got[0]:
                raise DigestError(f"{printable(rel)}: leaf {j} of extent {k}: a witness's bytes its owner does not "
                                  f"digest", code=Code.DIGEST_INCOMPLETE)


def _leaf(lf: Leaf) -> str:
    return f"{printable(lf.file)}: leaf [{lf.lo:,}, {lf.hi:,})"


def coverage(plan, extent_bytes: int, leaf_bytes: int | None = None, assigned: tuple | None = None) -> dict:
    """What verifying `plan` against a digest of `extent_bytes` extents (`leaf_bytes` leaves) costs:
    extents hashed as they stream, leaves more than one read holds (`shared_leaves`: each hashed by
    its owner, its witnesses' bytes compared), bytes the verifier reads from the files itself
    (`fill_bytes`: the leaves of touched extents no read touches, and each leaf whose owner holds
    only part of it, whole), extents not touched. `assigned`: `assign`'s (tasks, extents) of this plan
    and leaf, where a `Verifier` already made them (`Verifier.assigned`, before its load)."""
    E = extent_bytes
    L = min(LEAF_BYTES, E) if leaf_bytes is None else leaf_bytes
    tasks, extents = assigned or assign(plan, E, L)
    fill, shared = 0, set()
    for queue in tasks.values():
        for task in queue:
            for lf in task.leaves:
                if lf.owner and lf.kind in (FILL, PART):
                    fill += lf.hi - lf.lo
                if not lf.owner:
                    shared.add((lf.file, lf.lo))
    total = sum(math.ceil(f.size_bytes / E) for f in plan.checkpoint.files)
    return {"extent_bytes": E, "leaf_bytes": L, "extents": total, "extents_verified": len(extents),
            "extents_untouched": total - len(extents), "shared_leaves": len(shared), "fill_bytes": fill}


def _open(path: str) -> int:
    """A checkpoint file opened for hashing; a file gone or unreadable since the load's checks: ReadError."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ReadError(f"{printable(path)}: cannot open for hashing: {e.strerror}", code=Code.READ_OPEN) from None


class _Extent:
    """One touched extent: its leaves' digests as their owners give them; the digests an owner took
    of its witnesses' ranges, and the witnesses' own, given before their owner's."""

    __slots__ = ("index", "lo", "hi", "expect", "digests", "have", "left", "checks", "pending")

    def __init__(self, index: int, lo: int, hi: int, expect: bytes, n: int):
        self.index, self.lo, self.hi, self.expect = index, lo, hi, expect
        self.digests, self.have, self.left = bytearray(16 * n), bytearray(n), n
        self.checks: dict = {}  # leaf -> {(lo, hi): digest} of its owner's checks
        self.pending: dict = {}  # leaf -> [(lo, hi, digest)] of witnesses given first


class Verifier:
    """A load's digest check (see the module's docstring). `check_files()` before anything is
    allocated; on the readers' threads `take(key)` for each read's `Task`, then `record` for each
    leaf it owns and `witness` for each range of one it does not; `finish()` after the last read."""

    def __init__(self, plan, digest: Digest):
        self.plan, self.digest = plan, digest
        self.root = plan.checkpoint.root
        self.hasher = "python"  # or "native": the reader's read-and-hash loop (planc.execute.io.readhash)
        self.simd: str | None = None  # the loop's level for long leaves (readhash.LEVELS), with "native"
        self._lock = threading.Lock()
        self._stats: dict = {}  # reader thread -> [hashed bytes, seconds, of those hashed in the loop, read from files]
        E, L = digest.extent_bytes, digest.leaf_bytes
        for f in plan.checkpoint.files:
            fd = digest.files.get(f.path)
            if fd is None:
                raise DigestError(f"digest file {printable(digest.path)} has no entry for {printable(f.path)}: it is "
                                  f"the digest of another checkpoint", code=Code.DIGEST_OTHER)
            if fd.size_bytes != f.size_bytes:
                raise DigestError(f"{printable(os.path.join(self.root, f.path))}: {f.size_bytes:,} bytes, the digest file "
                                  f"{printable(digest.path)} says {fd.size_bytes:,}: it is the digest of another "
                                  f"checkpoint (or the file changed)", code=Code.DIGEST_OTHER)
        self.tasks, extents = assign(plan, E, L)
        check_owners(self.tasks, extents)
        sizes = {f.path: f.size_bytes for f in plan.checkpoint.files}
        self.states = {(rel, k): _Extent(k, k * E, min((k + 1) * E, sizes[rel]), digest.files[rel].extents[k], n)
                       for (rel, k), n in extents.items()}

    @property
    def assigned(self) -> tuple:
        """`assign`'s (tasks, extents), for `coverage`: whole only before the load takes tasks."""
        return self.tasks, {k: len(st.have) for k, st in self.states.items()}

    def check_files(self) -> None:
        """Each file's head against the digest's (a digest of another checkpoint of the same sizes)."""
        from .digest import _head_hash

        for f in self.plan.checkpoint.files:
            path = os.path.join(self.root, f.path)
            fd = _open(path)
            try:
                got = _head_hash(fd, f.size_bytes, self.digest.head_bytes, path)
            except OSError as e:
                raise ReadError(f"{printable(path)}: read of its head failed: {e.strerror}", code=Code.READ_FAILED) from None
            finally:
                os.close(fd)
            if got != self.digest.files[f.path].head:
                raise DigestError(f"{printable(path)}: its first {min(f.size_bytes, self.digest.head_bytes):,} bytes "
                                  f"differ from those the digest file {printable(self.digest.path)} records: it is the "
                                  f"digest of another checkpoint", code=Code.DIGEST_OTHER)

    # -- on the readers' threads
    def take(self, key: tuple) -> Task:
        """The task of the read the reader was called for (`plan_reads`' key); identical reads take
        theirs in turn. A read the plan does not hold is an error: nothing would hash its bytes."""
        try:
            return self.tasks[key].popleft()
        except (KeyError, IndexError):
            raise DigestError(f"{printable(os.path.join(self.root, key[1]))}: a read at {key[2]:,} that the plan does "
                              f"not hold (or holds fewer times): its bytes would go unhashed",
                              code=Code.DIGEST_INCOMPLETE) from None

    def hash_from_file(self, lf: Leaf, buf=None) -> tuple[bytes, dict]:
        """(digest, {(lo, hi): digest} of `lf.checks`) of a leaf read from the file (a FILL leaf, or a
        PART leaf its owner holds only part of), the read's bytes in it (`lf.own`, in `buf`)
        compared with the file's as they are hashed: bytes the load holds are the bytes hashed."""
        import numpy as np

        path = os.path.join(self.root, lf.file)
        h, checks = _xxh(), [(a, b, _xxh()) for a, b in lf.checks]  # sorted by their first byte
        held = np.frombuffer(buf, np.uint8) if lf.own else None
        own, k, m = lf.own, 0, 0
        fd = _open(path)
        try:
            for c0 in range(lf.lo, lf.hi, HASH_CHUNK):
                c1 = min(c0 + HASH_CHUNK, lf.hi)
                try:
                    data = os.pread(fd, c1 - c0, c0)
                except OSError as e:
                    raise ReadError(f"{printable(path)}: read of bytes [{c0:,}, {c1:,}) to hash them failed: "
                                    f"{e.strerror}", code=Code.READ_FAILED) from None
                if len(data) != c1 - c0:
                    raise DigestError(f"{printable(path)}: ended at {c0 + len(data):,} bytes while hashing it",
                                      code=Code.DIGEST_READ)
                h.update(data)
                while m < len(checks) and checks[m][1] <= c0:
                    m += 1
                for a, b, ch in checks[m:]:
                    if a >= c1:
                        break
                    if b > c0:
                        ch.update(data[max(a, c0) - c0:min(b, c1) - c0])
                while k < len(own) and own[k][1] <= c0:
                    k += 1
                arr = None
                for a, b, at in own[k:]:
                    if a >= c1:
                        break
                    x0, x1 = max(a, c0), min(b, c1)
                    arr = np.frombuffer(data, np.uint8) if arr is None else arr
                    if not np.array_equal(held[at + x0 - a:at + x1 - a], arr[x0 - c0:x1 - c0]):
                        raise self.changed(lf.file, x0, x1)
        finally:
            os.close(fd)
        self.count(0, 0.0, 0, lf.hi - lf.lo)
        return h.digest(), {(a, b): ch.digest() for a, b, ch in checks}

    def record(self, lf: Leaf, digest: bytes, checks: dict | None = None) -> None:
        """An owner's digest of leaf `lf` into its extent (compared once the extent's last leaf is
        in), with the digests it took of its witnesses' ranges (`lf.checks`)."""
        st, j = self.states[(lf.file, lf.extent)], lf.j
        with self._lock:
            st.digests[16 * j:16 * j + 16] = digest
            st.have[j] = 1
            st.left -= 1
            if checks:
                st.checks[j] = checks
            pending = st.pending.pop(j, ())
            complete = st.left == 0
        for a, b, d in pending:
            self._compare(lf, a, b, d, digest if (a, b) == (lf.lo, lf.hi) else (checks or {}).get((a, b)))
        if complete and extent_hash(bytes(st.digests)) != st.expect:
            raise self.mismatch(lf.file, st)

    def witness(self, lf: Leaf, a: int, b: int, digest: bytes) -> None:
        """A witness's digest of bytes [a, b) of leaf `lf`, compared with its owner's of them, now
        or when the owner's comes."""
        st, j = self.states[(lf.file, lf.extent)], lf.j
        with self._lock:
            if not st.have[j]:
                st.pending.setdefault(j, []).append((a, b, digest))
                return
            want = bytes(st.digests[16 * j:16 * j + 16]) if (a, b) == (lf.lo, lf.hi) else st.checks.get(j, {}).get((a, b))
        self._compare(lf, a, b, digest, want)

    def _compare(self, lf: Leaf, a: int, b: int, got: bytes, want: bytes | None) -> None:
        if got != want:
            raise self.changed(lf.file, a, b)

    def changed(self, rel: str, a: int, b: int) -> DigestError:
        return DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{a:,}, {b:,}) differ between two reads of "
                           f"the load: the file changed while it was loaded; no model was returned",
                           code=Code.DIGEST_MISMATCH)

    def count(self, hashed: int, seconds: float, loop: int = 0, read: int = 0) -> None:
        acc = self._stats.get(threading.get_ident())
        if acc is None:  # each reader thread adds to its own counters: no lock per read
            acc = self._stats.setdefault(threading.get_ident(), [0, 0.0, 0, 0])
        acc[0] += hashed
        acc[1] += seconds
        acc[2] += loop
        acc[3] += read

    # -- after the last read
    def finish(self) -> dict:
        L = self.digest.leaf_bytes
        for (rel, _), st in self.states.items():
            if st.left:
                j = st.have.index(0)
                raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{st.lo + j * L:,}, "
                                  f"{min(st.lo + (j + 1) * L, st.hi):,}) were never hashed", code=Code.DIGEST_INCOMPLETE)
        return self.summary()

    def summary(self) -> dict:
        per = list(self._stats.values())
        return {"ok": True, "kind": "digest", "digest_file": self.digest.path, "extent_bytes": self.digest.extent_bytes,
                "leaf_bytes": self.digest.leaf_bytes, "extents": len(self.states),
                "hashed_bytes": sum(a[0] for a in per), "hasher": self.hasher, "simd": self.simd,
                "loop_bytes": sum(a[2] for a in per), "fill_bytes": sum(a[3] for a in per),
                "verify_seconds": round(sum(a[1] for a in per), 6)}

    def mismatch(self, rel: str, st: _Extent) -> DigestError:
        path = os.path.join(self.root, rel)
        names = sorted({i.tensor for p in self.plan.parts for i in p.inputs
                        if i.file == rel and i.start < st.hi and i.start + (i.count - 1) * i.stride + (i.seg or i.nbytes) > st.lo})
        listed = ", ".join(shorten(n, 80) for n in names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        return DigestError(f"{printable(path)}: bytes [{st.lo:,}, {st.hi:,}) do not match the digest file "
                           f"{printable(self.digest.path)} (extent {st.index}); tensors in them: {listed or 'none (header)'}; "
                           f"the file is damaged or not the checkpoint the digest was made of; no model was returned",
                           code=Code.DIGEST_MISMATCH)

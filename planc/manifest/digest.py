"""Digest files: a checkpoint -> per-extent hashes (`make_digest`, `encode`); a digest file -> a
checked `Digest` (`read_digest`); a plan + a digest -> a `Verifier` that hashes the bytes a load
reads as they pass through the pinned ring.

The file (JSON, written through `planc.base.outputs`):

    {"kind": "planc-digest", "version": 1, "hash": "xxh3-128", "extent_bytes": 16777216,
     "head_bytes": 4096,
     "files": [{"path": "model-00001-of-00004.safetensors", "size_bytes": 3.9e9,
                "head": "<xxh3-128 of the first head_bytes bytes, 32 hex>",
                "extents": ["<xxh3-128 of bytes [k*E, (k+1)*E), 32 hex>", ...],
                "sha256": "<64 hex, the whole file>" | null}],
     "check": "<xxh3-128 of the canonical JSON of every other key, 32 hex>"}

Invariants of a digest that `read_digest` accepts: at most `MAX_FILE_BYTES`; exactly these keys;
paths relative, without `..`, sorted and unique; `ceil(size / extent_bytes)` extents per file;
lowercase hex of the right length; `check` equal to the hash of the rest (an edited or truncated
file is refused: `DigestError`, exit 2).

How a load is verified (`Verifier`): each file's fingerprint (size, hash of its head) is checked
before anything is allocated. Then every extent that the plan's reads touch keeps a streaming
xxh3-128 state and a cursor: a read, on the reader's thread, feeds the bytes of each extent it
covers at the cursor, after waiting for the reads that come before it in the extent (they were
submitted earlier: requests go to the pool in plan order, FIFO, so the one waited for is running
or done). Bytes of a touched extent that no read covers (a skipped tensor, another rank's rows)
are read by the verifier itself, in `FILL_CHUNK` pieces, when the cursor reaches them:
`fill_bytes`, counted in `coverage` and in the report. An extent whose reads are not submitted in
file order (a rule that reorders) is hashed after the load by reading it whole: `reread_bytes`.
Extents no read touches are not verified: nothing of them is loaded. A complete extent is
compared at once; a mismatch fails the read, so the load fails with no model returned.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import DigestError, printable, shorten
from ..base.codes import Code

KIND, VERSION, HASH = "planc-digest", 1, "xxh3-128"
EXTENT_BYTES = 16 << 20
HEAD_BYTES = 4 << 10  # the fingerprint: size + the hash of the first bytes (the header, mostly)
MAX_FILE_BYTES = 64 << 20  # a 4 TB checkpoint at 16 MiB extents is about 9 MB of digest
MIN_EXTENT, MAX_EXTENT = 64 << 10, 1 << 30
FILL_CHUNK = 1 << 20
_HEX32, _HEX64 = re.compile(r"[0-9a-f]{32}\Z"), re.compile(r"[0-9a-f]{64}\Z")
_FILE_KEYS = {"path", "size_bytes", "head", "extents", "sha256"}
_TOP_KEYS = {"kind", "version", "hash", "extent_bytes", "head_bytes", "files", "check"}


def _xxh():
    import xxhash

    return xxhash.xxh3_128()


def _hex(data) -> str:
    import xxhash

    return xxhash.xxh3_128_hexdigest(data)


# -- writing ---------------------------------------------------------------------------------------


def default_path(source: str, root: str) -> Path:
    """Where `planc digest` writes by default and `--verify-digest` looks: beside a single-file
    checkpoint (`x.safetensors.planc-digest.json`), else `planc-digest.json` in its folder."""
    p = Path(source)
    if p.suffix.lower() in (".safetensors", ".gguf") and not p.is_dir():
        return p.with_name(p.name + ".planc-digest.json")
    return Path(root) / "planc-digest.json"


def _file_digest(path: str, size: int, extent: int, head: int, sha: bool) -> dict:
    """One file, read once from start to end in `FILL_CHUNK` pieces."""
    import numpy as np

    buf = np.empty(min(FILL_CHUNK, max(size, 1)), np.uint8)
    extents, whole = [], hashlib.sha256() if sha else None
    h = _xxh()
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        while off < size:
            n = min(len(buf), size - off, extent - off % extent)
            got = os.preadv(fd, [memoryview(buf)[:n]], off)
            if got != n:
                raise DigestError(f"{printable(path)}: ended at {off + got:,} bytes while being digested, "
                                  f"{size:,} expected; was it being written?", code=Code.DIGEST_READ)
            mv = memoryview(buf)[:n]
            h.update(mv)
            if whole is not None:
                whole.update(mv)
            off += n
            if off % extent == 0 or off == size:
                extents.append(h.hexdigest())
                h = _xxh()
        head_hex = _head_hash(fd, size, head, path)
    finally:
        os.close(fd)
    return {"extents": extents, "sha256": whole.hexdigest() if whole is not None else None, "head": head_hex}


def _head_hash(fd: int, size: int, head: int, path: str) -> str:
    n = min(size, head)
    data = os.pread(fd, n, 0)
    if len(data) != n:
        raise DigestError(f"{printable(path)}: ended at {len(data):,} bytes, {size:,} expected", code=Code.DIGEST_READ)
    return _hex(data)


def make_digest(checkpoint, *, extent_bytes: int = EXTENT_BYTES, sha256: bool = False, workers: int = 4) -> dict:
    """The digest document of `checkpoint` (a file, a folder, an index: as `planc inspect` takes),
    each file read once (files in parallel, `workers` at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    from . import read_manifest

    if not (MIN_EXTENT <= extent_bytes <= MAX_EXTENT) or extent_bytes & (extent_bytes - 1):
        raise DigestError(f"extent size must be a power of two from 64 KiB to 1 GiB, got {extent_bytes:,}",
                          code=Code.DIGEST_EXTENT)
    m = read_manifest(checkpoint)
    jobs = [(s.path, os.path.join(m.root, s.path), s.size_bytes) for s in m.shards]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        got = list(pool.map(lambda j: _file_digest(j[1], j[2], extent_bytes, HEAD_BYTES, sha256), jobs))
    files = [{"path": rel, "size_bytes": size, **g} for (rel, _, size), g in zip(jobs, got)]
    doc = {"kind": KIND, "version": VERSION, "hash": HASH, "extent_bytes": extent_bytes, "head_bytes": HEAD_BYTES,
           "files": sorted(files, key=lambda f: f["path"])}
    doc["check"] = _check(doc)
    return doc


def _canonical(doc: dict) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k != "check"}, sort_keys=True,
                      separators=(",", ":")).encode()


def _check(doc: dict) -> str:
    return _hex(_canonical(doc))


def encode(doc: dict) -> bytes:
    """The digest file's bytes: one file entry per line, keys sorted."""
    head = {k: v for k, v in doc.items() if k != "files"}
    lines = [json.dumps(f, sort_keys=True, separators=(",", ":")) for f in doc["files"]]
    body = json.dumps(head, sort_keys=True, separators=(", ", ": "))[:-1]
    return (body + ', "files": [\n' + ",\n".join(lines) + "\n]}\n").encode()


# -- reading (hostile input) -----------------------------------------------------------------------


@dataclass(frozen=True)
class FileDigest:
    path: str
    size_bytes: int
    head: str
    extents: tuple[bytes, ...]  # 16-byte digests
    sha256: str | None


@dataclass(frozen=True)
class Digest:
    path: str  # where it was read from
    extent_bytes: int
    head_bytes: int
    files: dict  # relative path -> FileDigest


def _bad(path, why: str, code: str = Code.DIGEST_FORMAT) -> DigestError:
    return DigestError(f"digest file {printable(str(path))}: {why}; write it again with planc digest", code=code)


def read_digest(path) -> Digest:
    """Read and check a digest file (hostile input: bounded, strictly parsed, self-checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as e:
        raise DigestError(f"digest file {printable(str(path))}: cannot open "
                          f"({getattr(e, 'strerror', None) or e})", code=Code.DIGEST_MISSING) from None
    try:
        st = os.fstat(fd)
        import stat as _stat

        if not _stat.S_ISREG(st.st_mode):
            raise _bad(path, "not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise _bad(path, f"{st.st_size:,} bytes, more than a digest file holds ({MAX_FILE_BYTES:,})",
                       code=Code.DIGEST_TOO_LARGE)
        raw = os.pread(fd, MAX_FILE_BYTES + 1, 0)
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise _bad(path, "larger than a digest file holds", code=Code.DIGEST_TOO_LARGE)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"not valid JSON (truncated or damaged: {shorten(str(e), 80)})") from None
    if not isinstance(doc, dict) or set(doc) != _TOP_KEYS:
        keys = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
        raise _bad(path, f"not a planc digest (keys {printable(str(keys))})")
    if doc["kind"] != KIND or doc["version"] != VERSION or doc["hash"] != HASH:
        raise _bad(path, f"kind/version/hash {printable(str([doc['kind'], doc['version'], doc['hash']]))[:80]}, "
                         f"expected {[KIND, VERSION, HASH]}")
    ext, head = doc["extent_bytes"], doc["head_bytes"]
    if (type(ext) is not int or not MIN_EXTENT <= ext <= MAX_EXTENT or ext & (ext - 1)
            or type(head) is not int or head != HEAD_BYTES):
        raise _bad(path, "extent_bytes or head_bytes out of range")
    if not isinstance(doc["check"], str) or not _HEX32.match(doc["check"]):
        raise _bad(path, "its check is not 32 lowercase hex digits")
    files = doc["files"]
    if not isinstance(files, list):
        raise _bad(path, "files is not a list")
    out, last = {}, None
    for i, f in enumerate(files):
        where = f"files[{i}]"
        if not isinstance(f, dict) or set(f) != _FILE_KEYS:
            raise _bad(path, f"{where} is not a file entry")
        rel, size, exts = f["path"], f["size_bytes"], f["extents"]
        if (not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel
                or any(p in ("", ".", "..") for p in rel.split("/"))):
            raise _bad(path, f"{where}.path {printable(str(rel))[:80]!r} is not a relative path inside the checkpoint")
        if last is not None and rel <= last:
            raise _bad(path, f"{where}.path: files not sorted or repeated")
        last = rel
        if type(size) is not int or size < 0 or size > 1 << 50:
            raise _bad(path, f"{where}.size_bytes is not a file size")
        if not isinstance(exts, list) or len(exts) != math.ceil(size / ext):
            raise _bad(path, f"{where}.extents: {len(exts) if isinstance(exts, list) else '?'} extents, "
                             f"{math.ceil(size / ext)} expected for {size:,} bytes")
        if not all(isinstance(x, str) and _HEX32.match(x) for x in exts) or not (
                isinstance(f["head"], str) and _HEX32.match(f["head"])):
            raise _bad(path, f"{where}: a hash is not 32 lowercase hex digits")
        sha = f["sha256"]
        if sha is not None and not (isinstance(sha, str) and _HEX64.match(sha)):
            raise _bad(path, f"{where}.sha256 is not 64 lowercase hex digits")
        out[rel] = FileDigest(rel, size, f["head"], tuple(bytes.fromhex(x) for x in exts), sha)
    if _check(doc) != doc["check"]:
        raise _bad(path, "its check does not match its contents (edited or damaged)", code=Code.DIGEST_EDITED)
    return Digest(str(path), ext, head, out)


# -- what a plan's reads cover ---------------------------------------------------------------------


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
class _Extent:
    """One extent's streaming state: bytes [lo, hi) of a file, fed in order at `cursor`."""

    index: int
    lo: int
    hi: int
    expect: bytes
    gaps: deque  # (g0, g1) that no read covers, in order: the verifier reads them
    reread: bool
    cursor: int = 0
    hasher: object = None
    done: bool = False

    def __post_init__(self):
        self.cursor = self.lo
        self.hasher = _xxh()
        self.cond = threading.Condition()


def _extents_of(pieces: list, size: int, E: int) -> dict:
    """extent index -> (gaps, in submission order?) for the extents `pieces` touch."""
    per: dict = defaultdict(list)
    for lo, hi in pieces:
        lo, hi = max(lo, 0), min(hi, size)
        for k in range(lo // E, (hi - 1) // E + 1 if hi > lo else lo // E):
            per[k].append((max(lo, k * E), min(hi, (k + 1) * E)))
    out = {}
    for k, ps in per.items():
        e0, e1 = k * E, min((k + 1) * E, size)
        ordered = all(ps[i][0] <= ps[i + 1][0] for i in range(len(ps) - 1))
        gaps, at = deque(), e0
        for lo, hi in sorted(ps):
            if lo > at:
                gaps.append((at, lo))
            at = max(at, hi)
        if at < e1:
            gaps.append((at, e1))
        out[k] = (gaps, ordered)
    return out


def coverage(plan, extent_bytes: int) -> dict:
    """What verifying `plan` against a digest of `extent_bytes` extents costs: extents hashed in the
    ring, bytes the verifier reads itself (`fill_bytes`: parts of touched extents no read covers;
    `reread_bytes`: extents whose reads are out of file order), extents not touched."""
    sizes = {f.path: f.size_bytes for f in plan.checkpoint.files}
    pieces = read_pieces(plan)
    touched = fill = reread = total = 0
    for f in plan.checkpoint.files:
        n = math.ceil(f.size_bytes / extent_bytes)
        total += n
        for k, (gaps, ordered) in _extents_of(pieces.get(f.path, []), sizes[f.path], extent_bytes).items():
            touched += 1
            if ordered:
                fill += sum(b - a for a, b in gaps)
            else:
                reread += min((k + 1) * extent_bytes, f.size_bytes) - k * extent_bytes
    return {"extent_bytes": extent_bytes, "extents": total, "extents_verified": touched,
            "extents_untouched": total - touched, "fill_bytes": fill, "reread_bytes": reread}


# -- verifying a load ------------------------------------------------------------------------------


class Verifier:
    """A load's digest check (see the module's docstring). `check_files()` before anything is
    allocated; `feed(file, offset, bytes)` from the reader after each read; `finish()` after the
    last read; `abort()` when the load fails (a read waiting for an earlier one gives up)."""

    WAIT = 0.05  # seconds between checks of `aborted` while waiting for an earlier read

    def __init__(self, plan, digest: Digest):
        self.plan, self.digest = plan, digest
        self.root = plan.checkpoint.root
        self.aborted = False
        self.fill_bytes = self.reread_bytes = self.hashed_bytes = 0
        self._lock = threading.Lock()
        self.states: dict = {}
        E = digest.extent_bytes
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
            exts = {}
            for k, (gaps, ordered) in _extents_of(pieces.get(f.path, []), f.size_bytes, E).items():
                exts[k] = _Extent(k, k * E, min((k + 1) * E, f.size_bytes), fd.extents[k], gaps, not ordered)
            self.states[f.path] = exts

    def check_files(self) -> None:
        """Each file's head against the digest's (a digest of another checkpoint of the same sizes)."""
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
    def feed(self, rel: str, offset: int, data) -> None:
        exts = self.states.get(rel)
        if not exts:
            return
        mv = memoryview(data).cast("B")
        end = offset + len(mv)
        E = self.digest.extent_bytes
        # Highest extent first: only a read's first extent can wait for an earlier read (the others
        # start at this read's own bytes), so a read feeds what the next read will wait for before
        # it waits itself, and the reads of a file are hashed in parallel, not in a chain.
        for k in reversed(range(offset // E, (end - 1) // E + 1 if end > offset else 0)):
            st = exts.get(k)
            if st is None or st.reread:
                continue
            lo, hi = max(offset, st.lo), min(end, st.hi)
            with st.cond:
                self._fill(rel, st)
                while st.cursor < lo and not st.done:
                    if self.aborted:
                        raise DigestError("the load failed elsewhere while this read waited to be hashed",
                                          code=Code.DIGEST_ABORTED)
                    st.cond.wait(self.WAIT)
                    self._fill(rel, st)
                if st.cursor < hi and not st.done:
                    st.hasher.update(mv[st.cursor - offset:hi - offset])
                    with self._lock:
                        self.hashed_bytes += hi - st.cursor
                    st.cursor = hi
                    self._fill(rel, st)
                st.cond.notify_all()
                if st.cursor >= st.hi and not st.done:
                    self._close(rel, st)

    def _fill(self, rel: str, st: _Extent) -> None:
        """Hash the bytes no read covers once the cursor reaches them (read here, `FILL_CHUNK` at a time)."""
        while st.gaps and st.gaps[0][0] <= st.cursor:
            g0, g1 = st.gaps.popleft()
            if g1 > st.cursor:
                n = self._hash_file(rel, st, st.cursor, g1)
                with self._lock:
                    self.fill_bytes += n
                st.cursor = g1

    def _hash_file(self, rel: str, st: _Extent, lo: int, hi: int) -> int:
        path = os.path.join(self.root, rel)
        fd = os.open(path, os.O_RDONLY)
        try:
            at = lo
            while at < hi:
                data = os.pread(fd, min(FILL_CHUNK, hi - at), at)
                if not data:
                    raise DigestError(f"{printable(path)}: ended at {at:,} bytes while hashing it", code=Code.DIGEST_READ)
                st.hasher.update(data)
                at += len(data)
        finally:
            os.close(fd)
        return hi - lo

    def _close(self, rel: str, st: _Extent) -> None:
        st.done = True
        if st.hasher.digest() != st.expect:
            self.abort()
            raise self.mismatch(rel, st)

    def abort(self) -> None:
        self.aborted = True

    # -- after the last read
    def finish(self) -> dict:
        for rel, exts in self.states.items():
            for st in exts.values():
                with st.cond:
                    if st.done:
                        continue
                    if st.reread:
                        st.hasher = _xxh()
                        n = self._hash_file(rel, st, st.lo, st.hi)
                        self.reread_bytes += n
                        st.cursor = st.hi
                    else:
                        self._fill(rel, st)
                    if st.cursor < st.hi:
                        raise DigestError(f"{printable(os.path.join(self.root, rel))}: bytes [{st.cursor:,}, {st.hi:,}) "
                                          f"were never hashed", code=Code.DIGEST_INCOMPLETE)
                    self._close(rel, st)
        return self.summary()

    def summary(self) -> dict:
        n = sum(len(e) for e in self.states.values())
        return {"ok": True, "kind": "digest", "digest_file": self.digest.path, "extent_bytes": self.digest.extent_bytes,
                "extents": n, "hashed_bytes": self.hashed_bytes, "fill_bytes": self.fill_bytes,
                "reread_bytes": self.reread_bytes}

    def mismatch(self, rel: str, st: _Extent) -> DigestError:
        path = os.path.join(self.root, rel)
        names = sorted({i.tensor for p in self.plan.parts for i in p.inputs
                        if i.file == rel and i.start < st.hi and i.start + (i.count - 1) * i.stride + (i.seg or i.nbytes) > st.lo})
        listed = ", ".join(shorten(n, 80) for n in names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        return DigestError(f"{printable(path)}: bytes [{st.lo:,}, {st.hi:,}) do not match the digest file "
                           f"{printable(self.digest.path)} (extent {st.index}); tensors in them: {listed or 'none (header)'}; "
                           f"the file is damaged or not the checkpoint the digest was made of; no model was returned",
                           code=Code.DIGEST_MISMATCH)

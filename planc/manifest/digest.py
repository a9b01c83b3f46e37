"""Digest files: a checkpoint -> per-extent hashes (`make_digest`, `encode`); a digest file -> a
checked `Digest` (`read_digest`). How a load is checked against one: `planc.manifest.digestcheck`
(`assign`, `Verifier`, `coverage`).

The file (JSON, written through `planc.base.outputs`), version 2:

    {"kind": "planc-digest", "version": 2, "hash": "xxh3-128", "extent_bytes": 16777216,
     "leaf_bytes": 1048576, "head_bytes": 4096,
     "files": [{"path": "model-00001-of-00004.safetensors", "size_bytes": 3.9e9,
                "head": "<xxh3-128 of the first head_bytes bytes, 32 hex>",
                "extents": ["<extent k's hash, 32 hex>", ...],
                "sha256": "<64 hex, the whole file>" | null}],
     "check": "<xxh3-128 of the canonical JSON of every other key, 32 hex>"}

An extent's hash is a two-level tree (`extent_hash`): the extent `[k*E, (k+1)*E)` (the file's
last one shorter) is cut into leaves of `leaf_bytes` from its start (the last one shorter), each
leaf hashed with xxh3-128, and the extent's hash is the xxh3-128 of its leaves' 16-byte digests
one after the other. Leaves are hashed independently, in any order, on any thread: a load hashes
each leaf where it lands, while it is in the cache. Version 1 (the extent's bytes hashed as one
stream) is refused with `[digest-version]`: write the file again with `planc digest`.

Invariants of a digest that `read_digest` accepts: at most `MAX_FILE_BYTES`; exactly these keys;
`extent_bytes` and `leaf_bytes` powers of two, `MIN_LEAF <= leaf_bytes <= extent_bytes`; paths
relative, without `..`, sorted and unique; `ceil(size / extent_bytes)` extents per file; lowercase
hex of the right length; `check` equal to the hash of the rest (an edited or truncated file is
refused: `DigestError`, exit 2).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import DigestError, printable, shorten
from ..base.codes import Code

KIND, VERSION, HASH = "planc-digest", 2, "xxh3-128"
EXTENT_BYTES = 16 << 20
# Leaves of the extent's size by default: the H200 host (16 readers, warm) verified the 15 GiB dense
# checkpoint at 0.26 / 0.43 / 0.59 / 0.74 / 0.75x a plain load with 1 / 2 / 4 / 8 / 16 MiB leaves
# (docs/reload.md): each piece a read hands over costs Python work under the GIL, which sixteen
# readers take in turn; smaller leaves (`planc digest --leaf`) hash bytes while they are in the cache
# but pay that per piece.
LEAF_BYTES = 16 << 20
MIN_LEAF = 64 << 10  # a multiple of the O_DIRECT alignment: a leaf boundary is a place to split a read
HEAD_BYTES = 4 << 10  # the fingerprint: size + the hash of the first bytes (the header, mostly)
MAX_FILE_BYTES = 64 << 20  # a 4 TB checkpoint at 16 MiB extents is about 9 MB of digest
MIN_EXTENT, MAX_EXTENT = 64 << 10, 1 << 30
FILL_CHUNK = 1 << 20
_HEX32, _HEX64 = re.compile(r"[0-9a-f]{32}\Z"), re.compile(r"[0-9a-f]{64}\Z")
_FILE_KEYS = {"path", "size_bytes", "head", "extents", "sha256"}
_TOP_KEYS = {"kind", "version", "hash", "extent_bytes", "leaf_bytes", "head_bytes", "files", "check"}


def _xxh():
    import xxhash

    return xxhash.xxh3_128()


def leaf_digest(data) -> bytes:
    """xxh3-128 of `data` through the streaming object, whose `update` lets other threads run while
    it hashes. (The one-shot `xxhash.xxh3_128_digest` holds the GIL in some python-xxhash releases:
    sixteen readers hashing through it ran one at a time, and a verified load at 0.26x a plain one
    on the H200.)"""
    h = _xxh()
    h.update(data)
    return h.digest()


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


_MARK = re.compile(rb'"kind"\s*:\s*"planc-digest"')


def is_digest_file(path) -> bool:
    """Whether `path` holds a digest file (its first 4 KiB name the kind): the only file `planc
    digest` replaces, so a user's file at its output path is never written over."""
    try:
        with open(path, "rb") as f:
            return bool(_MARK.search(f.read(4096)))
    except OSError:
        return False


def find_default(checkpoint) -> Path:
    """The digest file `--verify-digest` with no FILE reads for a plan's `checkpoint`: `default_path`
    of what the spec names, else the one `planc digest` writes when given the other name (the folder
    for a spec naming its one file, the file for a spec naming the folder), whichever exists."""
    first = default_path(checkpoint.source, checkpoint.root)
    others = [Path(checkpoint.root) / "planc-digest.json"]
    if len(checkpoint.files) == 1:
        others.append(Path(checkpoint.root) / (checkpoint.files[0].path + ".planc-digest.json"))
    for p in [first] + others:
        if os.path.lexists(p):
            return p
    return first


def extent_hash(leaves: bytes) -> bytes:
    """An extent's hash from its leaves' 16-byte xxh3-128 digests, in file order."""
    import xxhash

    return xxhash.xxh3_128_digest(leaves)


def _file_digest(path: str, size: int, extent: int, leaf: int, head: int, sha: bool) -> dict:
    """One file, read once from start to end in pieces of at most `FILL_CHUNK` (and no more than a
    leaf: each piece lies in one leaf)."""
    import numpy as np
    import xxhash

    buf = np.empty(min(FILL_CHUNK, leaf, max(size, 1)), np.uint8)
    extents, whole = [], hashlib.sha256() if sha else None
    leaves, h = bytearray(), _xxh()
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        while off < size:
            n = min(len(buf), size - off, leaf - off % leaf)
            got = os.preadv(fd, [memoryview(buf)[:n]], off)
            if got != n:
                raise DigestError(f"{printable(path)}: ended at {off + got:,} bytes while being digested, "
                                  f"{size:,} expected; was it being written?", code=Code.DIGEST_READ)
            mv = memoryview(buf)[:n]
            h.update(mv)
            if whole is not None:
                whole.update(mv)
            off += n
            if off % leaf == 0 or off == size:
                leaves += h.digest()
                h = _xxh()
            if off % extent == 0 or off == size:
                extents.append(xxhash.xxh3_128_hexdigest(bytes(leaves)))
                leaves = bytearray()
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


def make_digest(checkpoint, *, extent_bytes: int = EXTENT_BYTES, leaf_bytes: int | None = None, sha256: bool = False,
                workers: int = 4) -> dict:
    """The digest document of `checkpoint` (a file, a folder, an index: as `planc inspect` takes),
    each file read once (files in parallel, `workers` at a time). Leaves of `leaf_bytes` (default
    `LEAF_BYTES`, or the extent when it is smaller)."""
    from concurrent.futures import ThreadPoolExecutor

    from . import read_manifest

    if not (MIN_EXTENT <= extent_bytes <= MAX_EXTENT) or extent_bytes & (extent_bytes - 1):
        raise DigestError(f"extent size must be a power of two from 64 KiB to 1 GiB, got {extent_bytes:,}",
                          code=Code.DIGEST_EXTENT)
    leaf = min(LEAF_BYTES, extent_bytes) if leaf_bytes is None else leaf_bytes
    if not (MIN_LEAF <= leaf <= extent_bytes) or leaf & (leaf - 1):
        raise DigestError(f"leaf size must be a power of two from 64 KiB to the extent size ({extent_bytes:,}), "
                          f"got {leaf:,}", code=Code.DIGEST_EXTENT)
    m = read_manifest(checkpoint)
    jobs = [(s.path, os.path.join(m.root, s.path), s.size_bytes) for s in m.shards]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        got = list(pool.map(lambda j: _file_digest(j[1], j[2], extent_bytes, leaf, HEAD_BYTES, sha256), jobs))
    files = [{"path": rel, "size_bytes": size, **g} for (rel, _, size), g in zip(jobs, got)]
    doc = {"kind": KIND, "version": VERSION, "hash": HASH, "extent_bytes": extent_bytes, "leaf_bytes": leaf,
           "head_bytes": HEAD_BYTES,
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
    leaf_bytes: int = LEAF_BYTES


def _bad(path, why: str, code: str = Code.DIGEST_FORMAT) -> DigestError:
    return DigestError(f"digest file {printable(str(path))}: {why}; write it again with planc digest", code=code)


def read_digest(path) -> Digest:
    """Read and check a digest file (hostile input: bounded, strictly parsed, self-checked)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise DigestError(f"digest must be a digest file's path, got {type(path).__name__} "
                          f"{shorten(printable(repr(path)), 40)}", code=Code.DIGEST)
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
    except RecursionError:
        raise _bad(path, "not a planc digest (JSON nested too deeply)") from None
    if isinstance(doc, dict) and doc.get("kind") == KIND and doc.get("version") != VERSION:
        v = doc.get("version")
        raise DigestError(f"digest file {printable(str(path))}: version {printable(str(v))[:20]}, this planc reads version "
                          f"{VERSION} (extent hashes over leaves, hashed as each read lands); "
                          f"write it again with planc digest", code=Code.DIGEST_VERSION)
    if not isinstance(doc, dict) or set(doc) != _TOP_KEYS:
        keys = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
        raise _bad(path, f"not a planc digest (keys {printable(str(keys))})")
    if doc["kind"] != KIND or type(doc["version"]) is not int or doc["hash"] != HASH:
        raise _bad(path, f"kind/version/hash {printable(str([doc['kind'], doc['version'], doc['hash']]))[:80]}, "
                         f"expected {[KIND, VERSION, HASH]}")
    ext, head, leaf = doc["extent_bytes"], doc["head_bytes"], doc["leaf_bytes"]
    if (type(ext) is not int or not MIN_EXTENT <= ext <= MAX_EXTENT or ext & (ext - 1)
            or type(head) is not int or head != HEAD_BYTES):
        raise _bad(path, "extent_bytes or head_bytes out of range")
    if type(leaf) is not int or not MIN_LEAF <= leaf <= ext or leaf & (leaf - 1):
        raise _bad(path, "leaf_bytes is not a power of two from 64 KiB to extent_bytes")
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
    return Digest(str(path), ext, head, out, leaf)

"""Strict GGUF manifest reader (versions 2 and 3): the header only, never the tensor data.

A GGUF file is: magic `GGUF`, a version (uint32), the tensor and key/value counts (uint64), the
key/value metadata, one info per tensor (name, dims, GGML type, offset from the data start), then
padding up to `general.alignment` (32 when absent) and the data. Every count and length is bounded
by the bytes left in the file before anything is allocated for it, so a hostile file cannot make
the reader allocate more than the file holds. The checks (llama.cpp's own, or stricter):

* magic, version 2 or 3 (version 1's 32-bit counts are refused);
* keys and strings UTF-8, no key twice, known value types, no arrays of arrays;
* `general.alignment` a uint32 power of two;
* at most 4 dims per tensor, each at least 1, a known GGML type, the innermost dim a whole number
  of that type's blocks; no tensor name twice;
* offsets that tile the data region exactly as llama.cpp lays it out: each tensor at the end of
  the one before, padded to the alignment (so none overlap and none leave a hole), and the last
  one ending inside the file with nothing after its padding.

GGUF lists dims innermost first (`ne[0]` is the row length); the reader reverses them once, so a
`TensorEntry.shape` is row-major as in safetensors (`blk.0.attn_q.weight` of ne [4096, 4096] and
`token_embd.weight` of ne [4096, 32000] is [32000, 4096]). Plain types take their safetensors
spelling (`F32`, `F16`, `BF16`, `I8`..); quantized types keep GGML's (`Q8_0`, `Q4_K`, ...).

Metadata goes into `ShardInfo.metadata` as (key, text) pairs: scalars and strings as text, arrays
as a summary (`[32000 x string]`), since a vocabulary is megabytes nobody inspects. A split set
(`model-00001-of-00003.gguf`, `split.count` > 1) is read from its first file: every file of the
set must exist, carry the same `split.count` and its own `split.no`.
"""

from __future__ import annotations

import os
import re
import stat
import struct

from planc.base.errors import ManifestError
from planc.manifest.ggml_types import GGML_TYPES
from planc.manifest.model import Manifest, ShardInfo, TensorEntry
from ..base.codes import Code

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
KEY_CAP = 65_535  # bytes of a key (llama.cpp's limit)
NAME_CAP = 64 * 1024  # bytes of a tensor name
_CHUNK = 1 << 20
SUFFIX = ".gguf"

# value type id -> (name, struct format or None for string/array)
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
            4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"),
            10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def is_gguf(path: str) -> bool:
    """Whether `path` names a GGUF file by its suffix (the reader checks the magic)."""
    return path.lower().endswith(SUFFIX)


def read_gguf(path: str) -> Manifest:
    """Read the manifest of a `.gguf` file (or the first file of a split set)."""
    source = os.path.abspath(os.fspath(path))
    root, name = os.path.split(source)
    shard, tensors, meta = _read_file(root, name)
    count = _split_count(source, meta)
    read = [(shard, tensors)]
    named = _SPLIT.match(name)
    if count == 1 and named is not None and int(named["count"]) > 1 and os.path.exists(
            os.path.join(root, f"{named['prefix']}-{2 if int(named['no']) == 1 else 1:05d}-of-{named['count']}.gguf")):
        raise ManifestError(f"{source}: named as file {int(named['no'])} of a split set of {int(named['count'])}, "
                            f"with others of the set beside it, but it has no split.count; reading it alone would "
                            f"load a part of the model", code=Code.GGUF_SPLIT)
    if count > 1:
        m = named
        if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
            raise ManifestError(f"{source}: split.count is {count} but the file is not named "
                                f"<prefix>-00001-of-{count:05d}.gguf", code=Code.GGUF_SPLIT)
        if meta.get("split.no", 0) != 0:
            raise ManifestError(f"{source}: split.no is {meta.get('split.no')!r}, expected 0 for the first file of "
                                f"the set", code=Code.GGUF_SPLIT)
        for no in range(2, count + 1):
            other = f"{m['prefix']}-{no:05d}-of-{count:05d}.gguf"
            if not os.path.exists(os.path.join(root, other)):
                raise ManifestError(f"{source}: split file {other} of {count} is missing", code=Code.GGUF_SPLIT)
            s, ts, om = _read_file(root, other)
            if _split_count(os.path.join(root, other), om) != count or om.get("split.no") != no - 1:
                raise ManifestError(f"{os.path.join(root, other)}: split.count/split.no are "
                                    f"{om.get('split.count')}/{om.get('split.no')}, expected {count}/{no - 1}",
                                    code=Code.GGUF_SPLIT)
            read.append((s, ts))
        seen: dict[str, str] = {}
        for s, ts in read:
            for t in ts:
                first = seen.setdefault(t.name, s.path)
                if first != s.path:
                    raise ManifestError(f"{root}: tensor {t.name!r} is in two split files, {first!r} and {s.path!r}",
                                        code=Code.DUPLICATE_TENSOR)
    return Manifest(root=root, source=source, shards=tuple(s for s, _ in read),
                    tensors=tuple(t for _, ts in read for t in ts), format="gguf")


def _split_count(path: str, meta: dict) -> int:
    count = meta.get("split.count", 1)
    if type(count) is not int or count < 1 or count > 99_999:
        raise ManifestError(f"{path}: split.count is {count!r}, not a count of files", code=Code.GGUF_SPLIT)
    return count


# --------------------------------------------------------------------------- one file


class _Cursor:
    """Positional little-endian reads through a 1 MiB window; every read bounded by the file size."""

    def __init__(self, fd: int, size: int, path: str):
        self.fd, self.size, self.path = fd, size, path
        self.pos = 0
        self._buf, self._at = b"", 0

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise ManifestError(f"{self.path}: {what} needs {n} bytes at offset {self.pos} but the file has "
                                f"{self.size - self.pos} left ({self.size} bytes)", code=Code.GGUF_TRUNCATED)
        lo = self.pos - self._at
        if lo < 0 or lo + n > len(self._buf):
            self._fill(n)
            lo = 0
        self.pos += n
        return self._buf[lo:lo + n]

    def _fill(self, n: int) -> None:
        want = min(max(n, _CHUNK), self.size - self.pos)
        chunks, got = [], 0
        while got < want:
            try:
                chunk = os.pread(self.fd, want - got, self.pos + got)
            except OSError as exc:
                raise ManifestError(f"{self.path}: read failed at offset {self.pos + got} ({exc.strerror})",
                                    code=Code.UNREADABLE) from None
            if not chunk:
                raise ManifestError(f"{self.path}: read {got} of {want} bytes at offset {self.pos}; the file is "
                                    "shorter than stat said", code=Code.SHORT_READ)
            chunks.append(chunk)
            got += len(chunk)
        self._buf, self._at = b"".join(chunks), self.pos

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, cap: int | None = None) -> str:
        n = self.unpack("<Q", f"{what}'s length")
        if cap is not None and n > cap:
            raise ManifestError(f"{self.path}: {what} is {n} bytes long, over the {cap}-byte cap", code=Code.GGUF_BAD_STRING)
        raw = self.take(n, f"{what} ({n} bytes)")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{self.path}: {what} is not UTF-8 (byte {exc.start})", code=Code.GGUF_BAD_STRING) from None


def _read_file(root: str, name: str) -> tuple[ShardInfo, list[TensorEntry], dict]:
    path = os.path.join(root, name)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file", code=Code.MISSING) from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read ({exc.strerror})", code=Code.UNREADABLE) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file", code=Code.NOT_A_FILE)
        cur = _Cursor(fd, st.st_size, path)
        if st.st_size == 0:
            raise ManifestError(f"{path}: file is empty (0 bytes)", code=Code.EMPTY)
        if st.st_size < 24:
            raise ManifestError(f"{path}: file is {st.st_size} bytes, shorter than a GGUF header (24)",
                                code=Code.GGUF_TRUNCATED)
        magic = cur.take(4, "magic")
        if magic != MAGIC:
            raise ManifestError(f"{path}: magic is {magic!r}, not {MAGIC!r}: not a GGUF file", code=Code.GGUF_BAD_MAGIC)
        version = cur.unpack("<I", "version")
        if version not in VERSIONS:
            raise ManifestError(f"{path}: GGUF version {version}; planc reads versions 2 and 3",
                                code=Code.GGUF_BAD_VERSION)
        n_tensors = cur.unpack("<Q", "tensor count")
        n_kv = cur.unpack("<Q", "key/value count")
        # the smallest key/value is 8 + 1 (key) + 4 (type) + 1 (uint8) bytes; a tensor info 8 + 1 + 4 + 8 + 4 + 8
        if n_kv > cur.left() // 14:
            raise ManifestError(f"{path}: {n_kv} key/values cannot fit the {cur.left()} bytes left",
                                code=Code.GGUF_COUNT_PAST_EOF)
        meta, text = _read_kv(cur, n_kv)
        if n_tensors > cur.left() // 33:
            raise ManifestError(f"{path}: {n_tensors} tensor infos cannot fit the {cur.left()} bytes left",
                                code=Code.GGUF_COUNT_PAST_EOF)
        infos = [_read_info(cur, i) for i in range(n_tensors)]
        alignment = _alignment(path, meta)
        data_start = -(-cur.pos // alignment) * alignment
        tensors = _place(path, name, infos, data_start, alignment, st.st_size)
    finally:
        os.close(fd)
    shard = ShardInfo(path=name, size_bytes=st.st_size, mtime_ns=st.st_mtime_ns, header_bytes=data_start,
                      data_start=data_start, metadata=tuple(sorted(text.items())))
    return shard, tensors, meta


def _read_kv(cur: _Cursor, n: int) -> tuple[dict, dict]:
    meta: dict = {}
    text: dict[str, str] = {}
    for i in range(n):
        key = cur.string(f"key {i}", KEY_CAP)
        if key in meta:
            raise ManifestError(f"{cur.path}: metadata key {key!r} appears twice", code=Code.GGUF_DUPLICATE_KEY)
        vtype = cur.unpack("<I", f"type of {key!r}")
        if vtype == _ARRAY:
            etype = cur.unpack("<I", f"element type of {key!r}")
            count = cur.unpack("<Q", f"length of {key!r}")
            if etype == _ARRAY:
                raise ManifestError(f"{cur.path}: metadata {key!r} is an array of arrays; GGUF readers "
                                    "(llama.cpp's included) do not take them", code=Code.GGUF_BAD_VALUE)
            if etype == _STRING:
                if count > cur.left() // 8:
                    raise ManifestError(f"{cur.path}: metadata {key!r}: {count} strings cannot fit the "
                                        f"{cur.left()} bytes left", code=Code.GGUF_COUNT_PAST_EOF)
                first = [cur.string(f"{key!r}[{j}]") for j in range(count)]
                meta[key] = first[:64] if count > 64 else first
                text[key] = f"[{count} x string]"
            elif etype in _SCALARS:
                tname, fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                if count > cur.left() // size:
                    raise ManifestError(f"{cur.path}: metadata {key!r}: {count} x {tname} ({count * size} bytes) "
                                        f"runs past the end of the file ({cur.left()} bytes left)",
                                        code=Code.GGUF_COUNT_PAST_EOF)
                raw = cur.take(count * size, f"{key!r}")
                meta[key] = list(struct.unpack(f"<{count}{fmt[1]}", raw)) if count <= 64 else None
                text[key] = f"[{count} x {tname}]"
            else:
                raise ManifestError(f"{cur.path}: metadata {key!r}: unknown array element type {etype}",
                                    code=Code.GGUF_BAD_VALUE)
        elif vtype == _STRING:
            meta[key] = cur.string(f"value of {key!r}")
            text[key] = meta[key]
        elif vtype in _SCALARS:
            tname, fmt = _SCALARS[vtype]
            v = cur.unpack(fmt, f"value of {key!r}")
            if vtype == 7:
                if v > 1:
                    raise ManifestError(f"{cur.path}: metadata {key!r}: bool byte is {v}, not 0 or 1",
                                        code=Code.GGUF_BAD_VALUE)
                v = bool(v)
            meta[key] = v
            text[key] = str(v)
        else:
            raise ManifestError(f"{cur.path}: metadata {key!r}: unknown value type {vtype}", code=Code.GGUF_BAD_VALUE)
    return meta, text


def _read_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string(f"tensor {i}'s name", NAME_CAP)
    n_dims = cur.unpack("<I", f"tensor {name!r}'s dim count")
    if n_dims < 1 or n_dims > MAX_DIMS:
        raise ManifestError(f"{cur.path}: tensor {name!r} has {n_dims} dims; GGUF takes 1 to {MAX_DIMS}",
                            code=Code.GGUF_BAD_SHAPE)
    ne = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"tensor {name!r}'s dims"))
    ttype = cur.unpack("<I", f"tensor {name!r}'s type")
    offset = cur.unpack("<Q", f"tensor {name!r}'s offset")
    return name, ne, ttype, offset


def _alignment(path: str, meta: dict) -> int:
    a = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(a) is not int or a < 1 or a & (a - 1) or a > 1 << 30:
        raise ManifestError(f"{path}: general.alignment is {a!r}, not a power of two", code=Code.GGUF_BAD_ALIGNMENT)
    return a


def _place(path: str, name: str, infos: list, data_start: int, alignment: int, size: int) -> list[TensorEntry]:
    tensors: list[TensorEntry] = []
    seen: set[str] = set()
    cursor = 0  # data-relative: where the next tensor must begin
    prev = None
    for tname, ne, ttype, offset in infos:
        if tname in seen:
            raise ManifestError(f"{path}: tensor {tname!r} appears twice", code=Code.DUPLICATE_TENSOR)
        seen.add(tname)
        t = GGML_TYPES.get(ttype)
        if t is None:
            raise ManifestError(f"{path}: tensor {tname!r}: unknown GGML type {ttype}", code=Code.UNKNOWN_DTYPE)
        if any(d < 1 for d in ne):
            raise ManifestError(f"{path}: tensor {tname!r}: dims {list(ne)} hold a zero", code=Code.GGUF_BAD_SHAPE)
        if ne[0] % t.block:
            raise ManifestError(f"{path}: tensor {tname!r}: rows of {ne[0]} elements are not whole {t.name} "
                                f"blocks of {t.block}", code=Code.GGUF_BAD_SHAPE)
        numel = 1
        for d in ne:
            numel *= d
            if numel > size * t.block:  # more elements than the file's bytes could hold, at any type
                raise ManifestError(f"{path}: tensor {tname!r}: dims {list(ne)} of {t.name} need more bytes than "
                                    f"the file's {size}", code=Code.GGUF_SIZE_PAST_EOF)
        nbytes = numel // t.block * t.block_bytes
        if offset != cursor:
            after = "the data starts at 0" if prev is None else f"tensor {prev!r} ends (padded) at {cursor}"
            what = "overlap" if offset < cursor else "a hole"
            raise ManifestError(f"{path}: tensor {tname!r} begins at data offset {offset} but {after}: {what} "
                                f"of {abs(cursor - offset)} bytes", code=Code.OVERLAP if offset < cursor else Code.HOLE)
        end = data_start + offset + nbytes
        if end > size:
            raise ManifestError(f"{path}: tensor {tname!r} ({list(ne)} {t.name}, {nbytes} bytes at data offset "
                                f"{offset}) ends at {end}, past the end of the file ({size} bytes)",
                                code=Code.DATA_SHORT)
        tensors.append(TensorEntry(tname, t.name, tuple(reversed(ne)), name, data_start + offset, nbytes))
        cursor = -(-(offset + nbytes) // alignment) * alignment
        prev = tname
    if tensors and data_start + cursor < size:
        raise ManifestError(f"{path}: tensors end (padded) at {data_start + cursor} but the file holds {size} bytes: "
                            f"{size - data_start - cursor} trailing bytes", code=Code.TRAILING_BYTES)
    tensors.sort(key=lambda e: e.start)
    return tensors


def metadata_value(manifest: Manifest, key: str) -> str | None:
    """The text of metadata `key` in the first file of a GGUF manifest, or None."""
    if not manifest.shards:
        return None
    return dict(manifest.shards[0].metadata).get(key)


__all__ = ["read_gguf", "is_gguf", "metadata_value", "MAGIC", "VERSIONS"]

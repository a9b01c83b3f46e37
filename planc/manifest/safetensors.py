"""Strict safetensors manifest reader: headers only, never the data region.

A checkpoint is one `.safetensors` file, a folder of shards, or a Hugging Face
`*.safetensors.index.json`. Every file is opened, its 8-byte prefix and JSON header are read
with positional reads, and the header is checked against the format: entry layout, dtype,
byte size from the shape, and offsets that tile the data region exactly (no hole, no overlap,
no trailing bytes). Data regions are never read, so sparse files of any size inspect quickly.

Every failure is a `ManifestError` with a short `code`; its message names the file, the tensor
when there is one, and the figures that disagree.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import stat
import struct
from operator import itemgetter

import orjson

from planc.base.dtypes import DTYPES
from planc.base.errors import ManifestError, printable
from planc.base.limits import MAX_DIM
from planc.manifest.model import Manifest, ShardInfo, TensorEntry
from ..base.codes import Code

HEADER_CAP = 100_000_000  # the format's limit on the JSON header, in bytes
INDEX_CAP = 100_000_000  # refuse index files larger than this
SHARD_SUFFIX = ".safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
METADATA_KEY = "__metadata__"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_PREFIX = struct.Struct("<Q")
_BITS = {name: d.bits for name, d in DTYPES.items()}
_NAME = itemgetter(0)  # of a TensorEntry
_tuple_new = tuple.__new__  # builds a NamedTuple from a sequence without a Python-level call
_SPAN_ORDER = itemgetter(3, 4, 0)  # (begin, end, name) of an `_entry` tuple


# --------------------------------------------------------------------------- entry point


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read the manifest of a checkpoint: a `.safetensors` file, a folder, or an index json."""
    try:
        source = os.path.abspath(os.fspath(path))
    except (TypeError, ValueError) as exc:
        raise ManifestError(f"{path!r}: not a usable path ({exc})", code=Code.BAD_PATH) from None
    st = _stat(source, missing_code=Code.MISSING)
    if stat.S_ISDIR(st.st_mode):
        return _read_folder(source)
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(f"{source}: not a regular file or folder", code=Code.NOT_A_FILE)
    if source.endswith(".json"):
        return _read_index(source, source)
    root, name = os.path.split(source)
    shard, tensors = _read_shard(root, name)
    return _manifest(root, source, [(shard, tensors)])


# --------------------------------------------------------------------------- folder and index


def _read_folder(folder: str) -> Manifest:
    try:
        names = sorted(e.name for e in os.scandir(folder) if not e.name.startswith("."))
    except OSError as exc:
        raise ManifestError(f"{folder}: cannot list folder ({exc.strerror})", code=Code.UNREADABLE) from None
    indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
    if len(indexes) == 1:
        return _read_index(os.path.join(folder, indexes[0]), folder)
    if len(indexes) > 1:
        raise ManifestError(
            f"{folder}: {len(indexes)} index files ({', '.join(indexes)}); name the one to use",
            code=Code.INDEX_AMBIGUOUS,
        )
    shard_names = [n for n in names if n.endswith(SHARD_SUFFIX)]
    if not shard_names:
        ggufs = [n for n in names if n.lower().endswith(".gguf")]
        hint = (f"; it holds GGUF files ({', '.join(printable(n) for n in ggufs[:3])}{', ...' if len(ggufs) > 3 else ''}): "
                f"name the .gguf file (the first of a split set)" if ggufs else "")
        raise ManifestError(f"{folder}: no *{SHARD_SUFFIX} files in folder{hint}", code=Code.NO_SHARDS)
    read = [_read_shard(folder, n) for n in shard_names]
    _check_unique_names(folder, read)
    return _manifest(folder, folder, read)


def _read_index(index_path: str, source: str) -> Manifest:
    root = os.path.dirname(index_path)
    weight_map = _load_index(index_path)
    if not weight_map:
        raise ManifestError(f"{index_path}: weight_map names no tensors", code=Code.NO_SHARDS)

    # Normalise every shard name once (few distinct names, many tensors), in the order the index
    # first names them, so that the first bad name is the one a tensor-by-tensor pass would meet.
    first = dict(zip(reversed(weight_map.values()), reversed(weight_map)))  # name -> its first tensor
    normalised: dict[str, str] = {}
    for raw in dict.fromkeys(weight_map.values()):
        normalised[raw] = _shard_name(index_path, root, raw, first[raw])
    # tensor -> normalised shard path (the index itself when every name is already normal)
    if all(k == v for k, v in normalised.items()):
        wanted = weight_map
    else:
        wanted = {tensor: normalised[raw] for tensor, raw in weight_map.items()}

    read = []
    for shard in sorted(set(normalised.values())):
        if not _exists(os.path.join(root, shard), index_path, shard):
            raise ManifestError(
                f"{index_path}: shard {shard!r} named by the index does not exist in {root}",
                code=Code.INDEX_MISSING_SHARD,
            )
        read.append(_read_shard(root, shard))
    found = sum(len(tensors) for _, tensors in read)
    # Each shard's tensors all indexed to it, as many as the index names: then every tensor is
    # where the index says and no name is in two shards (one of them would not be its indexed
    # shard). Otherwise the checks below, one tensor at a time, say which tensor is wrong.
    if found == len(wanted) and all(
        list(map(wanted.get, map(_NAME, tensors))).count(shard.path) == len(tensors) for shard, tensors in read
    ):
        return _manifest(root, source, read)
    _check_unique_names(index_path, read)

    for shard, tensors in read:
        for t in tensors:
            target = wanted.get(t.name)
            if target != shard.path:
                where = "is not in the index" if target is None else f"is indexed to {target!r}"
                raise ManifestError(
                    f"{index_path}: tensor {t.name!r} is in shard {shard.path!r} but {where}",
                    code=Code.INDEX_MISMATCH,
                )
    if found != len(wanted):
        present = {t.name for _, tensors in read for t in tensors}
        for tensor, shard in wanted.items():
            if tensor not in present:
                raise ManifestError(
                    f"{index_path}: tensor {tensor!r} is indexed to shard {shard!r} "
                    f"but that shard does not hold it ({len(wanted)} indexed, {found} found)",
                    code=Code.INDEX_TENSOR_MISSING,
                )
    return _manifest(root, source, read)


def _load_index(index_path: str) -> dict[str, str]:
    fd = _open(index_path, missing_code=Code.MISSING)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{index_path}: not a regular file", code=Code.NOT_A_FILE)
        if st.st_size > INDEX_CAP:
            raise ManifestError(
                f"{index_path}: index is {st.st_size} bytes, over the {INDEX_CAP}-byte cap",
                code=Code.INDEX_BAD,
            )
        raw = _read_exact(fd, 0, st.st_size, index_path)
    finally:
        os.close(fd)
    try:
        doc = _load_json(raw, raw.decode("utf-8"))
    except _DuplicateKey as dup:
        raise ManifestError(
            f"{index_path}: key {dup.key!r} appears twice in one object", code=Code.INDEX_DUPLICATE
        ) from None
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{index_path}: index is not UTF-8 (byte {exc.start})", code=Code.INDEX_BAD
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{index_path}: index is not JSON ({_short(exc)})", code=Code.INDEX_BAD) from None
    if not isinstance(doc, dict):
        raise ManifestError(
            f"{index_path}: index is a JSON {type(doc).__name__}, not an object", code=Code.INDEX_BAD
        )
    if "metadata" in doc and not isinstance(doc["metadata"], dict):
        raise ManifestError(f"{index_path}: 'metadata' is not an object", code=Code.INDEX_BAD)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ManifestError(f"{index_path}: 'weight_map' is missing or not an object", code=Code.INDEX_BAD)
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise ManifestError(
                f"{index_path}: tensor {tensor!r} maps to {shard!r}, not a file name", code=Code.INDEX_BAD
            )
    _check_unicode(index_path, raw, [*weight_map, *weight_map.values()], Code.INDEX_BAD)
    return weight_map


def _shard_name(index_path: str, root: str, raw: str, tensor: str) -> str:
    """Normalise one shard name of an index; refuse names that leave the index's folder.

    The judgement is lexical: an absolute name, or one that still climbs with ``..`` once
    normalised, is refused. The named file itself may be a symlink to anywhere (a Hugging Face
    cache snapshot links every shard to ``../../blobs/<sha>``); the file it resolves to is read.
    """
    if not raw or "\x00" in raw:
        raise ManifestError(
            f"{index_path}: tensor {tensor!r} maps to {raw!r}, not a file name", code=Code.INDEX_BAD
        )
    if raw.startswith(("/", "\\")) or os.path.isabs(raw):
        raise ManifestError(
            f"{index_path}: shard {raw!r} (tensor {tensor!r}) is an absolute path", code=Code.PATH_ESCAPE
        )
    # Backslashes count as separators here, so a Windows-style name cannot climb out either.
    if posixpath.normpath(raw.replace("\\", "/")).split("/")[0] == "..":
        raise ManifestError(
            f"{index_path}: shard {raw!r} (tensor {tensor!r}) climbs out of {root} with '..'",
            code=Code.PATH_ESCAPE,
        )
    shard = posixpath.normpath(raw)
    if shard in (".", ""):
        raise ManifestError(
            f"{index_path}: tensor {tensor!r} maps to {raw!r}, not a file name", code=Code.INDEX_BAD
        )
    return shard


def _check_unique_names(where: str, read: list[tuple[ShardInfo, list[TensorEntry]]]) -> None:
    if len({t.name for _, tensors in read for t in tensors}) == sum(len(tensors) for _, tensors in read):
        return  # no name twice; else find the first one repeated, shard by shard
    owner: dict[str, str] = {}
    for shard, tensors in read:
        for t in tensors:
            first = owner.setdefault(t.name, shard.path)
            if first != shard.path:
                raise ManifestError(
                    f"{where}: tensor {t.name!r} is in two shards, {first!r} and {shard.path!r}",
                    code=Code.DUPLICATE_TENSOR,
                )


def _manifest(root: str, source: str, read: list[tuple[ShardInfo, list[TensorEntry]]]) -> Manifest:
    read = sorted(read, key=lambda r: r[0].path)
    shards = tuple(shard for shard, _ in read)
    tensors = tuple(t for _, ts in read for t in ts)
    return Manifest(root=root, source=source, shards=shards, tensors=tensors)


# --------------------------------------------------------------------------- one shard


def _read_shard(root: str, name: str) -> tuple[ShardInfo, list[TensorEntry]]:
    """Read and check one file's header. `name` is relative to `root` (posix separators)."""
    path = os.path.join(root, name)
    fd = _open(path, missing_code=Code.MISSING)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file", code=Code.NOT_A_FILE)
        size = st.st_size
        if size == 0:
            raise ManifestError(f"{path}: file is empty (0 bytes)", code=Code.EMPTY)
        if size < 8:
            raise ManifestError(
                f"{path}: file is {size} bytes, shorter than the 8-byte header length",
                code=Code.SHORT_FILE,
            )
        (header_len,) = _PREFIX.unpack(_read_exact(fd, 0, 8, path))
        if header_len > HEADER_CAP:
            raise ManifestError(
                f"{path}: header length {header_len} exceeds the {HEADER_CAP}-byte cap",
                code=Code.HEADER_TOO_LARGE,
            )
        if 8 + header_len > size:
            raise ManifestError(
                f"{path}: header length {header_len} runs past the end of the file "
                f"(8 + {header_len} = {8 + header_len} > {size} bytes)",
                code=Code.HEADER_PAST_EOF,
            )
        raw = _read_exact(fd, 8, header_len, path)
    finally:
        os.close(fd)

    header = _parse_header(path, raw)
    present = METADATA_KEY in header
    metadata = _metadata(path, header.pop(METADATA_KEY, None), present)
    data_start = 8 + header_len
    data_len = size - data_start
    spans = [_entry(path, tname, value) for tname, value in header.items()]
    spans.sort(key=_SPAN_ORDER)

    tensors: list[TensorEntry] = []
    cursor = 0
    prev = None
    for tname, dt, shape, begin, end in spans:
        if begin != cursor:
            after = "the data starts at 0" if prev is None else f"tensor {prev!r} ends at {cursor}"
            if begin > cursor:
                raise ManifestError(
                    f"{path}: tensor {tname!r} begins at data offset {begin} but {after}: "
                    f"a hole of {begin - cursor} bytes",
                    code=Code.HOLE,
                )
            raise ManifestError(
                f"{path}: tensor {tname!r} begins at data offset {begin} but {after}: "
                f"{cursor - begin} bytes overlap",
                code=Code.OVERLAP,
            )
        tensors.append(_tuple_new(TensorEntry, (tname, dt, shape, name, data_start + begin, end - begin)))
        cursor = end
        prev = tname
    if cursor > data_len:
        raise ManifestError(
            f"{path}: tensors end at data offset {cursor} but the data region holds {data_len} bytes "
            f"(file {size} bytes, header {header_len}): {cursor - data_len} bytes short",
            code=Code.DATA_SHORT,
        )
    if cursor < data_len:
        raise ManifestError(
            f"{path}: tensors end at data offset {cursor} but the data region holds {data_len} bytes "
            f"(file {size} bytes, header {header_len}): {data_len - cursor} trailing bytes",
            code=Code.TRAILING_BYTES,
        )
    shard = ShardInfo(
        path=name,
        size_bytes=size,
        mtime_ns=st.st_mtime_ns,
        header_bytes=header_len,
        data_start=data_start,
        metadata=metadata,
    )
    return shard, tensors


def _parse_header(path: str, raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path}: header is not UTF-8 (bad byte at header offset {exc.start})",
            code=Code.HEADER_NOT_UTF8,
        ) from None
    try:
        header = _load_json(raw, text)
    except _DuplicateKey as dup:
        raise ManifestError(
            f"{path}: header key {dup.key!r} appears twice in one object", code=Code.HEADER_DUPLICATE_KEY
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{path}: header is not JSON ({_short(exc)})", code=Code.HEADER_NOT_JSON) from None
    if not isinstance(header, dict):
        raise ManifestError(
            f"{path}: header is a JSON {_json_kind(header)}, not an object", code=Code.HEADER_NOT_OBJECT
        )
    meta = header.get(METADATA_KEY)
    meta = [*meta, *(v for v in meta.values() if isinstance(v, str))] if isinstance(meta, dict) else []
    _check_unicode(path, raw, [*header, *meta], Code.HEADER_NOT_UTF8)
    return header


def _metadata(path: str, value, present: bool) -> tuple[tuple[str, str], ...]:
    if not present:
        return ()
    if not isinstance(value, dict):
        raise ManifestError(
            f"{path}: {METADATA_KEY} is a JSON {_json_kind(value)}, not an object", code=Code.BAD_METADATA
        )
    for k, v in value.items():
        if not isinstance(v, str):
            raise ManifestError(
                f"{path}: {METADATA_KEY}[{k!r}] is a JSON {_json_kind(v)}, not a string",
                code=Code.BAD_METADATA,
            )
    return tuple(sorted(value.items()))


def _entry(path: str, name: str, value) -> tuple[str, str, tuple[int, ...], int, int]:
    """Check one header entry; return (name, dtype, shape, begin, end) with data-relative offsets.

    Entries that are well formed (all of them, in a checkpoint that reads) pass the short test
    below; anything it does not accept goes to `_checked_entry`, which names what is wrong."""
    if type(value) is dict and len(value) == 3:
        dt, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
        if type(dt) is str and type(shape) is list and type(offsets) is list and len(offsets) == 2:
            bits = _BITS.get(dt)
            begin, end = offsets
            if bits is not None and type(begin) is int and type(end) is int and 0 <= begin <= end:
                cap = (end - begin) * 8  # numel * bits must equal it; a product past it cannot
                numel = 1
                for d in shape:
                    if type(d) is not int or d < 0 or d > MAX_DIM:
                        break
                    numel *= d
                    if numel > cap:
                        break
                else:
                    if numel * bits == cap:
                        return name, dt, tuple(shape), begin, end
    return _checked_entry(path, name, value)


def _checked_entry(path: str, name: str, value) -> tuple[str, str, tuple[int, ...], int, int]:
    """`_entry` for any entry: each check in turn, the first that fails raised with its figures."""
    if type(value) is not dict:
        raise ManifestError(
            f"{path}: tensor {name!r}: entry is a JSON {_json_kind(value)}, not an object",
            code=Code.BAD_ENTRY,
        )
    if value.keys() != _ENTRY_KEYS:
        keys = sorted(value.keys())
        raise ManifestError(
            f"{path}: tensor {name!r}: entry keys are {keys}, expected {sorted(_ENTRY_KEYS)}",
            code=Code.BAD_ENTRY,
        )
    dt = value["dtype"]
    if type(dt) is not str:
        raise ManifestError(
            f"{path}: tensor {name!r}: dtype is a JSON {_json_kind(dt)}, not a string", code=Code.BAD_ENTRY
        )
    spec = DTYPES.get(dt)
    if spec is None:
        raise ManifestError(f"{path}: tensor {name!r}: unknown dtype {dt!r}", code=Code.UNKNOWN_DTYPE)

    shape = value["shape"]
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        raise ManifestError(
            f"{path}: tensor {name!r}: shape {_clip(shape)} is not a list of non-negative integers",
            code=Code.BAD_SHAPE,
        )
    offsets = value["data_offsets"]
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or offsets[0] < 0
        or offsets[1] < 0
    ):
        raise ManifestError(
            f"{path}: tensor {name!r}: data_offsets {_clip(offsets)} is not [begin, end] "
            "with non-negative integers",
            code=Code.BAD_OFFSETS,
        )
    begin, end = offsets
    if begin > end:
        raise ManifestError(
            f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] end before they begin",
            code=Code.BAD_OFFSETS,
        )

    span = end - begin
    if 0 in shape:
        if any(d > MAX_DIM for d in shape):  # a zero-size tensor may claim any dim: none past this is real
            raise ManifestError(
                f"{path}: tensor {name!r}: zero-size shape {_clip(shape)} has a dim past 2**62, which no tensor has",
                code=Code.BAD_SHAPE,
            )
        numel = 0
    else:
        # Stop multiplying once the count is far past what the span can hold: the product of a
        # hostile shape can be astronomically large, and with no zero dim it only grows.
        limit = (span * 8).bit_length() + 64
        numel = 1
        for d in shape:
            numel *= d
            if numel.bit_length() > limit:
                raise ManifestError(
                    f"{path}: tensor {name!r}: shape {_clip(shape)} of {dt} needs more than the "
                    f"{span} bytes of data_offsets [{begin}, {end}]",
                    code=Code.SIZE_MISMATCH,
                )
    nbytes = spec.nbytes(numel)
    if nbytes is None:
        raise ManifestError(
            f"{path}: tensor {name!r}: {_num(numel)} elements of {dt} ({spec.bits} bits each) "
            f"are {_num(numel * spec.bits)} bits, not a whole number of bytes",
            code=Code.PARTIAL_BYTE,
        )
    if nbytes != span:
        raise ManifestError(
            f"{path}: tensor {name!r}: shape {_clip(shape)} of {dt} is {nbytes} bytes but "
            f"data_offsets [{begin}, {end}] span {span}",
            code=Code.SIZE_MISMATCH,
        )
    return name, dt, tuple(shape), begin, end


# --------------------------------------------------------------------------- file access


def _stat(path: str, *, missing_code: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise _os_error(path, exc, missing_code) from None
    except ValueError as exc:
        raise ManifestError(f"{path!r}: not a usable path ({exc})", code=Code.BAD_PATH) from None


def _open(path: str, *, missing_code: str) -> int:
    # O_NONBLOCK: opening a FIFO must not hang; it is refused by the fstat check that follows.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    try:
        return os.open(path, flags)
    except OSError as exc:
        raise _os_error(path, exc, missing_code) from None
    except ValueError as exc:
        raise ManifestError(f"{path!r}: not a usable path ({exc})", code=Code.BAD_PATH) from None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _check_unicode(path: str, raw: bytes, names, code: str) -> None:
    """JSON can escape half of a UTF-16 surrogate pair (`\\ud800`) with no other half: the string that
    comes out is not Unicode text, cannot be encoded to a file name or printed, and the reference
    safetensors parser refuses it. Only names (tensors, shards, metadata) survive the reader, so only
    they are checked, and only when the raw text holds such an escape at all."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ManifestError(f"{path}: name {_clip(name)} holds an unpaired UTF-16 surrogate escape; "
                                "it is not Unicode text", code=code) from None


def _exists(path: str, index_path: str, shard: str) -> bool:
    """False when the file (or a symlink's target) is absent; loops and other errors raise."""
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except OSError as exc:
        raise _os_error(path, exc, Code.INDEX_MISSING_SHARD) from None
    except ValueError as exc:
        raise ManifestError(f"{index_path}: shard {_clip(shard)} is not a usable path ({exc})",
                            code=Code.BAD_PATH) from None


def _os_error(path: str, exc: OSError, missing_code: str) -> ManifestError:
    if exc.errno == errno.ELOOP:
        return ManifestError(f"{path}: symlink loop ({exc.strerror})", code=Code.SYMLINK_LOOP)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        what = "broken symlink" if os.path.islink(path) else "no such file"
        return ManifestError(f"{path}: {what}", code=missing_code)
    return ManifestError(f"{path}: cannot read ({exc.strerror})", code=Code.UNREADABLE)


def _read_exact(fd: int, offset: int, n: int, path: str) -> bytes:
    """Read exactly n bytes at offset; a short read (the file shrank) is an error."""
    chunks = []
    got = 0
    while got < n:
        try:
            chunk = _pread(fd, min(n - got, 1 << 30), offset + got)
        except OSError as exc:
            raise ManifestError(f"{path}: read failed at offset {offset + got} ({exc.strerror})",
                                code=Code.UNREADABLE) from None
        if not chunk:
            raise ManifestError(
                f"{path}: read {got} of {n} bytes at offset {offset}; the file is shorter than stat said",
                code=Code.SHORT_READ,
            )
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


if hasattr(os, "pread"):
    _pread = os.pread
else:  # pragma: no cover - platforms without pread

    def _pread(fd: int, n: int, offset: int) -> bytes:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, n)


# --------------------------------------------------------------------------- JSON helpers


def _load_json(raw: bytes, text: str):
    """`text` (the decoding of `raw`) parsed; `_DuplicateKey` for a key repeated in one object.

    The first parse is orjson's (about twice the standard library's speed on headers); anything it
    refuses (nesting past 1,024, say) or might read differently goes to the standard library's
    parser, whose verdict and message stand.

    Checking every object as it is parsed (`object_pairs_hook`) costs a Python call per tensor, a
    tenth of reading a large checkpoint's headers; most texts are first parsed plainly and counted
    instead (`_keys_unique`). Whatever that cannot vouch for, and any text that does not parse, is
    parsed again object by object, which raises the same error, or first a repeated key before it.
    """
    try:
        # orjson is strict (no NaN or Infinity, valid UTF-8) but reads an integer past 64 bits as a
        # float: a run of 20 digits goes to the exact parser
        if not _long_digits(raw):
            doc = orjson.loads(raw)
            if _keys_unique(raw, doc):
                return doc
    except (ValueError, RecursionError):
        pass
    return json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_refuse_constant)


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # every digit to "0", all else to " "


def _long_digits(raw: bytes) -> bool:
    """Whether `raw` holds a run of 20 digits: an integer that may not fit 64 bits."""
    return b"00000000000000000000" in raw.translate(_DIGITS)


def _keys_unique(raw: bytes, doc) -> bool:
    """True when no object of `doc` repeats a key (a parsed dict keeps only the last of them).

    In JSON a colon outside a string follows a key and every key is followed by one, so the text
    holds at least as many colons as keys; `doc` and the objects that are its values (a header's
    entries, an index's weight_map) hold as many keys as the text less the repeats. Equal counts
    mean no repeat. Any other count (a key deeper down, a colon inside a name) gives False."""
    keys = len(doc) if type(doc) is dict else 0
    if keys:
        keys += sum([len(v) for v in doc.values() if type(v) is dict])
    return keys == raw.count(b":")


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _clip(value, limit: int = 80) -> str:
    text = _safe_repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _safe_repr(value) -> str:
    try:
        if isinstance(value, list) and len(value) > 16:
            return repr(value[:16])[:-1] + ", ...]"
        return repr(value)
    except (ValueError, RecursionError):  # ints past the str-conversion limit, deep nesting
        return f"<{_json_kind(value)}>"


def _num(n: int) -> str:
    try:
        return str(n)
    except ValueError:  # past the interpreter's int-to-str digit limit
        return f"<{n.bit_length()}-bit integer>"


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["HEADER_CAP", "read_manifest"]

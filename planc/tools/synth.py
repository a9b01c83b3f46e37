"""Synthetic safetensors checkpoints for tests, demos and benchmarks.

`write_checkpoint(out_dir, family)` writes a real checkpoint with Hugging Face names and layout:

* ``dense``: Llama-style (embeddings, attention q/k/v/o, gated MLP, norms, ``lm_head``).
* ``moe``: the same attention and norms; the MLP is a router ``mlp.gate`` plus many small experts
  ``mlp.experts.{e}.{gate,up,down}_proj`` (64 by default), so a few-GB model holds > 10,000 tensors.
* ``fp8``: DeepSeek-V3 style block quantization: every linear weight is ``F8_E4M3`` with an ``F32``
  companion ``{name}_scale_inv`` of shape ``[ceil(rows/128), ceil(cols/128)]``; the dequantized
  value of a 128x128 block is ``fp8_value * scale_inv``. Norms, embeddings and ``lm_head`` stay in
  ``dtype`` (BF16 by default).

With neither `size_bytes` nor `layers` the model is tiny (a few hundred KiB, a few dozen tensors,
shapes that are not multiples of 128). `size_bytes` picks a preset of dimensions and the layer count
that lands near it; `layers` alone keeps the tiny dimensions; both together keep the preset and the
layer count and fit the MLP width to the size.

Values come from a seeded ``normal(0, 0.02)`` pool per dtype (a few MB, generated once), read at a
per-tensor rotation, so the bytes are deterministic for a seed and any size streams in bounded
memory. Every shard is written by `write_safetensors`, which writes the bytes the safetensors package
writes for the same tensors (tests/test_synth.py holds the two together), with its metadata keys
sorted, so a file is the same bytes on every run (`METADATA` marks it as synth's: `synth_made`). ``sparse=True``
writes only the headers and extends each file to its full length (the data is a hole that reads as
zeros), so a 300 GB checkpoint takes seconds and no disk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import ml_dtypes
import numpy as np

from planc.base.outputs import partial
from planc.base.dtypes import DTYPES
from planc.base.units import fmt_bytes, parse_bytes

FAMILIES = ("dense", "moe", "fp8")
WEIGHT_DTYPES = ("BF16", "F16", "F32")
FP8_BLOCK = 128
FP8_DTYPE = "F8_E4M3"
SCALE_DTYPE = "F32"
DEFAULT_EXPERTS = 64
TINY_LAYERS = 2
METADATA = {"format": "pt", "writer": "planc synth"}  # the mark of a file synth wrote (`synth_made`)
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
STREAM_THRESHOLD = 64 * 2**20  # shards with more data than this are streamed, not built in memory

_STD = 0.02
_FP8_MAX = 448.0  # largest finite float8_e4m3fn
_POOL_ELEMS = 1_000_003  # elements per random pool (prime, so repeats do not line up with rows)
_SCALE_POOL_ELEMS = 65_537

# safetensors orders a file's data by dtype (this rank, descending), then by name.
_RANK = {
    name: i
    for i, name in enumerate(
        ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
         "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
         "F64", "I64", "U64"]
    )
}


# --------------------------------------------------------------------------- shapes and presets


@dataclass(frozen=True)
class Dims:
    """Model dimensions. For ``moe``, `intermediate` is the per-expert width."""

    hidden: int
    kv: int  # k/v projection rows (hidden / 4)
    intermediate: int
    vocab: int
    experts: int = 0

    def text(self) -> str:
        i = "Ie" if self.experts else "I"
        e = f" E={self.experts}" if self.experts else ""
        return f"H={self.hidden} KV={self.kv} {i}={self.intermediate} V={self.vocab}{e}"


@dataclass(frozen=True)
class _Preset:
    dims: Dims
    min_layers: int  # smallest layer count this preset is used with when sizing by bytes


def _dense(h: int, i: int, v: int, min_layers: int) -> _Preset:
    return _Preset(Dims(h, h // 4, i, v), min_layers)


def _moe(h: int, ie: int, v: int, min_layers: int, experts: int = DEFAULT_EXPERTS) -> _Preset:
    return _Preset(Dims(h, h // 4, ie, v, experts), min_layers)


# Smallest first. A size picks the largest preset that still gets `min_layers` layers, so the
# layer count is at least 8 and rounding it costs at most ~1/16 of the target size.
_PRESETS: dict[str, tuple[_Preset, ...]] = {
    "dense": (
        _dense(64, 160, 256, 1),  # tiny
        _dense(256, 704, 4096, 8),  # ~15 MB and up
        _dense(768, 2112, 16384, 8),  # ~150 MB and up
        _dense(2048, 5632, 32000, 8),  # ~1 GB and up (TinyLlama-like)
        _dense(4096, 14336, 128256, 14),  # ~8 GB and up (Llama-3-8B-like)
        _dense(8192, 28672, 128256, 32),  # ~60 GB and up (Llama-3-70B-like)
    ),
    "moe": (
        _moe(64, 32, 256, 1, experts=8),  # tiny
        _moe(256, 64, 4096, 8),  # ~55 MB and up
        _moe(512, 64, 32000, 8),  # ~180 MB and up; 199 tensors per layer
        _moe(1024, 128, 32000, 48),  # ~2.8 GB and up
        _moe(2048, 768, 151936, 24),  # ~16 GB and up (Qwen3-MoE-like)
        _moe(4096, 1536, 151936, 32),  # ~80 GB and up
    ),
}
_PRESETS["fp8"] = _PRESETS["dense"]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write. `kind` names the random pool its values come from."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str  # "weight", "fp8" or "scale"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Layout:
    """A model's tensors in natural order (embeddings, layer by layer, final norm, head)."""

    family: str
    dims: Dims
    layers: int
    dtype: str
    tensors: tuple[TensorSpec, ...]

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))


def _linear(name: str, rows: int, cols: int, family: str, dtype: str) -> list[TensorSpec]:
    if family != "fp8":
        return [TensorSpec(name, dtype, (rows, cols), "weight")]
    return [
        TensorSpec(name, FP8_DTYPE, (rows, cols), "fp8"),
        TensorSpec(f"{name}_scale_inv", SCALE_DTYPE, _scale_shape(rows, cols), "scale"),
    ]


def _layer(family: str, d: Dims, layer: int, dtype: str) -> list[TensorSpec]:
    p = f"model.layers.{layer}"
    h, kv, i = d.hidden, d.kv, d.intermediate
    out = [TensorSpec(f"{p}.input_layernorm.weight", dtype, (h,), "weight")]
    for proj, rows in (("q", h), ("k", kv), ("v", kv), ("o", h)):
        out += _linear(f"{p}.self_attn.{proj}_proj.weight", rows, h, family, dtype)
    out.append(TensorSpec(f"{p}.post_attention_layernorm.weight", dtype, (h,), "weight"))
    if family == "moe":
        out.append(TensorSpec(f"{p}.mlp.gate.weight", dtype, (d.experts, h), "weight"))
        for e in range(d.experts):
            q = f"{p}.mlp.experts.{e}"
            out.append(TensorSpec(f"{q}.gate_proj.weight", dtype, (i, h), "weight"))
            out.append(TensorSpec(f"{q}.up_proj.weight", dtype, (i, h), "weight"))
            out.append(TensorSpec(f"{q}.down_proj.weight", dtype, (h, i), "weight"))
    else:
        out += _linear(f"{p}.mlp.gate_proj.weight", i, h, family, dtype)
        out += _linear(f"{p}.mlp.up_proj.weight", i, h, family, dtype)
        out += _linear(f"{p}.mlp.down_proj.weight", h, i, family, dtype)
    return out


def _layer_bytes(family: str, d: Dims, dtype: str) -> int:
    return sum(t.nbytes for t in _layer(family, d, 0, dtype))


def _fixed_bytes(d: Dims, dtype: str) -> int:
    return (2 * d.vocab * d.hidden + d.hidden) * DTYPES[dtype].itemsize


def _model_bytes(family: str, d: Dims, layers: int, dtype: str) -> int:
    return _fixed_bytes(d, dtype) + layers * _layer_bytes(family, d, dtype)


def _with_experts(d: Dims, experts: int | None) -> Dims:
    if experts is None or not d.experts:
        return d
    return Dims(d.hidden, d.kv, d.intermediate, d.vocab, experts)


def _fit_intermediate(family: str, d: Dims, layers: int, dtype: str, size: int) -> Dims:
    """The multiple of 16 for the MLP width whose model size is closest to `size`."""

    def total(k: int) -> int:
        return _model_bytes(family, Dims(d.hidden, d.kv, 16 * k, d.vocab, d.experts), layers, dtype)

    lo, hi = 1, max(1, 64 * d.intermediate // 16)
    while lo < hi:  # smallest k with total(k) >= size
        mid = (lo + hi) // 2
        if total(mid) >= size:
            hi = mid
        else:
            lo = mid + 1
    k = lo if lo == 1 or abs(total(lo) - size) <= abs(total(lo - 1) - size) else lo - 1
    return Dims(d.hidden, d.kv, 16 * k, d.vocab, d.experts)


def _choose(family: str, size: int | None, layers: int | None, dtype: str,
            experts: int | None) -> tuple[Dims, int]:
    presets = [_Preset(_with_experts(p.dims, experts), p.min_layers) for p in _PRESETS[family]]
    if size is None:
        return presets[0].dims, layers if layers is not None else TINY_LAYERS
    if layers is None:
        chosen = presets[0]
        for p in presets:
            if _model_bytes(family, p.dims, p.min_layers, dtype) <= size:
                chosen = p
        d = chosen.dims
        n = round((size - _fixed_bytes(d, dtype)) / _layer_bytes(family, d, dtype))
        return d, max(1, n)
    # Both given: among the presets that can get down to `size` (narrowest MLP), the one whose
    # natural size at `layers` is nearest; then the MLP width is fitted.
    def narrowest(d: Dims) -> int:
        return _model_bytes(family, Dims(d.hidden, d.kv, 16, d.vocab, d.experts), layers, dtype)

    fits = [p for p in presets if narrowest(p.dims) <= size] or presets[:1]
    best = min(fits,
               key=lambda p: abs(math.log(_model_bytes(family, p.dims, layers, dtype) / size)))
    return _fit_intermediate(family, best.dims, layers, dtype, size), layers


def layout(family: str, *, size_bytes: int | None = None, layers: int | None = None,
           dtype: str = "BF16", experts: int | None = None) -> Layout:
    """The tensors `write_checkpoint` would write, without writing anything."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {dtype!r}")
    if size_bytes is not None and size_bytes <= 0:
        raise ValueError(f"size_bytes must be positive, got {size_bytes!r}")
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers!r}")
    if experts is not None and (family != "moe" or experts < 1):
        raise ValueError("experts is a positive count, and only for the moe family")
    d, n = _choose(family, size_bytes, layers, dtype, experts)
    tensors = [TensorSpec("model.embed_tokens.weight", dtype, (d.vocab, d.hidden), "weight")]
    for layer in range(n):
        tensors += _layer(family, d, layer, dtype)
    tensors.append(TensorSpec("model.norm.weight", dtype, (d.hidden,), "weight"))
    tensors.append(TensorSpec("lm_head.weight", dtype, (d.vocab, d.hidden), "weight"))
    return Layout(family, d, n, dtype, tuple(tensors))


# --------------------------------------------------------------------------- random data


@lru_cache(maxsize=16)
def _pool(seed: int, kind: str, dtype: str) -> bytes:
    """Two copies of one seeded block of finite values, so any rotation is one contiguous slice."""
    salt = hashlib.blake2b(f"{kind}:{dtype}".encode(), digest_size=8).digest()
    rng = np.random.default_rng([seed, int.from_bytes(salt, "little")])
    if kind == "scale":
        # Dequantization multipliers: the amax of a 128x128 block of N(0, 0.02) over 448.
        x = (4 * _STD / _FP8_MAX) * np.exp(0.25 * rng.standard_normal(_SCALE_POOL_ELEMS))
        arr = x.astype(np.float32)
    elif kind == "fp8":
        # Block-quantized N(0, 0.02): the block amax (~4 sigma) maps to 448.
        x = rng.standard_normal(_POOL_ELEMS, dtype=np.float32) * np.float32(_FP8_MAX / 4)
        arr = np.clip(x, -_FP8_MAX, _FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    else:
        x = rng.standard_normal(_POOL_ELEMS, dtype=np.float32) * np.float32(_STD)
        arr = x.astype(DTYPES[dtype].numpy)
    assert np.isfinite(arr.astype(np.float32)).all()
    raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    return raw + raw


def _offset(seed: int, name: str, period: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % period


def _chunks(spec: TensorSpec, seed: int) -> Iterator[memoryview]:
    """The tensor's bytes: its pool read from a per-tensor element offset, repeated as needed."""
    pool = memoryview(_pool(seed, spec.kind, spec.dtype))
    isz = DTYPES[spec.dtype].itemsize
    period = len(pool) // 2
    start = _offset(seed, spec.name, period // isz) * isz
    block = pool[start:start + period]
    full, rest = divmod(spec.nbytes, period)
    for _ in range(full):
        yield block
    if rest:
        yield block[:rest]


def tensor_data(spec: TensorSpec, seed: int = 0) -> np.ndarray:
    """The values `write_checkpoint` writes for `spec`, as an array (builds it in memory)."""
    raw = b"".join(_chunks(spec, seed))
    return np.frombuffer(raw, dtype=DTYPES[spec.dtype].numpy).reshape(spec.shape)


# --------------------------------------------------------------------------- safetensors writer

Source = np.ndarray | bytes | bytearray | memoryview | Iterable | None


def _header(entries: Sequence[tuple[str, str, tuple[int, ...], int]],
            metadata: Mapping[str, str] | None) -> tuple[bytes, list[int]]:
    """The padded JSON header and the order (indices into `entries`) the data is laid out in."""
    order = sorted(range(len(entries)), key=lambda i: (-_RANK[entries[i][1]], entries[i][0]))
    head: dict = {}
    if metadata is not None:
        head["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    pos = 0
    for i in order:
        name, dt, shape, nbytes = entries[i]
        if name in head:
            raise ValueError(f"tensor name {name!r} appears twice")
        head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    raw = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
    return raw + b" " * (-len(raw) % 8), order


def _buffers(source: Source) -> Iterator:
    if isinstance(source, np.ndarray):
        arr = np.ascontiguousarray(source)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        yield memoryview(arr.reshape(-1).view(np.uint8))
    elif isinstance(source, (bytes, bytearray, memoryview)):
        yield source
    else:
        yield from source


def _file_mode() -> int:
    """The mode `open()` gives a new file: 0666 less the umask (0644 under the usual 022)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_safetensors(path: str | os.PathLike,
                      tensors: Iterable[tuple[str, str, Sequence[int], Source]],
                      metadata: Mapping[str, str] | None = None, *, sparse: bool = False) -> int:
    """Write a safetensors file tensor by tensor; returns the file size.

    Each item is ``(name, dtype, shape, source)`` with `dtype` in safetensors spelling and `source`
    an array, a bytes-like object, or an iterable of bytes-like chunks (read once, in file order).
    The file has exactly the bytes ``safetensors.numpy.save_file`` writes for the same tensors
    (metadata keys are written sorted; safetensors writes several of them in hash order).
    With `sparse` the sources are not read and the data region is left as a hole.
    """
    items = list(tensors)
    entries = []
    for name, dt, shape, _ in items:
        shape = tuple(int(s) for s in shape)
        nbytes = DTYPES[dt].nbytes(math.prod(shape))
        if nbytes is None:
            raise ValueError(f"tensor {name!r}: {dt} {list(shape)} is not a whole number of bytes")
        entries.append((name, dt, shape, nbytes))
    header, order = _header(entries, metadata)
    size = 8 + len(header) + sum(e[3] for e in entries)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        if sparse:
            f.truncate(size)
            return size
        for i in order:
            name, _, _, nbytes = entries[i]
            written = 0
            for buf in _buffers(items[i][3]):
                mv = memoryview(buf).cast("B")
                f.write(mv)
                written += mv.nbytes
            if written != nbytes:
                raise ValueError(f"tensor {name!r}: got {written} bytes of data, expected {nbytes}")
    return size


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class SynthResult:
    path: str  # the index json when sharded, else the single safetensors file
    files: tuple[str, ...]  # the safetensors files, in shard order
    tensors: int
    total_bytes: int  # sum of the files' sizes (headers included)
    family: str = ""
    dtype: str = ""
    layers: int = 0
    dims: Dims | None = None
    data_bytes: int = 0  # tensor bytes only: the index's total_size
    sparse: bool = False


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def split_balanced(sizes: Sequence[int], parts: int) -> list[int]:
    """Cut points for `parts` contiguous, non-empty groups whose byte totals are near equal.

    Returns the start index of each group. Each cut falls at the tensor boundary nearest to its
    ideal byte position, so every group is within one tensor's size of total / parts.
    """
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} tensors into {parts} shards")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    total = prefix[-1]
    starts = [0]
    for k in range(1, parts):
        target = total * k / parts
        lo, hi = starts[-1] + 1, n - (parts - k)  # keep every group non-empty
        j = min(max(_nearest(prefix, target), lo), hi)
        starts.append(j)
    return starts


def _nearest(prefix: Sequence[int], target: float) -> int:
    lo, hi = 0, len(prefix) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if prefix[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    if lo > 0 and target - prefix[lo - 1] <= prefix[lo] - target:
        return lo - 1
    return lo


def synth_made(path: Path) -> bool:
    """Whether `path` is a regular file that `write_checkpoint` wrote: a safetensors file whose header
    metadata is `METADATA`, or an index whose metadata carries its writer. Only the header is read
    (at most 1 MiB); anything else (another program's checkpoint, a link, a device) is not ours."""
    import stat

    try:
        if path.is_symlink() or not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            if path.name.endswith(".json"):
                data = f.read(1 << 20)
                doc = json.loads(data)
                return isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and \
                    doc["metadata"].get("writer") == METADATA["writer"]
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 1 << 20:
                return False
            head = json.loads(f.read(n))
        return isinstance(head, dict) and head.get("__metadata__") == METADATA
    except (OSError, ValueError, RecursionError):
        return False


def refuse_overwrite(folder: Path, names) -> None:
    """ValueError when a file `write_checkpoint` would write into `folder` already exists and is not
    one it wrote before (`synth_made`): someone's checkpoint is never replaced."""
    for name in sorted(names):
        p = folder / name
        if os.path.lexists(p) and not synth_made(p):
            raise ValueError(f"{p} already exists and was not written by planc synth; planc never replaces it: "
                             "use an empty folder (or --force to replace it)")


def refuse_other_checkpoint(folder: Path, ours: set[str]) -> None:
    """ValueError when `folder` holds checkpoint files (shards, an index) other than `ours`: a reader
    of the folder would take them for part of the checkpoint written there."""
    stale = sorted(p.name for p in folder.iterdir()
                   if p.name not in ours and (p.name.endswith(".safetensors")
                                              or p.name.endswith(".safetensors.index.json")))
    if stale:
        raise ValueError(f"{folder} already holds other checkpoint files ({', '.join(stale[:3])}); "
                         "use an empty folder")


def write_checkpoint(out_dir: str | os.PathLike, family: str, *, size_bytes: int | None = None,
                     layers: int | None = None, shards: int = 1, sparse: bool = False,
                     seed: int = 0, dtype: str = "BF16", experts: int | None = None,
                     stream: bool | None = None, force: bool = False) -> SynthResult:
    """Write a synthetic checkpoint into `out_dir` (created if missing).

    A file of the checkpoint that already exists is replaced only when synth wrote it (`synth_made`),
    or with `force`; otherwise ValueError before anything is written.

    `stream` forces (True) or forbids (False) the streamed writer; by default shards over
    `STREAM_THRESHOLD` bytes stream and smaller ones are built in memory; the same writer writes both.
    Both give identical bytes.
    """
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards!r}")
    lay = layout(family, size_bytes=size_bytes, layers=layers, dtype=dtype, experts=experts)
    specs = lay.tensors
    starts = split_balanced([t.nbytes for t in specs], shards) + [len(specs)]
    names = [SINGLE_NAME] if shards == 1 else [shard_name(i + 1, shards) for i in range(shards)]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refuse_other_checkpoint(out, set(names) | ({INDEX_NAME} if shards > 1 else set()))
    if not force:
        refuse_overwrite(out, set(names) | ({INDEX_NAME} if shards > 1 else set()))

    files, total, weight_map = [], 0, {}
    for k, fname in enumerate(names):
        group = specs[starts[k]:starts[k + 1]]
        final = out / fname
        data = sum(t.nbytes for t in group)
        use_stream = stream if stream is not None else data > STREAM_THRESHOLD
        with partial(final) as tmp:  # a failed write leaves no partial file
            if sparse or use_stream:
                write_safetensors(tmp, ((t.name, t.dtype, t.shape, _chunks(t, seed)) for t in group),
                                  METADATA, sparse=sparse)
            else:
                # The arrays built in memory, written by the same writer: its header is the same bytes on
                # every run (safetensors writes two metadata keys in hash order).
                write_safetensors(tmp, ((t.name, t.dtype, t.shape, tensor_data(t, seed)) for t in group),
                                  METADATA)
            os.chmod(tmp, _file_mode())  # the safetensors writer makes 0600 files whatever the umask
        files.append(str(final))
        total += final.stat().st_size
        weight_map.update({t.name: fname for t in group})

    if shards > 1:
        index = {"metadata": {"total_size": lay.data_bytes, "writer": METADATA["writer"]}, "weight_map": weight_map}
        path = out / INDEX_NAME
        path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    else:
        path = out / SINGLE_NAME
    return SynthResult(str(path), tuple(files), len(specs), total, family, dtype, lay.layers,
                       lay.dims, lay.data_bytes, sparse)


def describe(result: SynthResult) -> str:
    """A short human summary of a written checkpoint."""
    n = len(result.files)
    lines = [
        f"{result.family or 'synthetic'} checkpoint at {result.path}",
        f"  {result.tensors} tensors in {n} file{'s' if n != 1 else ''}, "
        f"{fmt_bytes(result.total_bytes)} ({result.total_bytes} bytes)"
        + (", sparse" if result.sparse else ""),
    ]
    if result.dims is not None:
        quant = f", linear weights {FP8_DTYPE} with 128x128 F32 scales" if result.family == "fp8" else ""
        lines.append(f"  {result.dtype}{quant}, {result.layers} layers, {result.dims.text()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planc.tools.synth",
                                 description="Write a synthetic safetensors checkpoint.")
    ap.add_argument("out_dir")
    ap.add_argument("--family", choices=FAMILIES, default="dense")
    ap.add_argument("--size", type=parse_bytes, default=None, help="target size, e.g. 1GiB")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=WEIGHT_DTYPES, default="BF16")
    ap.add_argument("--experts", type=int, default=None)
    a = ap.parse_args(argv)
    res = write_checkpoint(a.out_dir, a.family, size_bytes=a.size, layers=a.layers,
                           shards=a.shards, sparse=a.sparse, seed=a.seed, dtype=a.dtype,
                           experts=a.experts)
    print(describe(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

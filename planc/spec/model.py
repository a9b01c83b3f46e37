"""Placement spec: YAML or JSON text -> validated, frozen `Spec` (pydantic v2).

Errors name the spec file, the field path (`rules[2].dtype`) and, for YAML, the line.
Relative `checkpoint` paths resolve against the spec's folder.

A rule's `match` is a glob on tensor names (`*`, `?`, `[abc]`) that may also hold named
placeholders: `{L}` matches one dotted name component (`[^.]+`) and captures it, so that
`fuse`/`stack` can name the tensor they build (`into`) and the placeholder they group over (`over`).
"""

from __future__ import annotations

import errno
import fnmatch
import math
import numbers
import os
import re
import stat
import string
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError,
                      WithJsonSchema,
                      field_validator, model_validator)

from ..plan.costs import MAP_LANES, MAP_WINDOW
from ..base.device import DIRECT_ALIGN, check_device  # noqa: F401 - the spec's names for them
from ..base.device import brief as _brief
from ..base.dtypes import DTYPES
from ..base.errors import SpecError
from .parse import parse_json, parse_yaml
from ..base.limits import (
    MAX_BLOCK,
    MAX_MAP_LANES,
    MAX_MAP_WINDOW,
    MAX_SLOT,
    MAX_SLOTS,
    MAX_TP,
    MAX_WORKERS,
    MIN_MAP_WINDOW,
)
from ..base.units import MAX_BYTES, parse_bytes
from ..base.codes import Code

# The JSON Schema says what the validators take: a byte size as an integer or as text (`64MiB`), a
# yes/no as a boolean, 0 or 1, or one of the words pydantic reads as one.
_BYTES_TEXT = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT]([iI]?[bB])?|[bB])?\s*$"
ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_BYTES}, {"type": "string", "pattern": _BYTES_TEXT}],
     "$comment": "text: a whole number of bytes, at most 2**62 (1.5KiB is 1536; 1.5 or 5000000TiB is refused)"})]
# yes, no, on, off, true, false, y, n, t, f, 1, 0, in any case (JSON Schema patterns have no flags)
_YES_NO = r"^([yY]([eE][sS])?|[nN][oO]?|[oO]([nN]|[fF][fF])|[tT]([rR][uU][eE])?|[fF]([aA][lL][sS][eE])?|1|0)$"
YesNo = Annotated[bool, WithJsonSchema(
    {"anyOf": [{"type": "boolean"}, {"enum": [0, 1]}, {"type": "string", "pattern": _YES_NO}]})]
Target = Literal["keep", "float16", "bfloat16", "float32"]
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _value_name(value):
    """Placeholder values are text; `order: [7, 6, 5]` (expert indices written as numbers) means '7', '6', '5'."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value >= 0 else value
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _bytes_or_auto(value):
    return "auto" if isinstance(value, str) and value.strip().lower() == "auto" else parse_bytes(value)


DeviceBytes = Annotated[int | Literal["auto"], BeforeValidator(_bytes_or_auto), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_BYTES}, {"type": "string", "pattern": _BYTES_TEXT},
               {"const": "auto"}],
     "$comment": "a byte size, or auto: the named device's capacity where the compiling host has it"})]


class Budget(_Model):
    host: ByteSize
    """Host bytes planc may hold at once: pinned ring + read-ahead + host scratch (required)."""
    device: DeviceBytes | None = None
    """Device bytes planc may hold: resident tensors + landing buffers. `auto`: the named device's capacity,
    read from the CUDA driver of the compiling host (not checked where that host has no such device).
    Unset: not checked at compile (explain says so)."""
    node_host: ByteSize | None = None
    """Host bytes the ranks of one node may hold together, at their peaks (tensor parallel; unset: not checked)."""


class IO(_Model):
    workers: StrictInt = Field(16, ge=1, le=MAX_WORKERS)
    """Reader threads issuing reads concurrently."""
    slot: ByteSize = 16 * 2**20
    """Bytes of one pinned ring slot; one read request fills at most one slot. A multiple of 4 KiB."""
    slots: StrictInt = Field(16, ge=1, le=MAX_SLOTS)
    """Slots in the pinned staging ring (ring bytes = slots x slot)."""
    run: ByteSize = 1024 * 2**20
    """Largest bytes read by one run; bounds the landing regions and the reads in flight."""
    direct: Literal["auto", "on", "off"] = "auto"
    """O_DIRECT reads: `auto` uses them where the file system accepts them, `on` requires them, `off` never."""
    merge_gap: ByteSize = 2**20
    """Neighbouring reads in one file whose gap is at most this many bytes become one request."""
    strided: Literal["auto", "mapped", "rows"] = "auto"
    """How a tensor-parallel slice of a later dim is read: `mapped` (only its segments, through a mapping of
    the page cache), `rows` (whole rows, then a 2-D copy of the slice), or `auto` (the cheaper by the cost model)."""
    map_window: ByteSize = Field(MAP_WINDOW, ge=MIN_MAP_WINDOW, le=MAX_MAP_WINDOW)
    """File bytes a mapped strided read maps at a time (4 KiB to 1 GiB); its pages count in the host peak.
    Larger windows read faster (32 MiB: 1.3-1.5x of 8 MiB for a TP rank), and hold more host memory."""
    map_lanes: StrictInt = Field(MAP_LANES, ge=1, le=MAX_MAP_LANES)
    """Mapped windows at once, whatever the workers; the host peak counts the largest this many."""

    @field_validator("run")
    @classmethod
    def _run_positive(cls, run: int) -> int:
        if run < 1:
            raise ValueError(f"must be at least 1 byte: it bounds the bytes one run reads (e.g. 1GiB), got {run}")
        return run

    @field_validator("slot")
    @classmethod
    def _slot_aligned(cls, slot: int) -> int:
        if slot < DIRECT_ALIGN or slot % DIRECT_ALIGN:
            raise ValueError(f"io.slot must be a positive multiple of 4 KiB (4096 bytes), got {slot}")
        if slot > MAX_SLOT:
            raise ValueError(f"io.slot is at most 1TiB ({MAX_SLOT} bytes), got {slot}")
        return slot


class Group(_Model):
    into: str | None = None
    """Name of the tensor built, using the placeholders of `match` (e.g. `model.layers.{L}.mlp.experts.down_proj`).
    Required, except on a `fuse` inside a `stack`: the stack's `into` names the tensor."""
    over: str
    """The placeholder whose values are stacked or fused (e.g. `E`)."""
    order: list[Annotated[str, BeforeValidator(_value_name)]] | None = None
    """Values of `over` in output order. Required for `fuse`; for `stack`, default: numeric order."""


class Fuse(Group):
    dim: StrictInt = Field(0, ge=0)
    """Dim of the source tensors to concatenate along. Placed by offset, so the dims before it must
    all be 1 (dim 0 always qualifies); rows that would interleave are refused (`fuse-interleaved`)."""


class Dequantize(_Model):
    format: Literal["fp8", "mxfp4", "nvfp4"] = "fp8"
    """`fp8`: FP8 weights with square F32 block scales (DeepSeek-V3); `mxfp4`: `<name>_blocks` with
    E8M0 `<name>_scales`, loaded as `<name>` (gpt-oss); `nvfp4`: a U8 weight with F8_E4M3
    `weight_scale` and F32 `weight_scale_2` (ModelOpt). See docs/fp4.md."""
    scale: str | None = None
    """Name of the block-scale tensor; `{name}` is the loaded name (fp8, nvfp4: the weight's name;
    mxfp4: the weight's name without `_blocks`). Default: `{name}_scale_inv`, `{name}_scales`,
    `{name}_scale`. Scale tensors are consumed, not loaded."""
    scale_2: str | None = None
    """nvfp4: name of the per-tensor F32 scale (default `{name}_scale_2`)."""
    consume: list[str] | None = None
    """Companions consumed when present, unused by a weight-only dequantization (nvfp4 default:
    `{module}.input_scale`, `{module}` being the name without its last component)."""
    block: StrictInt = Field(128, ge=1, le=MAX_BLOCK)
    """fp8: edge of the square scale block (128 for DeepSeek-V3 style checkpoints). The FP4
    formats fix theirs (32 for mxfp4, 16 for nvfp4)."""

    @field_validator("scale", "scale_2")
    @classmethod
    def _scale_template(cls, scale: str | None, info) -> str | None:
        if scale is None:
            return None
        _check_template(scale, {"name", "module"}, f"dequantize.{info.field_name}")
        if "{name}" not in scale and "{module}" not in scale:
            raise ValueError(f"dequantize.{info.field_name} {scale!r} must use {{name}}, or every weight would "
                             f"share one scale")
        return scale

    @field_validator("consume")
    @classmethod
    def _consume_templates(cls, names: list[str] | None) -> list[str] | None:
        for n in names or ():
            _check_template(n, {"name", "module"}, "dequantize.consume")
            if "{name}" not in n and "{module}" not in n:
                raise ValueError(f"dequantize.consume {n!r} must use {{name}} or {{module}}")
        return names

    @model_validator(mode="before")
    @classmethod
    def _by_format(cls, data: Any) -> Any:
        """Fill the templates' defaults of the format (the model is frozen: before validation)."""
        if not isinstance(data, dict):
            return data
        from ..base.fp4 import DEFAULT_CONSUME, DEFAULT_SCALE, DEFAULT_SCALE2

        fmt = data.get("format", "fp8")
        if fmt not in DEFAULT_SCALE:
            return data  # the field's own check names the choices
        if fmt != "nvfp4" and data.get("scale_2") is not None:
            raise ValueError("dequantize.scale_2 is for format nvfp4")
        if fmt != "fp8" and "block" in data:
            raise ValueError(f"dequantize.block is for format fp8; {fmt} fixes its block")
        data = dict(data)
        if data.get("scale") is None:
            data["scale"] = DEFAULT_SCALE[fmt]
        if fmt == "nvfp4" and data.get("scale_2") is None:
            data["scale_2"] = DEFAULT_SCALE2
        if data.get("consume") is None:
            data["consume"] = list(DEFAULT_CONSUME.get(fmt, ()))
        return data

    @property
    def fp4(self) -> bool:
        return self.format != "fp8"


class Split(_Model):
    dim: StrictInt = Field(ge=0)
    """Dim of the loaded tensor to split across ranks: 0 is column parallel for a [out, in] weight, 1 row parallel."""
    pad: YesNo = False
    """Allow sizes not divisible by the number of ranks: each rank gets ceil(D / N); the last ranks are zero-padded."""


class TensorParallel(_Model):
    size: StrictInt = Field(1, ge=1, le=MAX_TP)
    """Number of ranks; each rank's plan reads only its own bytes."""
    ranks_per_node: StrictInt | None = Field(None, ge=1, le=1024)
    """Ranks that share one host (node): ranks 0..k-1 on the first, k..2k-1 on the next, ... Their host
    peaks together are checked against `budget.node_host`. Unset: all ranks on one node."""

    @property
    def per_node(self) -> int:
        return min(self.ranks_per_node or self.size, self.size)


def _addend(v):
    """A rule's `add`: a finite number that float32 holds exactly (the kernels add it as a float32);
    0 (or -0.0) is no add at all."""
    if v is None:
        return None
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise ValueError(f"add takes a number (such as -1), got {type(v).__name__} {str(v)[:40]!r}")
    try:
        f = float(v)
        held = struct.unpack("<f", struct.pack("<f", f))[0]
    except (OverflowError, struct.error):
        raise ValueError(f"add {str(v)[:40]} is outside float32's range") from None
    if not math.isfinite(f):
        raise ValueError(f"add must be a finite number, got {f}")
    if held != f:
        raise ValueError(f"add {str(v)[:40]} is not a float32 value (float32 holds {held!r}); write that")
    return f or None


class Rule(_Model):
    match: str
    """Glob on tensor names, with optional `{X}` placeholders (one dotted component each)."""
    source_dtype: list[str] | None = None
    """Only tensors stored in one of these safetensors dtypes match (e.g. [F8_E4M3]); GGUF block types
    (Q4_K, ...) too."""
    dtype: Target = "keep"
    """Target dtype of the loaded tensor."""
    skip: YesNo = False
    """Do not load matching tensors."""
    on: Literal["device", "host"] = "device"
    """Where conversions and packs run."""
    rename: str | None = None
    """Load a single tensor under another name: a template using the placeholders of `match`
    (e.g. `model.layers.{L}.mlp.gate.weight`)."""
    fuse: Fuse | None = None
    """Concatenate the matched tensors along `dim` (default 0) into one tensor, in `order`. With
    `stack` too: each stacked item is the fuse of its parts (e.g. `[E, 2I, H]` from w1 and w3)."""
    stack: Group | None = None
    """Stack same-shaped matched tensors into one tensor with a new leading dim."""
    dequantize: Dequantize | None = None
    """Dequantize block-scaled weights (FP8, MXFP4, NVFP4) to `dtype` (bfloat16 unless given);
    with `transpose`, an FP4 weight's last two dims are swapped."""
    transpose: YesNo = False
    """Transpose 2-D tensors."""
    unpermute: YesNo = False
    """GGUF Llama attention weights (`blk.N.attn_q.weight`, `blk.N.attn_k.weight`): undo llama.cpp's
    row permutation of each head (heads from the file's `llama.attention.head_count` / `head_count_kv`),
    as a row gather: one strided read per head and half (docs/gguf.md)."""
    add: Annotated[float | None, BeforeValidator(_addend)] = None
    """A constant added to every value of F32 / F16 / BF16 tensors, in float32 (the sum rounded to
    float32, then to `dtype`, as transformers' `weights - 1` then its cast), on the device or the
    host: llama.cpp stores Gemma's RMSNorm weights plus one, which `add: -1` takes off. A number that
    float32 holds exactly (0: no add); single tensors only (no `fuse`, `stack`, `transpose`,
    `dequantize` or `unpermute`); not on GGUF block-quantized or integer tensors."""
    split: Split | Literal["replicate"] = "replicate"
    """Tensor parallel: `{dim: 0}` (column parallel), `{dim: 1}` (row parallel) or `replicate` (every rank loads it)."""

    @field_validator("source_dtype")
    @classmethod
    def _known_dtypes(cls, names: list[str] | None) -> list[str] | None:
        from ..manifest.ggml_types import QUANTIZED

        unknown = sorted(set(names or ()) - set(DTYPES) - QUANTIZED)
        if unknown:
            raise ValueError(f"unknown safetensors dtypes {unknown}; known: {', '.join(DTYPES)} (and GGUF's block "
                             f"types: {', '.join(sorted(QUANTIZED))})")
        return names

    @model_validator(mode="after")
    def _coherent(self):
        if self.fuse and self.stack:
            if self.fuse.into is not None:
                raise ValueError("a fuse inside a stack takes no `into`: the stack's `into` names the tensor")
            if self.fuse.over == self.stack.over:
                raise ValueError(f"fuse.over and stack.over must be different placeholders (both {self.fuse.over!r})")
        if self.add is not None and (self.fuse or self.stack or self.dequantize or self.transpose or self.unpermute):
            raise ValueError("add is for single tensors stored as F32, F16 or BF16: not with fuse, stack, dequantize, "
                             "transpose or unpermute")
        if self.skip and (self.fuse or self.stack or self.dequantize or self.transpose or self.dtype != "keep"
                          or self.rename or self.add is not None):
            raise ValueError("a skip rule takes no other action")
        if self.rename is not None and (self.fuse or self.stack):
            raise ValueError("rename is for single tensors; fuse and stack name their tensor with `into`")
        if self.transpose and self.fuse:
            raise ValueError("transpose with fuse is not supported (fused parts would not be contiguous)")
        if self.dequantize and not self.dequantize.fp4 and self.dtype == "float32":
            raise ValueError("an fp8 dequantize produces bfloat16 or float16")
        if self.dequantize and not self.dequantize.fp4 and self.transpose:
            raise ValueError("an fp8 dequantize with transpose is not supported (mxfp4 and nvfp4 transpose)")
        if self.skip and self.split != "replicate":
            raise ValueError("a skip rule takes no split")
        _check_match(self.match)
        if self.rename is not None and not self.rename.strip():
            raise ValueError("rename must name a tensor (a template such as model.layers.{L}.mlp.gate.weight)")
        found = _PLACEHOLDER.findall(self.match)
        twice = sorted({n for n in found if found.count(n) > 1})
        if twice:
            raise ValueError(f"match {self.match!r} uses placeholders {twice} more than once")
        names = set(found)
        if self.rename is not None:
            _check_template(self.rename, names, "rename")
        for key, grp in (("fuse", self.fuse), ("stack", self.stack)):
            if grp is None:
                continue
            if grp.over not in names:
                raise ValueError(f"{key}.over {grp.over!r} is not a placeholder of match {self.match!r}")
            # A fuse inside a stack builds no tensor of its own: the stack's `into` names it.
            into = self.stack.into if key == "fuse" and self.stack else grp.into
            label = "stack" if self.stack else key
            if into is None:
                raise ValueError(f"{key} needs `into`: the name of the tensor it builds")
            missing = sorted(set(_PLACEHOLDER.findall(into)) - names)
            if missing:
                raise ValueError(f"{label}.into uses placeholders {missing} that match {self.match!r} does not define")
            if grp.over in _PLACEHOLDER.findall(into):
                raise ValueError(f"{label}.into must not use the grouped placeholder {{{grp.over}}}")
            _check_template(into, names, f"{label}.into")
            if key == "fuse" and not grp.order:
                raise ValueError("fuse needs `order`: the values of the grouped placeholder in output order")
            if grp.order and len(set(grp.order)) != len(grp.order):
                dup = sorted({v for v in grp.order if grp.order.count(v) > 1})
                raise ValueError(f"{key}.order lists {dup} more than once")
        return self

    def pattern(self) -> re.Pattern:
        return compile_match(self.match)


class Spec(_Model):
    checkpoint: str
    """Checkpoint: a .safetensors file, a folder of shards, or an index json (relative to the spec's folder)."""
    device: Annotated[str, AfterValidator(check_device)] = "cuda:0"
    """Target device: `cuda:N` (or `cuda`, device 0)."""
    budget: Budget
    io: IO = IO()
    tensor_parallel: TensorParallel = TensorParallel()
    """Tensor parallelism: one plan per rank."""
    rules: list[Rule] = Field(min_length=1)
    """Ordered rules; the first whose match fits a tensor decides what happens to it."""


def _check_template(template: str, names: set[str], field: str) -> None:
    """`template` may hold bare `{X}` placeholders drawn from `names` only (bind calls str.format).

    Indexing, attributes, conversions and format specs (`{X[0]}`, `{X.y}`, `{X!r}`, `{X:>4}`) are
    refused here: they could fail at bind time on a tensor name the validation never saw.
    """
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as e:  # unbalanced braces
        raise ValueError(f"{field} {template!r} is not a name template with {{X}} placeholders ({e})") from None
    for f, spec, conv in fields:
        if f not in names or spec or conv:
            shown = "{" + f + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"{field} {template!r} is not a name template with {{X}} placeholders: "
                             f"{shown} is not one of {sorted('{' + n + '}' for n in names)}") from None


def _check_match(glob: str) -> None:
    """A brace outside a `{NAME}` placeholder, or a `[` that no `]` closes, is a typo that would match
    the text literally (no tensor name holds one): refused, naming the pattern."""
    pieces = _PLACEHOLDER.split(glob)[::2]  # the glob between placeholders, each matched on its own
    if any("{" in p or "}" in p for p in pieces):
        raise ValueError(f"match {glob!r}: a brace must be part of a placeholder {{NAME}} (letters, digits and _, "
                         f"not starting with a digit)")
    if any(_unclosed_set(p) for p in pieces):
        raise ValueError(f"match {glob!r}: a [ opens a set of characters that no ] closes (before the next "
                         f"placeholder)")


def _unclosed_set(piece: str) -> bool:
    """Whether a `[` in `piece` opens a set that no `]` closes, read as fnmatch reads sets (`]` right
    after `[` or `[!` is a member)."""
    i, n = 0, len(piece)
    while i < n:
        if piece[i] == "[":
            j = i + 1
            if j < n and piece[j] == "!":
                j += 1
            if j < n and piece[j] == "]":
                j += 1
            while j < n and piece[j] != "]":
                j += 1
            if j >= n:
                return True
            i = j
        i += 1
    return False


def compile_match(glob: str) -> re.Pattern:
    """Glob with `{X}` placeholders -> anchored regex with named groups."""
    out, pos = [], 0
    for m in _PLACEHOLDER.finditer(glob):
        out.append(_glob_piece(glob[pos:m.start()]))
        out.append(f"(?P<{m.group(1)}>[^.]+)")
        pos = m.end()
    out.append(_glob_piece(glob[pos:]))
    return re.compile("^" + "".join(out) + "$", re.DOTALL)


def _glob_piece(piece: str) -> str:
    if not piece:
        return ""
    rx = fnmatch.translate(piece)  # '(?s:...)\\Z'
    return rx[len("(?s:"):-len(")\\Z")]


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec with where it came from."""

    spec: Spec
    path: str  # the spec file
    checkpoint_path: str  # absolute, resolved against the spec's folder
    text_sha256: str


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, parse and validate a spec file. Raises SpecError naming the file, field and line."""
    import hashlib

    p = Path(path)
    text = _read_text(p)
    data, lines = _parse(text, p)
    spec = validate_spec(data, p, lines)
    try:
        ckpt = Path(spec.checkpoint).expanduser()
        if not ckpt.is_absolute():
            ckpt = (p.resolve().parent / ckpt)
        ckpt = _resolved(ckpt)
    except (OSError, ValueError, RuntimeError) as e:  # NUL, lone surrogates, ~unknown-user
        line = lines.get(("checkpoint",))
        raise SpecError(f"{p}{f':{line}' if line else ''}: checkpoint: {_brief(spec.checkpoint)} is not a usable "
                        f"path ({e})", code=Code.SPEC_INVALID) from None
    return LoadedSpec(spec, str(p), str(ckpt), hashlib.sha256(text.encode()).hexdigest())


def _resolved(path: Path) -> Path:
    """`path` with symlinks resolved; a symlink loop is left for the checkpoint reader to name
    (`[symlink-loop]`): the spec's path is fine, the checkpoint is not."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as e:
        if isinstance(e, RuntimeError) or getattr(e, "errno", None) == errno.ELOOP:
            return Path(os.path.abspath(path))
        raise


from ..base.units import SPEC_CAP  # noqa: E402 - a spec is a page of rules; a bigger file is refused unread


def _read_text(p: Path) -> str:
    """The spec's text, as `Path.read_text` gives it; FIFOs, devices and oversized files are refused."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang; it is refused by the fstat check that follows.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SpecError(f"{p}: spec file not found", code=Code.SPEC_MISSING) from None
    except (OSError, ValueError) as e:
        raise SpecError(f"{p}: cannot read spec: {e}", code=Code.SPEC_UNREADABLE) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{p}: cannot read spec: not a regular file", code=Code.SPEC_UNREADABLE)
        if st.st_size > SPEC_CAP:
            raise SpecError(f"{p}: spec is {st.st_size:,} bytes, over the {SPEC_CAP:,}-byte cap", code=Code.SPEC_TOO_LARGE)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(SPEC_CAP + 1)
    except OSError as e:
        raise SpecError(f"{p}: cannot read spec: {e}", code=Code.SPEC_UNREADABLE) from None
    finally:
        os.close(fd)
    if len(raw) > SPEC_CAP:
        raise SpecError(f"{p}: spec is over the {SPEC_CAP:,}-byte cap", code=Code.SPEC_TOO_LARGE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: cannot read spec: {e}", code=Code.SPEC_UNREADABLE) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as read_text


def validate_spec(data: Any, path: Path | str = "<spec>", lines: dict | None = None) -> Spec:
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a mapping of keys (checkpoint, budget, rules, ...), got {type(data).__name__}",
                        code=Code.SPEC_NOT_MAPPING)
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        msgs = [_format_error(err, path, lines or {}) for err in _one_per_union(e.errors())]
        raise SpecError("; ".join(msgs), code=Code.SPEC_INVALID) from None


_SPLIT_FORMS = ("Split", "literal['replicate']")  # the members of `split`'s union, as pydantic tags them


def _one_per_union(errors: list) -> list:
    """`split` is `replicate` or `{dim, pad}`: report the form the value was written in, not both."""
    out = []
    for err in errors:
        loc = err["loc"]
        k = next((i for i in range(1, len(loc)) if loc[i] in _SPLIT_FORMS and loc[i - 1] == "split"), None)
        if k is not None:
            tag = loc[k]
            written = err.get("input") if k == len(loc) - 1 else {}  # a deeper error: a mapping was written
            meant = "Split" if isinstance(written, dict) else "literal['replicate']"
            if tag != meant:
                continue
            err = dict(err, loc=loc[:k] + loc[k + 1:])
            if tag != "Split":
                err["msg"] = "must be replicate or {dim: D} (with pad: true for uneven sizes)"
        out.append(err)
    return out or errors


def _format_error(err: dict, path, lines: dict) -> str:
    loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    field = _loc_str(loc)
    line = _line_for(loc, lines)
    where = f"{path}:{line}" if line else f"{path}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    got = err.get("input")
    if err["type"] not in ("missing", "extra_forbidden") and not isinstance(got, (dict, list)) and "got" not in msg:
        msg += f" (got {_brief(got)})"
    return f"{where}: {field or '(top level)'}: {msg}"


def _loc_str(loc) -> str:
    s = ""
    for x in loc:
        if isinstance(x, int) and not isinstance(x, bool):
            s += f"[{_brief(x)}]"
        else:
            x = x if isinstance(x, str) and len(x) <= 80 else _brief(x)
            s += f".{x}" if s else x
    return s


def _clip_text(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _line_for(loc, lines: dict) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return None


def _parse(text: str, path: Path) -> tuple[Any, dict]:
    if path.suffix.lower() == ".json":
        return parse_json(text, path)
    return parse_yaml(text, path)


def json_schema() -> dict:
    return Spec.model_json_schema()

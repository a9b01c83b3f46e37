"""bind: Spec rules x Manifest -> `Binding` (one `Placement` per loaded tensor).

First match wins. A rule with `source_dtype` only matches tensors stored in one of those dtypes;
a `fuse` rule only matches tensors whose grouped placeholder is in its `order`. Scale tensors named
by a `dequantize` rule are consumed by their weight and need no rule of their own. A tensor that
no rule matches is an error listing every such name, sorted.

Example: `match: model.layers.{L}.mlp.experts.{E}.down_proj.weight` with
`stack: {into: model.layers.{L}.mlp.experts.down_proj, over: E}` turns 64 tensors [H, I] of layer 3
into one placement `model.layers.3.mlp.experts.down_proj` [64, H, I] whose part e sits at byte
offset e * H * I * itemsize: placed by offset, no scratch.

A fuse inside a stack builds one tensor per stacked item and stacks those. transformers 5's
Mixtral experts: `match: model.layers.{L}.block_sparse_moe.experts.{E}.{W}.weight`,
`stack: {into: model.layers.{L}.mlp.experts.gate_up_proj, over: E}`, `fuse: {over: W, order: [w1, w3]}`
gives [E, 2I, H] from w1, w3 [I, H]: expert e's w1 at e * 2IH * itemsize, its w3 right after
(IH * itemsize further on). Every part is still one contiguous range of the output. A fuse along
a later dim (`fuse.dim`) is placed the same way when the dims before it are all 1. A fuse along dim 1
of 3-D stacked experts [E, n, k] (llama.cpp's `ffn_gate_exps` and `ffn_up_exps` into transformers 5's
`gate_up_proj`) interleaves: each expert of each source is a part of its own (`_interleaved`); any
other fuse whose rows would interleave is refused (`fuse-interleaved`).

`rename` gives a single tensor another name, from the placeholders of `match`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from string import Formatter
from typing import NamedTuple

from ..base import fp4
from ..base.dtypes import DTYPES, FLOAT_CONVERTIBLE, FP8_DEQUANTIZABLE, TARGETS, op_problem
from ..base.errors import BindError
from ..base.limits import shape_problem
from ..manifest import Manifest, TensorEntry
from ..manifest.ggml_types import DEQUANTIZABLE, quant_type
from ..spec.model import Rule, Spec
from .split import Rows, Slice, rank_range
from ..base.codes import Code

_MAX_LISTED = 20
_tuple_new = tuple.__new__  # builds a NamedTuple from a sequence without a Python-level call


class Part(NamedTuple):  # a tuple: there is one per source tensor, and it is built fast
    """One source tensor of a placement and where its output lands inside the placed tensor."""

    source: TensorEntry
    scale: TensorEntry | None  # block scales consumed by a dequantize
    offset_bytes: int  # byte offset of this part's output within the placed tensor
    out_bytes: int
    src_slice: Slice | None = None  # this rank's slice of the source (tensor parallel)
    scale_slice: Slice | None = None
    zero_bytes: int = 0  # zero padding after this part's data (uneven split with pad)
    scale2: TensorEntry | None = None  # NVFP4: the per-tensor F32 scale


@dataclass(frozen=True)
class Placement:
    """One tensor as it will exist on the device."""

    name: str
    dtype: str  # safetensors spelling of the loaded dtype
    shape: tuple[int, ...]
    op: str  # per part: copy | convert | dequantize | dequantize_t | transpose
    on: str  # device | host
    pack: str  # none | fuse | stack
    rule: int
    parts: tuple[Part, ...]
    block: int = 0  # dequantize block edge
    ggml: str = ""  # a GGUF tensor's GGML block type (its parts read U8 rows of whole blocks)
    add: float = 0.0  # a constant added to every value by the convert (a rule's `add`)
    unpermute: int = 0  # GGUF q/k rows per head that the gguf kernel writes in transformers' order

    @property
    def nbytes(self) -> int:
        return sum(p.out_bytes + p.zero_bytes for p in self.parts)


@dataclass(frozen=True)
class Binding:
    placements: tuple[Placement, ...]  # sorted by name
    skipped: tuple[str, ...]
    consumed: tuple[str, ...]  # scale tensors folded into a dequantize


@dataclass(frozen=True)
class _TP:
    world: int
    rank: int


def bind(spec: Spec, manifest: Manifest, rank: int = 0) -> Binding:
    world = spec.tensor_parallel.size
    if not 0 <= rank < world:
        raise BindError(f"rank {rank} is outside tensor_parallel.size {world} (ranks 0..{world - 1})", code=Code.BAD_RANK)
    tp = _TP(world, rank)
    rules = list(spec.rules)
    # What matching reads of each rule, looked up once rather than once per tensor; a rule with
    # `source_dtype` is only tried on tensors of those dtypes (`candidates`, per dtype).
    tests = [(None if r.source_dtype is None else frozenset(r.source_dtype), r.pattern().match,
              r.fuse.over if r.fuse else None, r.fuse.order if r.fuse else None) for r in rules]
    candidates: dict[str, list] = {}
    dequantizes = [bool(r.dequantize) and not r.skip for r in rules]
    # The tensor a group builds is named by the stack's `into` when a rule stacks (a fuse inside a
    # stack has none of its own), else by the fuse's.
    into_names = [tuple(f for _, f, _, _ in Formatter().parse((r.stack or r.fuse).into) if f)
                  if r.fuse or r.stack else () for r in rules]

    matched = []  # (rule index or None, match) per manifest tensor, in manifest order
    consumed: dict[str, str] = {}
    scales: dict[str, TensorEntry] = {}  # weight name -> its checked scale tensor
    scales2: dict[str, TensorEntry | None] = {}  # NVFP4 weight name -> its per-tensor scale
    for t in manifest.tensors:
        tries = candidates.get(t.dtype)
        if tries is None:
            tries = candidates[t.dtype] = [(i, match, over, order) for i, (dtypes, match, over, order)
                                           in enumerate(tests) if dtypes is None or t.dtype in dtypes]
        name = t.name
        for i, match, over, order in tries:  # first match wins
            m = match(name)
            if m and (over is None or m.group(over) in order):
                break
        else:
            i, m = None, None
        matched.append((i, m))
        if i is not None and dequantizes[i]:
            if rules[i].dequantize.fp4:
                scale, scale2, extra = _fp4_companions(t, rules[i], i, manifest)
                scales2[name] = scale2
                for c in extra:
                    consumed[c.name] = name
            else:
                scale, scale2 = _scale_for(t, rules[i], i, manifest), None
            scales[name] = scale
            consumed[scale.name] = name
            if scale2 is not None:
                consumed[scale2.name] = name
    unmatched = sorted(t.name for t, (i, _) in zip(manifest.tensors, matched) if i is None and t.name not in consumed)
    if unmatched:
        shown = ", ".join(unmatched[:_MAX_LISTED]) + (f" ... (+{len(unmatched) - _MAX_LISTED} more)" if len(unmatched) > _MAX_LISTED else "")
        raise BindError(f"{len(unmatched)} tensor(s) match no rule: {shown}; add a rule for them or a catch-all `match: \"*\"`",
                        code=Code.UNMATCHED)

    singles, groups, skipped, intos = [], {}, [], {}
    metadata = None  # the GGUF header's key/values, read for a rule that unpermutes
    for t, (i, m) in zip(manifest.tensors, matched):
        if t.name in consumed:
            continue
        r = rules[i]
        if r.skip:
            skipped.append(t.name)
        elif r.fuse or r.stack:
            grp = r.stack or r.fuse
            # The name built depends only on the placeholders `into` uses: format it once per value.
            names = into_names[i]
            key = (i, m.group(*names) if names else ())
            into = intos.get(key)
            if into is None:
                into = intos[key] = grp.into.format(**m.groupdict())
            value = (m.group(grp.over), m.group(r.fuse.over)) if r.fuse and r.stack else m.group(grp.over)
            groups.setdefault((i, into), []).append((value, t))
        else:
            name = r.rename.format(**m.groupdict()) if r.rename else (
                fp4.loaded_name(r.dequantize.format, t.name) if r.dequantize else t.name)
            if r.unpermute and metadata is None:
                metadata = dict(manifest.shards[0].metadata) if manifest.shards else {}
            singles.append(_single(t, r, i, scales, tp, name, scales2, metadata))
    placements = singles + [_group(i, name, members, rules[i], scales, tp, scales2)
                            for (i, name), members in groups.items()]
    placements.sort(key=lambda p: p.name)
    seen = set()
    for p in placements:
        if p.name in seen:
            raise BindError(f"two rules produce a tensor named {p.name!r}; rename one `into`", code=Code.NAME_CLASH)
        seen.add(p.name)
    _within_limits(placements)
    return Binding(tuple(placements), tuple(sorted(skipped)), tuple(sorted(consumed)))


def _ggml(t: TensorEntry):
    """The GGMLType of a block-quantized GGUF tensor, or None."""
    return None if t.dtype in DTYPES else quant_type(t.dtype)

def _within_limits(placements: list) -> None:
    """Every loaded tensor and every source it reads within the plan format's limits (`planc.base.limits`):
    compile never writes a plan that its reader refuses. Distinct shapes are few; each is checked once."""
    shapes = {p.shape for p in placements} | {q.source.shape for p in placements for q in p.parts}
    bad = {s for s in shapes if shape_problem(s)}
    if not bad:
        return
    for p in placements:
        for what, shape in [(p.name, p.shape)] + [(q.source.name, q.source.shape) for q in p.parts]:
            if shape in bad:
                raise BindError(f"rules[{p.rule}] loads {what} of shape {_brief(shape)}, which {shape_problem(shape)}",
                                code=Code.SHAPE_LIMIT)


def _brief(shape) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."


def _target(t: TensorEntry, r: Rule, i: int) -> str:
    if r.add and t.dtype not in FLOAT_CONVERTIBLE:
        kind = f"a GGUF {t.dtype} tensor" if t.dtype not in DTYPES else f"stored as {t.dtype}"
        raise BindError(f"rules[{i}] adds {r.add:g} to {t.name}, {kind}; add takes tensors stored as F32, F16 or "
                        f"BF16 (narrow the rule with source_dtype)", code=Code.BAD_ADD)
    if t.dtype not in DTYPES and quant_type(t.dtype) is not None:
        return _gguf_target(t, r, i)
    if r.dequantize and r.dequantize.fp4:
        return TARGETS["bfloat16" if r.dtype == "keep" else r.dtype]
    if r.dequantize:
        return TARGETS["bfloat16" if r.dtype == "keep" else r.dtype]
    if r.dtype == "keep":
        return t.dtype
    if t.dtype not in FLOAT_CONVERTIBLE:
        raise BindError(f"rules[{i}] converts {t.name} to {r.dtype}, but it is stored as {t.dtype}; "
                        f"only F32, F16 and BF16 convert (narrow the rule with source_dtype)", code=Code.BAD_CONVERT)
    return TARGETS[r.dtype]


def _gguf_target(t: TensorEntry, r: Rule, i: int) -> str:
    """A GGUF block-quantized tensor: `keep` loads its blocks as stored (U8), a float dtype dequantizes."""
    if r.dequantize:
        raise BindError(f"rules[{i}] dequantizes {t.name} with `dequantize:`, but it is a GGUF {t.dtype} tensor; a "
                        f"rule's dtype (float32, float16, bfloat16) dequantizes GGUF blocks", code=Code.BAD_DEQUANTIZE)
    if r.transpose:
        raise BindError(f"rules[{i}] transposes {t.name}, a GGUF {t.dtype} tensor; quantized blocks do not "
                        f"transpose", code=Code.BAD_TRANSPOSE)
    if r.dtype == "keep":
        return "U8"
    if t.dtype not in DEQUANTIZABLE:
        raise BindError(f"rules[{i}] dequantizes {t.name}, a GGUF {t.dtype} tensor; planc dequantizes "
                        f"{', '.join(sorted(DEQUANTIZABLE))} (load it as stored with dtype: keep)",
                        code=Code.GGUF_DEQUANTIZE)
    return TARGETS[r.dtype]


def _op(t: TensorEntry, r: Rule, i: int, target: str) -> str:
    if t.dtype not in DTYPES:  # GGUF blocks (`_gguf_target` refused the rest)
        return "copy" if target == "U8" else "gguf"
    if r.dequantize:
        return "dequantize_t" if r.transpose else "dequantize"
    if r.transpose:
        if len(t.shape) != 2:
            raise BindError(f"rules[{i}] transposes {t.name}, which has shape {list(t.shape)}; only 2-D tensors transpose",
                            code=Code.BAD_TRANSPOSE)
        if target != t.dtype and r.on == "device":
            raise BindError(f"rules[{i}] transposes and converts {t.name} on the device; do one or the other, "
                            f"or add on: host", code=Code.BAD_TRANSPOSE)
        if DTYPES[t.dtype].bits % 8:
            raise BindError(f"rules[{i}] transposes {t.name}, a {t.dtype} tensor of packed sub-byte elements; only "
                            f"tensors of whole-byte elements transpose", code=Code.BAD_TRANSPOSE)
        return "transpose"
    return "copy" if target == t.dtype and not r.add else "convert"


def _allowed(t: TensorEntry, r: Rule, i: int, op: str, target: str, scale: TensorEntry | None) -> None:
    """The op and dtypes chosen for `t` are ones the plan reader accepts (`dtypes.op_problem`, the
    one table both hold parts to); the checks above name the usual faults in the spec's words.
    What passed is remembered (`_ALLOWED`): a model's tensors share a handful of kinds."""
    path = "host" if r.on == "host" else "direct"
    sdt = scale.dtype if scale is not None else None
    src = t.dtype if t.dtype in DTYPES else "U8"  # GGUF blocks are read as U8 rows
    why = op_problem(op, path, src, target, sdt, bool(r.add))
    if why:
        raise BindError(f"rules[{i}] loads {t.name} ({t.dtype}) as {target} by a {op} on the "
                        f"{'host' if path == 'host' else 'device'}, but a {op} {why}", code=Code.BAD_OP_DTYPE)
    _ALLOWED.add((op, r.on, t.dtype, target, sdt, bool(r.add)))


_ALLOWED: set = set()  # (op, on, source dtype, target, scale dtype, adds) that `op_problem` allows


def _out_shape(t: TensorEntry, op: str, r: Rule | None = None) -> tuple[int, ...]:
    if r is not None and r.dequantize and r.dequantize.fp4:
        return fp4.out_shape(r.dequantize.format, tuple(t.shape), op == "dequantize_t")
    if op == "copy" and t.dtype not in DTYPES:  # GGUF blocks kept: U8 rows of whole blocks
        qt = quant_type(t.dtype)
        return (*t.shape[:-1], t.shape[-1] // qt.block * qt.block_bytes)
    return (t.shape[1], t.shape[0]) if op == "transpose" else t.shape


def _block(r: Rule) -> int:
    if not r.dequantize:
        return 0
    return fp4.BLOCK[r.dequantize.format] if r.dequantize.fp4 else r.dequantize.block


def _refuse_fp4_split(r: Rule, i: int, name: str) -> None:
    if r.dequantize and r.dequantize.fp4:
        raise BindError(f"rules[{i}] splits {name}, a {r.dequantize.format} dequantization; tensor-parallel "
                        f"splits of FP4 weights are not supported (split: replicate)", code=Code.SPLIT_FP4)


def _unpermuted(t: TensorEntry, r: Rule, i: int, tp: _TP, name: str, target: str, op: str, shape: tuple, qt,
                metadata: dict) -> Placement:
    """A GGUF Llama q/k weight in transformers' row order: llama.cpp stores head h's row (j, i) (j < 2,
    i < head_dim / 2) as row (i, j), so out rows [h*hd + j*hd/2, +hd/2) are in rows h*hd + j + 2i
    (`planc.manifest.gguf_names.unpermute_rows`). Dequantized blocks (`gguf`): one part, the rows read
    whole, that the kernel writes in transformers' order (`unpermute`: hd). Floats kept or converted:
    one part per head and half, each one strided read."""
    from ..manifest.gguf_names import permuted_heads

    why = None
    try:
        n_head = permuted_heads(t.name, metadata)
    except KeyError as e:
        n_head, why = None, str(e.args[0])
    except ValueError as e:  # a head count that is not an integer
        raise BindError(f"rules[{i}] unpermutes {t.name}: the file's {e}", code=Code.BAD_UNPERMUTE) from None
    if n_head is None:
        raise BindError(f"rules[{i}] unpermutes {t.name}, which is not a GGUF Llama attn_q / attn_k weight"
                        + (f" ({why})" if why else ""), code=Code.BAD_UNPERMUTE)
    rows = t.shape[0] if t.shape else 0
    if len(t.shape) != 2 or n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        raise BindError(f"rules[{i}] unpermutes {t.name} {list(t.shape)}: its rows are not {n_head} heads of an even "
                        f"head dim", code=Code.BAD_UNPERMUTE)
    if r.transpose or r.dequantize:
        raise BindError(f"rules[{i}] unpermutes {t.name}; the row gather takes no transpose or dequantize",
                        code=Code.BAD_UNPERMUTE)
    hd = rows // n_head
    first, last = 0, n_head  # the heads this rank loads
    if r.split != "replicate" and tp.world > 1:
        first, last = _rank_heads(t, r, i, tp, n_head, hd)
        shape = ((last - first) * hd, *shape[1:])
    row_out = DTYPES[target].nbytes(math.prod(shape[1:]))
    if op == "gguf":  # the rank's heads read whole; the kernel writes each head's rows in transformers' order
        sl = Slice(0, first * hd, last * hd) if (first, last) != (0, n_head) else None
        return Placement(name, target, shape, op, r.on, "none", i,
                         (Part(t, None, 0, (last - first) * hd * row_out, sl),), 0, qt.name, 0.0, hd)
    half = hd // 2
    parts = tuple(Part(t, None, ((h - first) * hd + j * half) * row_out, half * row_out, Rows(h * hd + j, 2, half))
                  for h in range(first, last) for j in range(2))
    return Placement(name, target, shape, op, r.on, "none", i, parts, 0, qt.name if qt is not None else "")


def _rank_heads(t: TensorEntry, r: Rule, i: int, tp: _TP, n_head: int, hd: int) -> tuple[int, int]:
    """The heads [first, last) of one rank's row split of a permuted q/k weight. llama.cpp's permutation
    moves rows only within a head, so a rank owning whole heads owns one row range in both orders:
    its rows of transformers' order are its heads' rows gathered. A split of the columns, or one whose
    rank boundaries would fall inside a head (a size that does not divide the heads), is refused."""
    what = f"rules[{i}] splits {t.name} {list(t.shape)}, whose rows it unpermutes ({n_head} heads of {hd} rows)"
    if r.split.dim != 0:
        raise BindError(f"{what}, on dim {r.split.dim}; unpermuted q/k rows split on dim 0 only (a rank's heads)",
                        code=Code.SPLIT_UNPERMUTE)
    if n_head % tp.world:
        fits = [w for w in range(1, n_head + 1) if n_head % w == 0]
        raise BindError(f"{what}: tensor_parallel.size {tp.world} puts rank boundaries inside a head; each rank "
                        f"needs whole heads: a size that divides {n_head} ({', '.join(map(str, fits))}), or "
                        f"split: replicate", code=Code.SPLIT_UNPERMUTE)
    per = n_head // tp.world
    return tp.rank * per, (tp.rank + 1) * per


def _single(t: TensorEntry, r: Rule, i: int, scales: dict, tp: _TP, name: str, scales2: dict,
            metadata: dict | None = None) -> Placement:
    target = _target(t, r, i)
    op = _op(t, r, i, target)
    shape = _out_shape(t, op, r)
    scale = scales[t.name] if r.dequantize else None
    if (op, r.on, t.dtype, target, scale and scale.dtype, bool(r.add)) not in _ALLOWED:
        _allowed(t, r, i, op, target, scale)
    block = _block(r)
    sl, ssl = None, None
    qt = _ggml(t)
    if r.unpermute:
        return _unpermuted(t, r, i, tp, name, target, op, shape, qt, metadata)
    if r.split != "replicate" and tp.world > 1:
        _refuse_fp4_split(r, i, name)
        d = _split_dim(r, i, t.name, len(shape))
        if qt is not None and op == "copy" and d == len(shape) - 1:
            raise BindError(f"rules[{i}] splits {t.name}, GGUF {t.dtype} blocks kept as stored, on its last dim; "
                            f"split them on an outer dim, or dequantize them (dtype) to split columns",
                            code=Code.SPLIT_GGUF_BLOCK)
        sl, shape, out, zero = _split(shape, d, tp.world, tp.rank, r.split.pad, op, target, i, t.name)
        ssl = _scale_slice(t, sl, block, i) if scale is not None else None
    else:
        out, zero = DTYPES[target].nbytes(math.prod(shape)), 0
    return Placement(name, target, shape, op, r.on, "none", i,
                     (Part(t, scale, 0, out - zero, sl, ssl, zero, scales2.get(t.name)),), block,
                     qt.name if qt is not None else "", r.add or 0.0)


def _split(shape: tuple, d: int, world: int, rank: int, pad: bool, op: str, target: str, i: int, name: str):
    """(slice, rank's shape, bytes, zero bytes) of one rank's part of dim d: the same for every tensor
    of a shape under a rule, so worked out once per (shape, rule, op, dtype)."""
    key = (shape, d, world, rank, pad, op, target, i)
    got = _SPLITS.get(key)
    if got is None:
        a, b, per = rank_range(shape[d], world, rank, pad, f"rules[{i}] splits {name} {list(shape)}", d,
                               can_pad=op != "dequantize")  # block scales cannot be padded
        if pad and d != 0 and shape[d] % world:  # on every rank, not only those that would pad
            raise BindError(f"rules[{i}] pads {name} on dim {d}; padding is supported on dim 0 only",
                            code=Code.SPLIT_PAD)
        sd = 1 - d if op == "transpose" else d
        sl = Slice(sd, a, b, per - (b - a))
        out_shape = (*shape[:d], per, *shape[d + 1:])
        n = per - (b - a)
        out = DTYPES[target].nbytes(math.prod(out_shape))
        zero = DTYPES[target].nbytes(math.prod(out_shape) // out_shape[0] * n) if n else 0
        got = _SPLITS[key] = (sl, out_shape, out, zero)
        if len(_SPLITS) > 1 << 16:
            _SPLITS.clear()
    return got


_SPLITS: dict = {}


def _split_dim(r: Rule, i: int, name: str, ndim: int) -> int:
    d = r.split.dim
    if d >= ndim:
        raise BindError(f"rules[{i}] splits {name} on dim {d}, but it has {ndim} dim(s)", code=Code.SPLIT_DIM)
    return d


def _scale_slice(t: TensorEntry, sl: Slice, block: int, i: int) -> Slice:
    """The block-scale rows (or columns) that go with a weight slice; the slice must follow block edges."""
    size = t.shape[sl.dim]
    if sl.start % block or (sl.stop % block and sl.stop != size) or sl.pad:
        raise BindError(f"rules[{i}] splits the FP8 weight {t.name} {list(t.shape)} at [{sl.start}, {sl.stop}) on dim "
                        f"{sl.dim}, which does not follow its {block}-element scale blocks", code=Code.SPLIT_BLOCKS)
    return Slice(sl.dim, sl.start // block, -(-sl.stop // block))


def _group(i: int, name: str, members: list, r: Rule, scales: dict, tp: _TP, scales2: dict) -> Placement:
    """A fuse, a stack, or a stack of fuses (each stacked item the fuse of its parts), placed by offset.

    The members are cut into blocks: one block per stacked item (a single tensor, or the fused
    parts in `fuse.order`), or one block of fused parts. Parts are laid out block after block,
    each part right after the one before it, so every part lands at a plain byte offset.
    """
    blocks = _blocks(i, name, members, r)
    ts = [t for b in blocks for t in b]
    first = ts[0]
    if r.unpermute:
        raise BindError(f"rules[{i}] unpermutes {name}, a fuse or stack; unpermute single tensors",
                        code=Code.BAD_UNPERMUTE)
    if r.fuse and not r.stack and r.fuse.dim == 1 and len(first.shape) == 3 and first.shape[0] > 1:
        return _interleaved(i, name, ts, r, tp)
    if _ggml(first) is not None:
        raise BindError(f"rules[{i}] groups {name}: {first.name} is a GGUF {first.dtype} tensor; quantized GGUF "
                        f"tensors load one by one, or fuse along dim 1 of stacked experts [E, n, k] (no stack)",
                        code=Code.GGUF_GROUP)
    target = _target(first, r, i)
    op = _op(first, r, i, target)
    _allowed(first, r, i, op, target, scales[first.name] if r.dequantize else None)
    fd = r.fuse.dim if r.fuse else 0
    alike = len({(t.dtype, t.shape) for t in ts}) == 1  # a stack's members, mostly: nothing to check
    for t in [] if alike else ts[1:]:
        if t.dtype != first.dtype:
            raise BindError(f"rules[{i}] groups {name}: {t.name} is {t.dtype} but {first.name} is {first.dtype}",
                            code=Code.GROUP_MISMATCH)
        shape = t.shape
        same = shape == first.shape or (r.fuse is not None and len(shape) == len(first.shape)
                                        and shape[:fd] == first.shape[:fd] and shape[fd + 1:] == first.shape[fd + 1:])
        if not same:
            raise BindError(f"rules[{i}] groups {name}: {t.name} has shape {list(t.shape)}, "
                            f"incompatible with {first.name} {list(first.shape)}", code=Code.GROUP_MISMATCH)
    if r.fuse and len(first.shape) == 0:
        raise BindError(f"rules[{i}] fuses scalars into {name}; fuse needs tensors with a dim 0", code=Code.GROUP_MISMATCH)
    if r.fuse and fd >= len(first.shape):
        raise BindError(f"rules[{i}] fuses {name} along dim {fd}, but {first.name} has {len(first.shape)} dim(s)",
                        code=Code.FUSE_DIM)
    if r.fuse and math.prod(first.shape[:fd]) != 1:
        raise BindError(f"rules[{i}] fuses {name} along dim {fd} of {first.name} {list(first.shape)}: the parts' "
                        f"rows would interleave in the fused tensor, and a fuse is placed by offset (each part one "
                        f"contiguous range); fuse along dim 0, or load the parts as separate tensors",
                        code=Code.FUSE_INTERLEAVED)
    if r.stack and r.fuse:
        shapes = {_fused_shape([_out_shape(t, op, r) for t in b], fd) for b in blocks}
        if len(shapes) > 1:
            raise BindError(f"rules[{i}] stacks the fuses of {name}, but they have different shapes "
                            f"{sorted(list(x) for x in shapes)}", code=Code.GROUP_MISMATCH)
    block = _block(r)
    split = r.split != "replicate" and tp.world > 1
    ndim = len(_out_shape(first, op, r)) + (1 if r.stack else 0)
    d = _split_dim(r, i, name, ndim) if split else None
    if split and r.split.pad:
        raise BindError(f"rules[{i}] pads the split of {name}; padding is supported on single tensors only",
                        code=Code.SPLIT_PAD)
    if split and r.stack and d == 0:  # expert parallel: whole experts per rank
        a, b, _ = rank_range(len(blocks), tp.world, tp.rank, False, f"rules[{i}] splits the experts of {name}", 0, can_pad=False)
        blocks = blocks[a:b]
        split = False
    if split:
        _refuse_fp4_split(r, i, name)
    if split and r.fuse and fd:
        raise BindError(f"rules[{i}] splits {name}, fused along dim {fd}; split a fuse along dim 0 only",
                        code=Code.SPLIT_FUSE)
    parts, off = [], 0
    out_type = DTYPES[target]
    sizes: dict = {}  # output bytes by part shape: a stack's parts mostly share one
    inner = None
    for b in blocks:
        pshapes = []
        for t in b:
            pshape = _out_shape(t, op, r)
            sl = ssl = None
            scale = scales[t.name] if r.dequantize else None
            if split:
                pd = d - 1 if r.stack else d
                a, c, _ = rank_range(pshape[pd], tp.world, tp.rank, False, f"rules[{i}] splits {t.name} {list(pshape)}", pd, can_pad=False)
                sl = Slice(1 - pd if op == "transpose" else pd, a, c)
                ssl = _scale_slice(t, sl, block, i) if scale is not None else None
                pshape = (*pshape[:pd], c - a, *pshape[pd + 1:])
            out = sizes.get(pshape)
            if out is None:
                out = sizes[pshape] = out_type.nbytes(math.prod(pshape))
            parts.append(_tuple_new(Part, (t, scale, off, out, sl, ssl, 0, scales2.get(t.name))))
            off += out
            pshapes.append(pshape)
        inner = _fused_shape(pshapes, fd) if r.fuse else pshapes[0]
    shape = (len(blocks), *inner) if r.stack else inner
    pack = "stack" if r.stack else "fuse"
    return Placement(name, target, shape, op, r.on, pack, i, tuple(parts), block)


def _interleaved(i: int, name: str, ts: list, r: Rule, tp: _TP) -> Placement:
    """A fuse along dim 1 of stacked experts [E, n_k, ...] (llama.cpp's `ffn_gate_exps` and
    `ffn_up_exps` into transformers 5's `gate_up_proj` [E, n_0 + n_1, ...]): expert e's slice of each
    source in `fuse.order`, one after the other, then expert e + 1's. Each (expert, source) is one part,
    a one-row gather of the source's dim 0 (`Rows(e, 1, 1)`, one contiguous read), placed at its byte
    offset: the rows interleave, every part is still one contiguous range of the output. GGUF sources
    are dequantized part by part (each expert's rows are whole blocks), each of its own GGML type."""
    first = ts[0]
    what = f"rules[{i}] fuses {name} along dim 1 of the stacked {first.name} {list(first.shape)}"
    if r.dequantize or r.transpose:
        raise BindError(f"{what}: an interleaved fuse copies, converts or dequantizes GGUF blocks; it takes no "
                        f"{'dequantize' if r.dequantize else 'transpose'}", code=Code.FUSE_INTERLEAVED)
    if r.unpermute:
        raise BindError(f"rules[{i}] unpermutes {name}, a fuse or stack; unpermute single tensors",
                        code=Code.BAD_UNPERMUTE)
    if r.split != "replicate" and tp.world > 1:
        raise BindError(f"{what}: an interleaved fuse is not split across ranks (split: replicate)",
                        code=Code.SPLIT_FUSE)
    target = _target(first, r, i)
    op = _op(first, r, i, target)
    for t in ts:
        if _target(t, r, i) != target or _op(t, r, i, target) != op or (_ggml(t) is None) != (_ggml(first) is None):
            raise BindError(f"{what}: {t.name} is {t.dtype}, which loads as another op or dtype than {first.name} "
                            f"({first.dtype})", code=Code.GROUP_MISMATCH)
        if len(t.shape) != 3 or t.shape[0] != first.shape[0] or t.shape[2] != first.shape[2]:
            raise BindError(f"rules[{i}] groups {name}: {t.name} has shape {list(t.shape)}, incompatible with "
                            f"{first.name} {list(first.shape)} (the same experts and last dim)",
                            code=Code.GROUP_MISMATCH)
        _allowed(t, r, i, op, target, None)
    out_type = DTYPES[target]
    outs = [out_type.nbytes(t.shape[1] * t.shape[2]) for t in ts]
    parts, off = [], 0
    for e in range(first.shape[0]):
        for t, out in zip(ts, outs):
            parts.append(_tuple_new(Part, (t, None, off, out, Rows(e, 1, 1), None, 0, None)))
            off += out
    shape = (first.shape[0], sum(t.shape[1] for t in ts), first.shape[2])
    qt = _ggml(first)
    return Placement(name, target, shape, op, r.on, "fuse", i, tuple(parts), 0, qt.name if qt is not None else "")


def _fused_shape(shapes: list, dim: int) -> tuple[int, ...]:
    first = shapes[0]
    return (*first[:dim], sum(s[dim] for s in shapes), *first[dim + 1:])


def _blocks(i: int, name: str, members: list, r: Rule) -> list[list[TensorEntry]]:
    """The members as blocks of tensors in output order (see `_group`)."""
    grp = r.stack or r.fuse
    by_value = {}
    for value, t in members:
        if value in by_value:
            other = sorted([by_value[value].name, t.name])
            shown = f"{r.stack.over}={value[0]}, {r.fuse.over}={value[1]}" if r.stack and r.fuse else f"{grp.over}={value}"
            raise BindError(f"rules[{i}] groups both {other[0]} and {other[1]} into {name} as {shown}; "
                            f"add the placeholders they differ by to `into`", code=Code.GROUP_DUPLICATE)
        by_value[value] = t
    if r.fuse and not r.stack:
        return [_fuse_parts(i, name, r, by_value, "")]
    if not r.fuse:
        order = _stack_order(list(by_value), name, i, grp.order)
        return [[by_value[v]] for v in order]
    items: dict[str, dict] = {}
    for (s, f), t in by_value.items():
        items.setdefault(s, {})[f] = t
    order = _stack_order(list(items), name, i, grp.order)
    return [_fuse_parts(i, name, r, items[s], f" item {r.stack.over}={s}") for s in order]


def _fuse_parts(i: int, name: str, r: Rule, by_value: dict, where: str) -> list[TensorEntry]:
    missing = [v for v in r.fuse.order if v not in by_value]
    if missing:
        raise BindError(f"rules[{i}] fuses {name}{where} from {r.fuse.order}, but parts {missing} are missing "
                        f"(found {sorted(by_value)})", code=Code.FUSE_INCOMPLETE)
    return [by_value[v] for v in r.fuse.order]


def _stack_order(values: list[str], name: str, i: int, order: list[str] | None) -> list[str]:
    if order:
        missing = [v for v in order if v not in values]
        extra = sorted(set(values) - set(order))
        if missing or extra:
            raise BindError(f"rules[{i}] stacks {name} in order {order}: missing {missing}, unexpected {extra}",
                            code=Code.STACK_INCOMPLETE)
        return list(order)
    if all(map(str.isdigit, values)):
        nums = sorted(map(int, values))
        if nums != list(range(len(nums))):
            gaps = sorted(set(range(nums[-1] + 1)) - set(nums))[:10]
            raise BindError(f"rules[{i}] stacks {name} over indices that are not 0..{len(nums) - 1}: missing {gaps}",
                            code=Code.STACK_INCOMPLETE)
        canonical = list(map(str, nums))  # "7", not "07": then the values are these, in this order
        return canonical if set(canonical) == set(values) else sorted(values, key=int)
    return sorted(values)


def _scale_for(t: TensorEntry, r: Rule, i: int, manifest: Manifest) -> TensorEntry:
    if t.dtype not in FP8_DEQUANTIZABLE:
        raise BindError(f"rules[{i}] dequantizes {t.name}, but it is stored as {t.dtype}; dequantize takes "
                        f"F8_E4M3 or F8_E5M2 (narrow the rule with source_dtype: [F8_E4M3])", code=Code.BAD_DEQUANTIZE)
    if len(t.shape) != 2:
        raise BindError(f"rules[{i}] dequantizes {t.name} of shape {list(t.shape)}; block scales need a 2-D weight",
                        code=Code.BAD_DEQUANTIZE)
    name = r.dequantize.scale.format(name=t.name)
    s = manifest.find(name)
    if s is None:
        raise BindError(f"rules[{i}] dequantizes {t.name} but its scale tensor {name} is not in the checkpoint",
                        code=Code.SCALE_MISSING)
    b = r.dequantize.block
    rows, cols = t.shape
    want = (-(-rows // b), -(-cols // b))
    if s.dtype != "F32" or tuple(s.shape) != want:
        raise BindError(f"scale {name} of {t.name} is {s.dtype} {list(s.shape)}; expected F32 {list(want)} "
                        f"for {b}x{b} blocks of {list(t.shape)}", code=Code.SCALE_SHAPE)
    return s


def _fp4_companions(t: TensorEntry, r: Rule, i: int, manifest: Manifest):
    """(block scale, NVFP4 per-tensor scale or None, further consumed companions present) of an FP4
    weight, each checked against the weight: a missing or misshapen one names both tensors."""
    dq = r.dequantize
    fmt = dq.format
    why = fp4.weight_problem(fmt, tuple(t.shape), t.dtype, r.transpose)
    if why:
        raise BindError(f"rules[{i}] dequantizes {t.name} as {fmt}, but {why} (narrow the rule with "
                        f"source_dtype: [U8] or a tighter match)", code=Code.BAD_DEQUANTIZE)
    if fmt == "mxfp4" and not t.name.endswith(fp4.BLOCKS_SUFFIX):
        raise BindError(f"rules[{i}] dequantizes {t.name} as mxfp4, but MXFP4 weights are named "
                        f"<name>{fp4.BLOCKS_SUFFIX} (narrow the match to *{fp4.BLOCKS_SUFFIX})", code=Code.BAD_DEQUANTIZE)
    values = fp4.template_values(fmt, t.name)
    name = dq.scale.format(**values)
    s = manifest.find(name)
    if s is None:
        raise BindError(f"rules[{i}] dequantizes {t.name} ({fmt}) but its scale tensor {name} is not in the "
                        f"checkpoint", code=Code.SCALE_MISSING)
    want = fp4.scale_shape(fmt, tuple(t.shape))
    sdt = fp4.SCALE_DTYPE[fmt]
    if s.dtype != sdt or tuple(s.shape) != want:
        raise BindError(f"scale {name} of {t.name} is {s.dtype} {list(s.shape)}; expected {sdt} {list(want)} "
                        f"({fmt}: one scale per {fp4.BLOCK[fmt]} values of {t.name} {list(t.shape)})",
                        code=Code.SCALE_SHAPE)
    s2 = None
    if fmt == "nvfp4":
        name2 = dq.scale_2.format(**values)
        s2 = manifest.find(name2)
        if s2 is None:
            raise BindError(f"rules[{i}] dequantizes {t.name} (nvfp4) but its per-tensor scale {name2} is not in "
                            f"the checkpoint", code=Code.SCALE_MISSING)
        if s2.dtype != fp4.SCALE2_DTYPE or not fp4.scale2_ok(tuple(s2.shape)):
            raise BindError(f"scale {name2} of {t.name} is {s2.dtype} {list(s2.shape)}; expected an F32 scalar "
                            f"(shape [] or [1])", code=Code.SCALE_SHAPE)
    extra = [c for c in (manifest.find(n.format(**values)) for n in dq.consume) if c is not None]
    return s, s2, extra

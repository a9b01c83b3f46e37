"""Synthetic GGUF checkpoints (`planc synth --family gguf`), written with the `gguf` package.

A Llama-shaped model under llama.cpp's names (`token_embd.weight`, `blk.{L}.attn_q.weight`, ...,
`output_norm.weight`, `output.weight`) with the metadata llama.cpp reads (`general.architecture`,
`llama.context_length`, `llama.attention.head_count`, ...). `quant` picks the weights' types:

* ``Q8_0``: every 2-D weight Q8_0, norms F32 (llama.cpp's `--outtype q8_0`);
* ``Q4_K_M``: Q4_K, with Q6_K for `output.weight` and for `attn_v` / `ffn_down` of the layers
  llama.cpp's Q4_K_M gives more bits (the first and last eighth, and every third between);
* ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q2_K``, ``Q3_K``, ``Q4_K``, ``Q5_K``, ``Q6_K``, ``IQ4_NL``,
  ``IQ4_XS``: every 2-D weight of that type;
* ``F16``, ``F32``, ``BF16``: plain.

Block bytes come from a seeded pool per type, read at a per-tensor rotation of whole blocks, so any
size is written in bounded memory: Q8_0 and Q4_0 are the `gguf` package's quantization of
normal(0, 0.02) values, and so are Q4_1, Q5_0 and Q5_1; the K-quants and IQ4_NL / IQ4_XS (which the
package cannot quantize) are random bytes with their fp16 scales set to the magnitudes such values
take. Every block is valid and dequantizes to finite values. The presets' dimensions are multiples
of 256 (the K-quants' block); `dims=` takes others, and then, as llama.cpp's quantizer does, a
weight whose rows are not whole blocks of its type falls back to the type llama.cpp picks for it
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K / IQ4_XS -> IQ4_NL), and to F16 when even
that block does not divide its rows.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from planc.base.outputs import partial
from planc.manifest.ggml_types import BY_NAME

QUANTS = ("Q8_0", "Q4_K_M", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
          "IQ4_NL", "IQ4_XS", "F16", "F32", "BF16")
FILE_NAME = "model.gguf"
_POOL_BLOCKS = 65_521  # blocks per pool (prime, so rotations do not line up with rows)
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12,
              "Q4_K_M": 15, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32}
# llama.cpp's quantizer (llama_tensor_get_type): the type a weight takes when its rows are not whole
# blocks of the one asked for
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}


@dataclass(frozen=True)
class GGUFDims:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# smallest first; a size picks the largest preset that gets at least 8 layers
_PRESETS = (
    GGUFDims(256, 4, 2, 512, 512),  # tiny
    GGUFDims(1024, 16, 4, 2816, 32000),
    GGUFDims(2048, 32, 4, 5632, 32000),  # TinyLlama-like
    GGUFDims(4096, 32, 8, 14336, 128256),  # Llama-3-8B-like
)


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: str  # GGML type name (planc spelling)
    shape: tuple[int, ...]  # row-major, as the manifest shows it

    @property
    def nbytes(self) -> int:
        return BY_NAME[self.type].nbytes(math.prod(self.shape))


def _more_bits(layer: int, n: int) -> bool:  # llama.cpp's use_more_bits
    return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2


def _weight_type(quant: str, kind: str, layer: int, n: int, cols: int) -> str:
    t = quant
    if quant == "Q4_K_M":
        t = "Q6_K" if kind == "output" or (kind in ("attn_v", "ffn_down") and _more_bits(layer, n)) else "Q4_K"
    if cols % BY_NAME[t].block:
        t = _FALLBACK.get(t, "F16")
        if cols % BY_NAME[t].block:
            t = "F16"
    return t


def gguf_layout(quant: str, d: GGUFDims, layers: int) -> list[GGUFTensor]:
    norm = "F32"
    kv = d.kv_heads * d.head_dim
    out = [GGUFTensor("token_embd.weight", _weight_type(quant, "token_embd", 0, layers, d.hidden), (d.vocab, d.hidden))]
    for L in range(layers):
        p = f"blk.{L}"
        out.append(GGUFTensor(f"{p}.attn_norm.weight", norm, (d.hidden,)))
        for kind, rows in (("attn_q", d.hidden), ("attn_k", kv), ("attn_v", kv), ("attn_output", d.hidden)):
            out.append(GGUFTensor(f"{p}.{kind}.weight", _weight_type(quant, kind, L, layers, d.hidden), (rows, d.hidden)))
        out.append(GGUFTensor(f"{p}.ffn_norm.weight", norm, (d.hidden,)))
        for kind, shape in (("ffn_gate", (d.intermediate, d.hidden)), ("ffn_up", (d.intermediate, d.hidden)),
                            ("ffn_down", (d.hidden, d.intermediate))):
            out.append(GGUFTensor(f"{p}.{kind}.weight", _weight_type(quant, kind, L, layers, shape[-1]), shape))
    out.append(GGUFTensor("output_norm.weight", norm, (d.hidden,)))
    out.append(GGUFTensor("output.weight", _weight_type(quant, "output", 0, layers, d.hidden), (d.vocab, d.hidden)))
    return out


def _choose(quant: str, size_bytes: int | None, layers: int | None, hidden: int | None = None) -> tuple[GGUFDims, int]:
    """The preset (the largest whose 8 layers fit `size_bytes`, or the one of width `hidden`) and the
    layers that make about `size_bytes`."""
    if hidden is not None:
        best = next((p for p in _PRESETS if p.hidden == hidden), None)
        if best is None:
            raise ValueError(f"no preset of hidden size {hidden}; expected one of "
                             f"{', '.join(str(p.hidden) for p in _PRESETS)}")
        if size_bytes is None:
            return best, layers or 2
    elif size_bytes is None:
        return _PRESETS[0], layers or 2
    else:
        best = _PRESETS[0]
        for p in _PRESETS:
            if sum(t.nbytes for t in gguf_layout(quant, p, 8)) <= size_bytes:
                best = p
    if layers is None:
        fixed = sum(t.nbytes for t in gguf_layout(quant, best, 0))
        per = sum(t.nbytes for t in gguf_layout(quant, best, 1)) - fixed
        layers = max(1, round((size_bytes - fixed) / per))
    return best, layers


@lru_cache(maxsize=None)
def _pool(seed: int, type_name: str) -> bytes:
    """`_POOL_BLOCKS` valid blocks of `type_name` (bytes), the same for a seed."""
    import gguf

    t = BY_NAME[type_name]
    rng = np.random.default_rng([seed, t.id])
    n = _POOL_BLOCKS * t.block
    if type_name in ("F32", "F16", "BF16"):
        x = rng.normal(0.0, 0.02, n).astype(np.float32)
        if type_name == "BF16":
            import ml_dtypes

            return x.astype(ml_dtypes.bfloat16).tobytes()
        return x.astype(np.float16 if type_name == "F16" else np.float32).tobytes()
    if type_name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        x = rng.normal(0.0, 0.02, (_POOL_BLOCKS, t.block)).astype(np.float32)
        return gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name]).tobytes()
    blocks = rng.integers(0, 256, (_POOL_BLOCKS, t.block_bytes), dtype=np.uint8)
    if type_name == "Q4_K":  # d, dmin (f16) then 12 bytes of 6-bit scales, 128 of nibbles
        blocks[:, 0:2] = np.frombuffer(np.float16(0.04 / (63 * 15)).tobytes(), np.uint8)
        blocks[:, 2:4] = np.frombuffer(np.float16(0.04 / 63).tobytes(), np.uint8)
    elif type_name == "Q5_K":  # d, dmin (f16), 12 bytes of 6-bit scales, qh[32], qs[128]
        blocks[:, 0:2] = _half(0.04 / (63 * 31))
        blocks[:, 2:4] = _half(0.04 / 63)
    elif type_name == "Q6_K":  # ql[128] qh[64] int8 scales[16] d (f16)
        blocks[:, 192:208] = (rng.integers(-64, 64, (_POOL_BLOCKS, 16))).astype(np.int8).view(np.uint8)
        blocks[:, 208:210] = np.frombuffer(np.float16(0.02 / (64 * 32)).tobytes(), np.uint8)
    elif type_name == "Q2_K":  # 4-bit scale / min pairs [16], qs[64], d, dmin (f16)
        blocks[:, 80:82] = _half(0.04 / (15 * 3))
        blocks[:, 82:84] = _half(0.04 / 15)
    elif type_name == "Q3_K":  # hmask[32], qs[64], 6-bit scales [12], d (f16)
        blocks[:, 108:110] = _half(0.02 / (32 * 4))
    elif type_name == "IQ4_NL":  # d (f16), 16 bytes of level indices
        blocks[:, 0:2] = _half(0.02 / 127)
    elif type_name == "IQ4_XS":  # d (f16), high scale bits (u16), low scale nibbles [4], 128 bytes of indices
        blocks[:, 0:2] = _half(0.02 / (32 * 127))
    else:
        raise ValueError(f"synth writes no {type_name} blocks")
    return blocks.tobytes()


def _half(x: float) -> np.ndarray:
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


def tensor_bytes(t: GGUFTensor, seed: int = 0) -> np.ndarray:
    """The tensor's stored bytes (uint8): whole pool blocks from a rotation its name picks."""
    gt = BY_NAME[t.type]
    pool = _pool(seed, t.type)
    per = gt.block_bytes
    n_blocks = math.prod(t.shape) // gt.block
    start = int.from_bytes(hashlib.blake2b(t.name.encode(), digest_size=8).digest(), "little") % _POOL_BLOCKS
    src = np.frombuffer(pool, np.uint8).reshape(_POOL_BLOCKS, per)
    idx = (start + np.arange(n_blocks, dtype=np.int64)) % _POOL_BLOCKS
    return src[idx].reshape(-1)


@dataclass(frozen=True)
class GGUFResult:
    path: str
    tensors: int
    total_bytes: int
    data_bytes: int
    quant: str
    layers: int
    dims: GGUFDims


def write_gguf(out_dir: str | os.PathLike, *, quant: str = "Q8_0", size_bytes: int | None = None,
               layers: int | None = None, seed: int = 0, context_length: int = 4096,
               dims: GGUFDims | None = None, hidden: int | None = None) -> GGUFResult:
    """Write `model.gguf` into `out_dir` (created if missing): a Llama-shaped model of `quant` weights
    (`dims`: the model's widths, else the preset of width `hidden`, else the largest preset of
    which 8 layers fit `size_bytes`), of about `size_bytes` where given."""
    import gguf  # not installed: the error comes before the folder is made

    if quant not in QUANTS:
        raise ValueError(f"unknown GGUF quantization {quant!r}; expected one of {', '.join(QUANTS)}")
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    d, n = _choose(quant, size_bytes, layers, hidden)
    if dims is not None:
        d, n = dims, layers or 2
    specs = gguf_layout(quant, d, n)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / FILE_NAME
    if final.exists():
        raise ValueError(f"{final} already exists; use an empty folder")
    with partial(final) as tmp:  # a failed write leaves no partial file
        _write(gguf, tmp, specs, quant, d, n, context_length, seed)
    return GGUFResult(str(final), len(specs), final.stat().st_size, sum(t.nbytes for t in specs), quant, n, d)


def _write(gguf, tmp: Path, specs, quant: str, d, n: int, context_length: int, seed: int) -> None:
    """The GGUF file of `specs` written to `tmp` through the `gguf` package (given)."""
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("planc synthetic llama")
    w.add_context_length(context_length)
    w.add_embedding_length(d.hidden)
    w.add_block_count(n)
    w.add_feed_forward_length(d.intermediate)
    w.add_head_count(d.heads)
    w.add_head_count_kv(d.kv_heads)
    w.add_rope_dimension_count(d.head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(d.vocab)
    w.add_file_type(_FILE_TYPE[quant])
    for t in specs:
        gt = gguf.GGMLQuantizationType[t.type]
        row = t.shape[-1] // BY_NAME[t.type].block * BY_NAME[t.type].block_bytes  # the writer takes byte shapes
        w.add_tensor_info(t.name, (*t.shape[:-1], row), np.dtype(np.uint8), t.nbytes, raw_dtype=gt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in specs:
        w.write_tensor_data(tensor_bytes(t, seed))
    w.close()


__all__ = ["QUANTS", "GGUFDims", "GGUFTensor", "gguf_layout", "tensor_bytes", "write_gguf", "GGUFResult"]

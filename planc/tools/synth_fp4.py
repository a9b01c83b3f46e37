"""Synthetic FP4 checkpoints: the layouts of today's 4-bit releases, with random weights.

* ``mxfp4``: gpt-oss (transformers' GptOss names). Per layer, the experts as one tensor each,
  MXFP4: ``model.layers.{L}.mlp.experts.gate_up_proj_blocks`` U8 ``[E, 2I, H/32, 16]`` with
  ``..._scales`` U8 ``[E, 2I, H/32]`` and ``gate_up_proj_bias`` BF16 ``[E, 2I]``; ``down_proj_blocks``
  ``[E, H, I/32, 16]``, ``down_proj_scales`` ``[E, H, I/32]``, ``down_proj_bias`` ``[E, H]``. Attention
  (q/k/v/o with biases, ``sinks``), the router, norms, embeddings and ``lm_head`` in BF16.
* ``nvfp4``: Llama as NVIDIA ModelOpt exports it: every linear ``weight`` U8 ``[R, C/2]`` with
  ``weight_scale`` F8_E4M3 ``[R, C/16]``, ``weight_scale_2`` F32 ``[]`` and ``input_scale`` F32 ``[]``;
  norms, embeddings and ``lm_head`` in BF16.

`write_gpt_oss` writes a small gpt-oss as transformers reads it: the mxfp4 tensors and a
`config.json` (GptOss, `quantization_config` mxfp4), for `from_pretrained` and `planc.load_into`.

Block bytes are uniform random (every E2M1 pair occurs); scales are drawn from a narrow range
around 1 (E8M0 120..130, E4M3 of 0.25..2), so the model's activations stay finite. Deterministic for
a seed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from planc.base.outputs import partial

FAMILIES = ("mxfp4", "nvfp4")
SINGLE_NAME = "model.safetensors"
METADATA = {"format": "pt"}


@dataclass(frozen=True)
class FP4Dims:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    layers: int


TINY = {"mxfp4": FP4Dims(64, 64, 4, 2, 16, 256, 4, 2), "nvfp4": FP4Dims(64, 96, 4, 2, 16, 256, 0, 2)}
# Near the real models' shapes: gpt-oss-20b's experts (H = I = 2880, 32 experts), Llama-3-8B's MLP.
LARGE = {"mxfp4": FP4Dims(2880, 2880, 64, 8, 64, 4096, 32, 1), "nvfp4": FP4Dims(4096, 14336, 32, 8, 128, 4096, 0, 1)}


def _bf16(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)


def _ones(*shape) -> np.ndarray:
    return np.ones(shape, dtype=ml_dtypes.bfloat16)


def _mx(rng, lead: tuple, cols: int) -> tuple[np.ndarray, np.ndarray]:
    g = cols // 32
    return (rng.integers(0, 256, (*lead, g, 16), dtype=np.uint8),
            rng.integers(120, 131, (*lead, g), dtype=np.uint8))


def _nv(rng, rows: int, cols: int) -> dict[str, np.ndarray]:
    return {"weight": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
            "weight_scale": rng.uniform(0.25, 2.0, (rows, cols // 16)).astype(ml_dtypes.float8_e4m3fn),
            "weight_scale_2": np.array(rng.uniform(0.001, 0.01), dtype=np.float32),
            "input_scale": np.array(rng.uniform(0.01, 0.1), dtype=np.float32)}


def tensors(family: str, d: FP4Dims, seed: int = 0) -> dict[str, np.ndarray]:
    if family not in FAMILIES:
        raise ValueError(f"unknown FP4 family {family!r}; expected one of {', '.join(FAMILIES)}")
    rng = np.random.default_rng(seed)
    h, i, q, kv = d.hidden, d.intermediate, d.heads * d.head_dim, d.kv_heads * d.head_dim
    out = {"model.embed_tokens.weight": _bf16(rng, d.vocab, h), "model.norm.weight": _ones(h),
           "lm_head.weight": _bf16(rng, d.vocab, h)}
    for L in range(d.layers):
        p = f"model.layers.{L}"
        out[f"{p}.input_layernorm.weight"] = _ones(h)
        out[f"{p}.post_attention_layernorm.weight"] = _ones(h)
        shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
        if family == "mxfp4":
            for n, (r, c) in shapes.items():
                out[f"{p}.self_attn.{n}.weight"] = _bf16(rng, r, c)
                out[f"{p}.self_attn.{n}.bias"] = _bf16(rng, r)
            out[f"{p}.self_attn.sinks"] = _bf16(rng, d.heads)
            out[f"{p}.mlp.router.weight"] = _bf16(rng, d.experts, h)
            out[f"{p}.mlp.router.bias"] = _bf16(rng, d.experts)
            e = f"{p}.mlp.experts"
            out[f"{e}.gate_up_proj_blocks"], out[f"{e}.gate_up_proj_scales"] = _mx(rng, (d.experts, 2 * i), h)
            out[f"{e}.gate_up_proj_bias"] = _bf16(rng, d.experts, 2 * i)
            out[f"{e}.down_proj_blocks"], out[f"{e}.down_proj_scales"] = _mx(rng, (d.experts, h), i)
            out[f"{e}.down_proj_bias"] = _bf16(rng, d.experts, h)
        else:
            shapes.update({"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)})
            for n, (r, c) in shapes.items():
                where = "mlp" if n in ("gate_proj", "up_proj", "down_proj") else "self_attn"
                for k, v in _nv(rng, r, c).items():
                    out[f"{p}.{where}.{n}.{k}"] = v
    return out


def layers_for(family: str, d: FP4Dims, size_bytes: int) -> int:
    """Layers that bring a checkpoint of dims `d` near `size_bytes`."""
    one = sum(v.nbytes for v in tensors(family, FP4Dims(**{**asdict(d), "layers": 0})).values())
    per = sum(v.nbytes for k, v in tensors(family, FP4Dims(**{**asdict(d), "layers": 1})).items()) - one
    return max(1, round((size_bytes - one) / per))


def write_fp4_checkpoint(out_dir: str | os.PathLike, family: str, *, layers: int | None = None,
                         size_bytes: int | None = None, experts: int | None = None, seed: int = 0,
                         dims: FP4Dims | None = None):
    """Write `family` (mxfp4 | nvfp4) into `out_dir`/model.safetensors; returns (path, dims).

    Tiny by default; with `size_bytes`, the real models' layer shapes and the layers that reach it."""
    d = dims or (LARGE[family] if size_bytes else TINY[family])
    if experts is not None:
        if family != "mxfp4" or experts < 1:
            raise ValueError("experts is a positive count, and only for the mxfp4 family")
        d = FP4Dims(**{**asdict(d), "experts": experts})
    if size_bytes:
        d = FP4Dims(**{**asdict(d), "layers": layers or layers_for(family, d, size_bytes)})
    elif layers is not None:
        d = FP4Dims(**{**asdict(d), "layers": layers})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .synth import refuse_other_checkpoint

    refuse_other_checkpoint(out, {SINGLE_NAME})
    data = tensors(family, d, seed)
    with partial(out / SINGLE_NAME) as tmp:  # a failed write leaves no partial file
        save_file(data, str(tmp), metadata=METADATA)
        os.chmod(tmp, 0o644)
    (out / "planc-synth.json").write_text(json.dumps({"family": family, **asdict(d)}, indent=2) + "\n")
    return str(out / SINGLE_NAME), d, len(data), (out / SINGLE_NAME).stat().st_size


# A small gpt-oss: H != I (so a transposed layout shows), 8 experts, both attention kinds.
GPT_OSS_SMALL = FP4Dims(256, 128, 8, 2, 32, 1024, 8, 2)


def gpt_oss_config(d: FP4Dims) -> dict:
    """transformers' GptOss `config.json` for dims `d` (the rest: transformers' defaults)."""
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": d.hidden,
            "intermediate_size": d.intermediate, "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "vocab_size": d.vocab,
            "num_local_experts": d.experts, "num_experts_per_tok": min(2, d.experts), "sliding_window": 128,
            "layer_types": ["sliding_attention" if k % 2 == 0 else "full_attention" for k in range(d.layers)],
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}


def write_gpt_oss(out_dir: str | os.PathLike, d: FP4Dims = GPT_OSS_SMALL, seed: int = 0) -> str:
    """Write a gpt-oss of dims `d` (MXFP4 experts) with its `config.json` into `out_dir`; returns the
    safetensors path. Written once: a folder holding this very checkpoint is left as it is."""
    out = Path(out_dir)
    conf = json.dumps(gpt_oss_config(d), indent=2) + "\n"
    if (out / SINGLE_NAME).exists() and (out / "config.json").exists() and (out / "config.json").read_text() == conf:
        return str(out / SINGLE_NAME)
    path, *_ = write_fp4_checkpoint(out, "mxfp4", layers=d.layers, seed=seed, dims=d)
    from ..base.outputs import write

    write(out / "config.json", conf, "gpt-oss config.json")
    return path

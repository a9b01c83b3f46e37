"""Tiny checkpoints of real model families, with the names Hugging Face checkpoints use.

Each builder returns {name: numpy array} (bfloat16 and FP8 as ml_dtypes arrays) for a model of two
layers with small, uneven dims; tests write them with the safetensors package and check the
shipped specs against them (names, shapes, and bytes under the CUDA simulator).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
F8 = ml_dtypes.float8_e4m3fn

# Llama / Mixtral dims: hidden, kv (num_key_value_heads * head_dim), intermediate, vocab, experts
H, KV, I, V, E, LAYERS = 32, 16, 24, 40, 4, 2


def _rng(seed: int):
    return np.random.default_rng(seed)


def _w(rng, *shape, dtype=BF16):
    return (rng.standard_normal(shape) * 0.02).astype(np.float32).astype(dtype)


def _attention(rng, p: str) -> dict:
    return {f"{p}.self_attn.q_proj.weight": _w(rng, H, H), f"{p}.self_attn.k_proj.weight": _w(rng, KV, H),
            f"{p}.self_attn.v_proj.weight": _w(rng, KV, H), f"{p}.self_attn.o_proj.weight": _w(rng, H, H),
            f"{p}.input_layernorm.weight": _w(rng, H), f"{p}.post_attention_layernorm.weight": _w(rng, H)}


def _ends(rng) -> dict:
    return {"model.embed_tokens.weight": _w(rng, V, H), "model.norm.weight": _w(rng, H),
            "lm_head.weight": _w(rng, V, H)}


def llama(seed: int = 0) -> dict:
    rng = _rng(seed)
    out = _ends(rng)
    for L in range(LAYERS):
        p = f"model.layers.{L}"
        out.update(_attention(rng, p))
        out.update({f"{p}.mlp.gate_proj.weight": _w(rng, I, H), f"{p}.mlp.up_proj.weight": _w(rng, I, H),
                    f"{p}.mlp.down_proj.weight": _w(rng, H, I)})
    return out


def mixtral(seed: int = 0, experts: int = E, inter: int = I) -> dict:
    rng = _rng(seed)
    out = _ends(rng)
    for L in range(LAYERS):
        p = f"model.layers.{L}"
        out.update(_attention(rng, p))
        out[f"{p}.block_sparse_moe.gate.weight"] = _w(rng, experts, H)
        for e in range(experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            out.update({f"{q}.w1.weight": _w(rng, inter, H), f"{q}.w2.weight": _w(rng, H, inter),
                        f"{q}.w3.weight": _w(rng, inter, H)})
    return out


# DeepSeek-V3 (MLA attention, layer 0 dense, layer 1 MoE with a shared expert), tiny dims.
DS = {"hidden": 32, "q_lora": 24, "kv_lora": 16, "rope": 8, "heads": 2, "nope": 8, "v": 8, "inter": 40,
      "moe_inter": 16, "experts": 4, "vocab": 40}


def _fp8(rng, out: dict, name: str, rows: int, cols: int) -> None:
    out[name] = (rng.standard_normal((rows, cols)) * 2).astype(np.float32).astype(F8)
    out[f"{name}_scale_inv"] = (rng.random((math.ceil(rows / 128), math.ceil(cols / 128))) * 0.01 + 0.001
                                ).astype(np.float32)


def deepseek_v3(seed: int = 0) -> dict:
    d = DS
    h = d["hidden"]
    rng = _rng(seed)
    out = {"model.embed_tokens.weight": _w(rng, d["vocab"], h), "model.norm.weight": _w(rng, h),
           "lm_head.weight": _w(rng, d["vocab"], h)}
    for L in range(2):
        p = f"model.layers.{L}"
        a = f"{p}.self_attn"
        out[f"{p}.input_layernorm.weight"] = _w(rng, h)
        out[f"{p}.post_attention_layernorm.weight"] = _w(rng, h)
        _fp8(rng, out, f"{a}.q_a_proj.weight", d["q_lora"], h)
        out[f"{a}.q_a_layernorm.weight"] = _w(rng, d["q_lora"])
        _fp8(rng, out, f"{a}.q_b_proj.weight", d["heads"] * (d["nope"] + d["rope"]), d["q_lora"])
        _fp8(rng, out, f"{a}.kv_a_proj_with_mqa.weight", d["kv_lora"] + d["rope"], h)
        out[f"{a}.kv_a_layernorm.weight"] = _w(rng, d["kv_lora"])
        _fp8(rng, out, f"{a}.kv_b_proj.weight", d["heads"] * (d["nope"] + d["v"]), d["kv_lora"])
        _fp8(rng, out, f"{a}.o_proj.weight", h, d["heads"] * d["v"])
        if L == 0:  # first_k_dense_replace = 1
            _fp8(rng, out, f"{p}.mlp.gate_proj.weight", d["inter"], h)
            _fp8(rng, out, f"{p}.mlp.up_proj.weight", d["inter"], h)
            _fp8(rng, out, f"{p}.mlp.down_proj.weight", h, d["inter"])
            continue
        out[f"{p}.mlp.gate.weight"] = _w(rng, d["experts"], h)
        out[f"{p}.mlp.gate.e_score_correction_bias"] = rng.random(d["experts"]).astype(np.float32)
        for e in range(d["experts"]):
            q = f"{p}.mlp.experts.{e}"
            _fp8(rng, out, f"{q}.gate_proj.weight", d["moe_inter"], h)
            _fp8(rng, out, f"{q}.up_proj.weight", d["moe_inter"], h)
            _fp8(rng, out, f"{q}.down_proj.weight", h, d["moe_inter"])
        _fp8(rng, out, f"{p}.mlp.shared_experts.gate_proj.weight", d["moe_inter"], h)
        _fp8(rng, out, f"{p}.mlp.shared_experts.up_proj.weight", d["moe_inter"], h)
        _fp8(rng, out, f"{p}.mlp.shared_experts.down_proj.weight", h, d["moe_inter"])
    return out

"""A GGUF of a transformers Llama, written as llama.cpp's `convert_hf_to_gguf.py` writes it.

`write_llama_from_state(out_dir, state, config, quant="Q8_0")` takes the model's weights as numpy
float32 arrays under transformers' names (`model.layers.0.self_attn.q_proj.weight`, ...) and the
config's values under transformers' keys (`hidden_size`, `num_attention_heads`, ... : a
`LlamaConfig.to_dict()` will do) and writes `out_dir/model.gguf` with the `gguf` package. No torch:
the state is numpy.

What the converter writes for a `LlamaForCausalLM`, and so this writer:

* metadata: `general.architecture = llama`, `general.name`, `llama.context_length`,
  `llama.embedding_length`, `llama.block_count`, `llama.feed_forward_length`,
  `llama.attention.head_count`, `llama.attention.head_count_kv`, `llama.rope.freq_base`,
  `llama.attention.layer_norm_rms_epsilon`, `llama.attention.key_length` / `value_length` (the
  head dim), `general.file_type`, `llama.vocab_size`, `llama.rope.dimension_count`,
  `general.quantization_version` -- every key transformers' GGUF loader
  (`GGUF_CONFIG_MAPPING["llama"]`) turns into the config;
* a tokenizer (`tokenizer.ggml.model = llama`, tokens, scores, token types, bos / eos / unk ids,
  add_bos / add_eos): a state has none, so `tokens` may be given, else a placeholder
  SentencePiece-style vocabulary of `vocab_size` (`<unk>`, `<s>`, `</s>`, the 256 byte tokens, then
  `tok{i}`). transformers builds the model's config without it; llama.cpp needs one to load;
* tensors under llama.cpp's names (the inverse of `planc.manifest.gguf_names.LLAMA`), in the order
  transformers lists them (embedding, each layer, final norm, output); `attn_q` / `attn_k` rows permuted
  (`permute_rows`, with the head count and kv-head count); 1-D tensors (the norms) F32; 2-D weights
  quantized by `gguf.quants.quantize` to `quant` (Q8_0 is the converter's `--outtype q8_0`; Q4_0 is
  offered for tests of that type), a weight whose rows are not whole blocks F16 as the converter
  falls back; `output.weight` absent when the state has no `lm_head.weight` (tied embeddings).

`random_llama_state(config, seed)` makes such a state (normal(0, 0.02) weights, norms near 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from planc.manifest.gguf_names import LLAMA, permute_rows

FILE_NAME = "model.gguf"
QUANTS = ("Q8_0", "Q4_0", "F16", "F32")
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q8_0
_GGUF_NAME = {v: k for k, v in LLAMA.items()}  # transformers -> GGUF, the layer as {L}


def _dims(config: dict) -> dict:
    c = dict(config)
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if c.get(k) is None:
            raise ValueError(f"the config has no {k}")
    c.setdefault("num_key_value_heads", None)
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    c.setdefault("max_position_embeddings", 4096)
    c.setdefault("rms_norm_eps", 1e-6)
    theta = c.get("rope_theta")
    if theta is None:
        theta = (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    c["rope_theta"] = float(theta)
    return c


def gguf_name(name: str) -> str:
    """llama.cpp's name of a transformers Llama tensor (`model.layers.3.mlp.up_proj.weight` ->
    `blk.3.ffn_up.weight`); KeyError for a name the Llama table has not."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        key = ".".join(parts[:2] + ["{L}"] + parts[3:])
        return _GGUF_NAME[key].replace("{L}", parts[2])
    return _GGUF_NAME[name]


def _order(state: dict, layers: int) -> list[str]:
    """The embedding, each layer's tensors as transformers lists them, the final norm, the head."""
    per = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{L}.{p}.weight" for L in range(layers) for p in per]
    names += ["model.norm.weight", "lm_head.weight"]
    return [n for n in names if n in state]


def placeholder_tokens(vocab: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece-style vocabulary of `vocab` entries."""
    import gguf

    T = gguf.TokenType
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    toks, types = toks[:vocab], types[:vocab]
    toks += [f"tok{i}" for i in range(len(toks), vocab)]
    types += [T.NORMAL] * (vocab - len(types))
    scores = [0.0] * 3 + [-1000.0 - i for i in range(vocab - 3)]
    return toks, scores[:vocab], [int(t) for t in types]


def _stored(name: str, w: np.ndarray, quant: str, c: dict):
    """(GGML type, array to write) of one tensor as the converter stores it."""
    import gguf

    w = np.ascontiguousarray(w, dtype=np.float32)
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        w = permute_rows(w, c["num_attention_heads"] if "q_proj" in name else c["num_key_value_heads"])
    if w.ndim <= 1 or quant == "F32":
        return gguf.GGMLQuantizationType.F32, w
    if quant == "F16":
        return gguf.GGMLQuantizationType.F16, w.astype(np.float16)
    qt = gguf.GGMLQuantizationType[quant]
    try:
        return qt, gguf.quants.quantize(w, qt)
    except gguf.QuantError:  # rows not whole blocks: the converter falls back to F16
        return gguf.GGMLQuantizationType.F16, w.astype(np.float16)


def write_llama_from_state(out_dir: str | os.PathLike, state: dict, config: dict, *, quant: str = "Q8_0",
                           name: str = "llama", tokens: list[str] | None = None) -> Path:
    """Write `out_dir/model.gguf` (out_dir created if missing) from a Llama's float32 state dict and config;
    returns the file's path."""
    import gguf

    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; expected one of {', '.join(QUANTS)}")
    c = _dims(config)
    layers = c["num_hidden_layers"]
    names = _order(state, layers)
    extra = sorted(set(state) - set(names) - {f"model.layers.{L}.self_attn.rotary_emb.inv_freq" for L in range(layers)})
    if extra:
        raise ValueError(f"not Llama tensors: {', '.join(extra[:10])}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / FILE_NAME
    tmp = out / f".{FILE_NAME}.partial"
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(int(c["max_position_embeddings"]))
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(_FILE_TYPE[quant])
    w.add_vocab_size(c["vocab_size"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    toks, scores, types = placeholder_tokens(c["vocab_size"])
    if tokens is not None:
        if len(tokens) != c["vocab_size"]:
            raise ValueError(f"{len(tokens)} tokens for a vocab_size of {c['vocab_size']}")
        toks = list(tokens)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for key, setter in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        v = c.get(key, 1 if key == "bos_token_id" else 2)
        if isinstance(v, int) and 0 <= v < c["vocab_size"]:
            setter(v)
    if c["vocab_size"] > 0:
        w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for n in names:
        qt, data = _stored(n, state[n], quant, c)
        w.add_tensor(gguf_name(n), data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, final)
    return final


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, *,
                 context: int = 2048, rms_norm_eps: float = 1e-5, rope_theta: float = 10000.0,
                 tie: bool = False) -> dict:
    """A Llama config as transformers' keys (what `write_llama_from_state` and `LlamaConfig(**...)` take)."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": hidden // heads, "intermediate_size": intermediate, "vocab_size": vocab,
            "max_position_embeddings": context, "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta,
            "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2}


def random_llama_state(config: dict, seed: int = 0) -> dict:
    """A Llama's weights under transformers' names, float32: normal(0, 0.02), norms 1 + normal(0, 0.05)."""
    c = _dims(config)
    rng = np.random.default_rng(seed)
    H, I, V, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def normal(*shape, scale=0.02, mean=0.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(mean))

    s = {"model.embed_tokens.weight": normal(V, H)}
    for L in range(c["num_hidden_layers"]):
        p = f"model.layers.{L}"
        s[f"{p}.input_layernorm.weight"] = normal(H, scale=0.05, mean=1.0)
        s[f"{p}.self_attn.q_proj.weight"] = normal(q, H)
        s[f"{p}.self_attn.k_proj.weight"] = normal(kv, H)
        s[f"{p}.self_attn.v_proj.weight"] = normal(kv, H)
        s[f"{p}.self_attn.o_proj.weight"] = normal(H, q)
        s[f"{p}.post_attention_layernorm.weight"] = normal(H, scale=0.05, mean=1.0)
        s[f"{p}.mlp.gate_proj.weight"] = normal(I, H)
        s[f"{p}.mlp.up_proj.weight"] = normal(I, H)
        s[f"{p}.mlp.down_proj.weight"] = normal(H, I)
    s["model.norm.weight"] = normal(H, scale=0.05, mean=1.0)
    if not config.get("tie_word_embeddings"):
        s["lm_head.weight"] = normal(V, H)
    return s


__all__ = ["write_llama_from_state", "random_llama_state", "llama_config", "gguf_name", "placeholder_tokens",
           "QUANTS", "FILE_NAME"]

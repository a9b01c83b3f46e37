"""A GGUF of a transformers model, written as llama.cpp's `convert_hf_to_gguf.py` writes it, for every
architecture of `planc.manifest.gguf_names.ARCHS` (llama, mistral, qwen2, qwen3, qwen3moe, gemma3).

`write_from_state(out_dir, state, config, arch, quant="Q8_0")` takes the model's weights as numpy
float32 arrays under transformers' names and the config's values under transformers' keys (a
`PretrainedConfig.to_dict()` will do) and writes `out_dir/model.gguf` with the `gguf` package. No
torch: the state is numpy.

What the converter writes, and so this writer:

* metadata: `general.architecture` (`llama` for Mistral too, whose `general.name` then holds
  "mistral", as the converter names Mistral models and as transformers tells them apart), the
  `{arch}.` keys of the architecture's config table (context length, embedding length, block count,
  feed-forward length, head counts, rope base, RMS epsilon, key / value length, vocab size; Llama's
  rope dimension count; Qwen3-MoE's expert count, experts used and expert feed-forward length;
  Gemma 3's sliding window), `general.file_type`, `general.quantization_version`;
* a tokenizer (`tokenizer.ggml.model = llama`, tokens, scores, token types, bos / eos / unk ids):
  a state has none, so `tokens` may be given, else a placeholder vocabulary of `vocab_size`;
* tensors under llama.cpp's names, in the order transformers lists them: Llama's `attn_q` /
  `attn_k` rows permuted (`permute_rows`); Gemma's RMSNorm weights stored plus one (`Arch.norm_shift`,
  every `*norm.weight`); Qwen3-MoE's fused `gate_up_proj` [E, 2I, H] written as its two halves
  `ffn_gate_exps`, `ffn_up_exps` [E, I, H]; 1-D tensors and the MoE router (`ffn_gate_inp`) F32; other
  weights quantized by `gguf.quants.quantize` to `quant` (Q8_0 is the converter's `--outtype q8_0`),
  a weight whose rows are not whole blocks F16 as the converter falls back; `output.weight` absent
  when the state has no `lm_head.weight` (tied embeddings).

`random_state(arch, config, seed)` makes such a state (normal(0, 0.02) weights, norms near 1; Gemma's
near 0, since its norm scales by 1 + w).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from planc.base.outputs import partial
from planc.manifest.gguf_names import ARCHS, permute_rows

FILE_NAME = "model.gguf"
QUANTS = ("Q8_0", "Q4_0", "F16", "F32")
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q8_0


def _inverse(arch: str) -> dict:
    """transformers name (the layer as {L}) -> GGUF name; a fused tensor maps to None (it is split)."""
    a = ARCHS[arch]
    fused = {f[0] for f in a.fused}
    return {v: (None if v in fused else k) for k, v in a.names.items()}


def dims(config: dict) -> dict:
    """The config with the values every architecture needs filled in as transformers would."""
    c = dict(config)
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if c.get(k) is None:
            raise ValueError(f"the config has no {k}")
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    c.setdefault("intermediate_size", 4 * c["hidden_size"])
    c.setdefault("max_position_embeddings", 4096)
    c.setdefault("rms_norm_eps", 1e-6)
    theta = c.get("rope_theta")
    if theta is None:
        rp = c.get("rope_parameters") or {}
        rp = rp.get("full_attention", rp) if isinstance(rp.get("full_attention"), dict) else rp
        theta = rp.get("rope_theta", 10000.0)
    c["rope_theta"] = float(theta)
    return c


def gguf_name(name: str, arch: str = "llama") -> str:
    """llama.cpp's name of a transformers tensor (`model.layers.3.mlp.up_proj.weight` ->
    `blk.3.ffn_up.weight`); KeyError for a name the architecture's table has not, or a fused one."""
    inv = _inverse(arch)
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        key = ".".join(parts[:2] + ["{L}"] + parts[3:])
        g = inv[key]
        if g is None:
            raise KeyError(f"{name} is fused from two GGUF tensors")
        return g.replace("{L}", parts[2])
    g = inv[name]
    if g is None:
        raise KeyError(f"{name} is fused from two GGUF tensors")
    return g


def _names(state: dict, arch: str, layers: int) -> list[str]:
    """The state's names in transformers' order: the embedding, each layer's tensors as the table
    lists them, the final norm, the head."""
    table = ARCHS[arch].names
    per = list(dict.fromkeys(v.split("{L}.", 1)[1] for v in table.values() if "{L}" in v))
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{L}.{p}" for L in range(layers) for p in per]
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


def stored(gname: str, w: np.ndarray, quant: str, c: dict, arch: str):
    """(GGML type, array to write) of one tensor under its GGUF name as the converter stores it."""
    import gguf

    a = ARCHS[arch]
    w = np.ascontiguousarray(w, dtype=np.float32)
    kind = gname.split(".")[-2]
    if a.permuted and kind in ("attn_q", "attn_k") and gname.endswith(".weight"):
        w = permute_rows(w, c["num_attention_heads"] if kind == "attn_q" else c["num_key_value_heads"])
    if a.norm_shift and gname.endswith("norm.weight"):
        w = w + np.float32(a.norm_shift)
    if w.ndim <= 1 or quant == "F32" or kind == "ffn_gate_inp":
        return gguf.GGMLQuantizationType.F32, w
    if quant == "F16":
        return gguf.GGMLQuantizationType.F16, w.astype(np.float16)
    qt = gguf.GGMLQuantizationType[quant]
    try:
        return qt, gguf.quants.quantize(w, qt)
    except gguf.QuantError:  # rows not whole blocks: the converter falls back to F16
        return gguf.GGMLQuantizationType.F16, w.astype(np.float16)


def _tensors(state: dict, arch: str, layers: int):
    """(GGUF name, float32 array as transformers holds it) of every tensor, in the file's order."""
    a = ARCHS[arch]
    fused = {f[0]: f for f in a.fused}
    for n in _names(state, arch, layers):
        parts = n.split(".")
        key = ".".join(parts[:2] + ["{L}"] + parts[3:]) if parts[1:2] == ["layers"] else n
        if key in fused:
            _, halves, dim = fused[key]
            for g, piece in zip(halves, np.split(np.asarray(state[n]), len(halves), axis=dim)):
                yield g.replace("{L}", parts[2]), piece
        else:
            yield gguf_name(n, arch), state[n]


def write_from_state(out_dir: str | os.PathLike, state: dict, config: dict, arch: str = "llama", *,
                     quant: str = "Q8_0", name: str | None = None, tokens: list[str] | None = None,
                     quants: dict | None = None) -> Path:
    """Write `out_dir/model.gguf` (out_dir created if missing) from a model's float32 state dict and
    config; returns the file's path. `quants`: GGUF name -> the quantization of that tensor, in place
    of `quant` (as llama.cpp's mixes store some tensors in another type)."""
    import gguf

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(sorted(ARCHS))}")
    for q in (quant, *(quants or {}).values()):
        if q not in QUANTS:
            raise ValueError(f"unknown quantization {q!r}; expected one of {', '.join(QUANTS)}")
    a = ARCHS[arch]
    c = dims(config)
    layers = c["num_hidden_layers"]
    names = _names(state, arch, layers)
    extra = sorted(set(state) - set(names) - {f"model.layers.{L}.self_attn.rotary_emb.inv_freq" for L in range(layers)})
    if extra:
        raise ValueError(f"not {arch} tensors: {', '.join(extra[:10])}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / FILE_NAME
    with partial(final) as tmp:  # a failed write leaves no partial file
        w = gguf.GGUFWriter(str(tmp), a.gguf)
        w.add_name(name or ("mistral" if arch == "mistral" else arch))
        w.add_block_count(layers)
        w.add_context_length(int(c["max_position_embeddings"]))
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(int(c["intermediate_size"]))
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_freq_base(c["rope_theta"])
        w.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        if a.permuted:
            w.add_rope_dimension_count(c["head_dim"])
        if arch == "qwen3moe":
            w.add_expert_count(int(c["num_experts"]))
            w.add_expert_used_count(int(c["num_experts_per_tok"]))
            w.add_expert_feed_forward_length(int(c["moe_intermediate_size"]))
        if arch == "gemma3" and c.get("sliding_window") is not None:
            w.add_sliding_window(int(c["sliding_window"]))
        w.add_file_type(_FILE_TYPE[quant])
        w.add_vocab_size(c["vocab_size"])
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
        for g, data in _tensors(state, arch, layers):
            qt, arr = stored(g, data, (quants or {}).get(g, quant), c, arch)
            w.add_tensor(g, arr, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return final


def config_of(arch: str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, *,
              head_dim: int | None = None, experts: int = 4, experts_used: int = 2, moe_intermediate: int = 768,
              context: int = 2048, rms_norm_eps: float = 1e-6, rope_theta: float = 10000.0,
              tie: bool = False) -> dict:
    """A config under transformers' keys for `arch` (what `write_from_state` and the model type's config
    class take). Qwen3's head dim, and Qwen3-MoE's expert width, are what transformers' GGUF loader
    assumes (it reads neither from the file): 128 and 768 unless given."""
    a = ARCHS[arch]
    if head_dim is None:
        head_dim = 128 if arch == "qwen3" else (256 if arch == "gemma3" else hidden // heads)
    c = {"model_type": a.model_type, "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
         "intermediate_size": intermediate, "vocab_size": vocab, "max_position_embeddings": context,
         "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta, "tie_word_embeddings": tie,
         "bos_token_id": 1, "eos_token_id": 2}
    if arch == "qwen3moe":
        c.update(num_experts=experts, num_experts_per_tok=experts_used, moe_intermediate_size=moe_intermediate,
                 norm_topk_prob=True)
    if arch == "gemma3":
        c.update(tie_word_embeddings=True, sliding_window=512)
    return c


def random_state(arch: str, config: dict, seed: int = 0) -> dict:
    """A model's weights under transformers' names, float32: normal(0, 0.02); norms 1 + normal(0, 0.05)
    (Gemma's normal(0, 0.05): its norm scales by 1 + w); biases normal(0, 0.02)."""
    a = ARCHS[arch]
    c = dims(config)
    rng = np.random.default_rng(seed)
    H, I, V, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    E, mI = c.get("num_experts", 0), c.get("moe_intermediate_size", 0)
    norm_mean = 0.0 if a.norm_shift else 1.0

    def normal(*shape, scale=0.02, mean=0.0):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(mean)

    shapes = {"self_attn.q_proj.weight": (q, H), "self_attn.k_proj.weight": (kv, H), "self_attn.v_proj.weight": (kv, H),
              "self_attn.o_proj.weight": (H, q), "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
              "self_attn.v_proj.bias": (kv,), "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
              "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I),
              "mlp.gate.weight": (E, H), "mlp.experts.gate_up_proj": (E, 2 * mI, H),
              "mlp.experts.down_proj": (E, H, mI)}
    s = {"model.embed_tokens.weight": normal(V, H)}
    for L in range(c["num_hidden_layers"]):
        for n in _names({f"model.layers.{L}.{v.split('{L}.', 1)[1]}": 0 for v in a.names.values() if "{L}" in v},
                        arch, L + 1):
            leaf = n.split(".", 3)[3]
            if leaf.endswith("norm.weight") or leaf.endswith("layernorm.weight"):
                s[n] = normal(hd if "_norm" in leaf and "self_attn" in leaf else H, scale=0.05, mean=norm_mean)
            else:
                s[n] = normal(*shapes[leaf])
    s["model.norm.weight"] = normal(H, scale=0.05, mean=norm_mean)
    if not config.get("tie_word_embeddings"):
        s["lm_head.weight"] = normal(V, H)
    return s


__all__ = ["write_from_state", "random_state", "config_of", "gguf_name", "placeholder_tokens", "stored", "dims",
           "QUANTS", "FILE_NAME"]

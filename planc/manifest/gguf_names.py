"""GGUF tensor names -> transformers' names, and the q/k row order llama.cpp gives Llama attention.

`transformers_config(metadata, tensor_names)` -> the keyword arguments of transformers' `LlamaConfig`
for the file, read from planc's header as transformers' GGUF loader reads it.

`transformers_name(gguf_name, arch)` -> the name transformers' model class uses (`blk.3.attn_q.weight`
-> `model.layers.3.self_attn.q_proj.weight`), or None for a tensor transformers does not load
(`rope_freqs.weight`). The table is the inverse of the `gguf` package's `TensorNameMap` for the
architecture (the map transformers' own GGUF loading inverts); a test holds them equal on every name.

llama.cpp's converter permutes the rows of a Llama's `attn_q` and `attn_k` weights so that each
head's rotary pairs sit side by side: with `hd` the head dim, head h's rows `(j, i)` (j < 2,
i < hd/2, in transformers' order) are stored as row `(i, j)`. `unpermute_rows(w, n_head)` restores
transformers' order; `permute_rows` is the converter's (for tests and for writing files). Both take
the rows as stored (row-major, any row width or dtype, a GGUF quantized tensor's rows of blocks
included: the permutation moves whole rows). For `attn_q` n_head is `llama.attention.head_count`,
for `attn_k` `llama.attention.head_count_kv`.
"""

from __future__ import annotations

import re

import numpy as np

# GGUF name (the layer as {L}) -> transformers name, for the Llama family (llama, mistral-style).
LLAMA = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{L}.attn_norm.weight": "model.layers.{L}.input_layernorm.weight",
    "blk.{L}.attn_q.weight": "model.layers.{L}.self_attn.q_proj.weight",
    "blk.{L}.attn_k.weight": "model.layers.{L}.self_attn.k_proj.weight",
    "blk.{L}.attn_v.weight": "model.layers.{L}.self_attn.v_proj.weight",
    "blk.{L}.attn_output.weight": "model.layers.{L}.self_attn.o_proj.weight",
    "blk.{L}.ffn_norm.weight": "model.layers.{L}.post_attention_layernorm.weight",
    "blk.{L}.ffn_gate.weight": "model.layers.{L}.mlp.gate_proj.weight",
    "blk.{L}.ffn_up.weight": "model.layers.{L}.mlp.up_proj.weight",
    "blk.{L}.ffn_down.weight": "model.layers.{L}.mlp.down_proj.weight",
}
# GGUF tensors with no transformers parameter (computed by the model from its config).
LLAMA_UNLOADED = ("rope_freqs.weight",)
# The tensors whose rows llama.cpp permutes, and the metadata key giving each one's head count.
LLAMA_PERMUTED = {"attn_q": "llama.attention.head_count", "attn_k": "llama.attention.head_count_kv"}

# llama.cpp's metadata key (after "llama.") -> transformers' config key, and its type: the table
# transformers' own GGUF loader applies (its GGUF_CONFIG_MAPPING["llama"]).
LLAMA_CONFIG = {
    "context_length": ("max_position_embeddings", int),
    "block_count": ("num_hidden_layers", int),
    "feed_forward_length": ("intermediate_size", int),
    "embedding_length": ("hidden_size", int),
    "rope.dimension_count": ("head_dim", int),
    "rope.freq_base": ("rope_theta", float),
    "attention.head_count": ("num_attention_heads", int),
    "attention.head_count_kv": ("num_key_value_heads", int),
    "attention.layer_norm_rms_epsilon": ("rms_norm_eps", float),
    "vocab_size": ("vocab_size", int),
}

TABLES = {"llama": LLAMA}
_UNLOADED = {"llama": LLAMA_UNLOADED}
_COMPILED: dict = {}


def _patterns(arch: str) -> list:
    got = _COMPILED.get(arch)
    if got is None:
        got = _COMPILED[arch] = [(re.compile("^" + re.escape(g).replace(r"\{L\}", r"(?P<L>\d+)") + "$"), t)
                                 for g, t in TABLES[arch].items()]
    return got


def transformers_name(gguf_name: str, arch: str = "llama") -> str | None:
    """transformers' name of a GGUF tensor, or None for a tensor it does not load; KeyError for a
    name the table does not know, ValueError for an architecture it has no table for."""
    if arch not in TABLES:
        raise ValueError(f"no GGUF name table for architecture {arch!r} (known: {', '.join(sorted(TABLES))})")
    if gguf_name in _UNLOADED[arch]:
        return None
    for rx, target in _patterns(arch):
        m = rx.match(gguf_name)
        if m:
            return target.format(**m.groupdict())
    raise KeyError(f"{gguf_name}: not a {arch} tensor name GGUF uses")


def transformers_config(metadata: dict, tensor_names, arch: str = "llama") -> dict:
    """The transformers config (as keyword arguments of `LlamaConfig`) of a GGUF Llama, from the header
    planc read (`Manifest.shards[0].metadata`, values as text): the keys transformers' GGUF loader
    reads, with their values as it reads them, and `tie_word_embeddings` when the file has no
    `output.weight`. The same config as `AutoConfig.from_pretrained(dir, gguf_file=...)` without
    parsing the header again in Python (its tokenizer arrays are what takes that one seconds)."""
    if arch != "llama" or metadata.get("general.architecture") != "llama":
        raise ValueError(f"no config table for a GGUF of architecture {metadata.get('general.architecture')!r}")
    out = {"model_type": "llama", "tie_word_embeddings": "output.weight" not in set(tensor_names)}
    for key, (name, kind) in LLAMA_CONFIG.items():
        v = metadata.get(f"llama.{key}")
        if v is not None:
            out[name] = kind(v)
    return out


def permuted_heads(gguf_name: str, metadata: dict, arch: str = "llama") -> int | None:
    """The head count whose rows llama.cpp permuted in this tensor, or None when it is not permuted."""
    if arch != "llama":
        return None
    m = re.match(r"^blk\.\d+\.(attn_q|attn_k)\.weight$", gguf_name)
    if not m:
        return None
    key = LLAMA_PERMUTED[m.group(1)]
    v = metadata.get(key)
    if v is None and m.group(1) == "attn_k":
        v = metadata.get(LLAMA_PERMUTED["attn_q"])  # no head_count_kv: as many kv heads as heads
    if v is None:
        raise KeyError(f"{gguf_name}: the metadata has no {key}, which the row order depends on")
    text = str(v)
    if not re.fullmatch(r"[0-9]{1,10}", text):  # metadata values are text: an integer, or anything else
        raise ValueError(f"{key} is {text[:40]!r}, not a count of heads")
    return int(text)


def _check(rows: int, n_head: int) -> int:
    if n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        raise ValueError(f"{rows} rows are not {n_head} heads of an even head dim")
    return rows // n_head


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's order from transformers': head h's row (j, i) -> (i, j)."""
    hd = _check(w.shape[0], n_head)
    rest = w.shape[1:]
    return w.reshape(n_head, 2, hd // 2, *rest).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' order from llama.cpp's: head h's row (i, j) -> (j, i)."""
    hd = _check(w.shape[0], n_head)
    rest = w.shape[1:]
    return w.reshape(n_head, hd // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def source_rows(rows: int, n_head: int) -> np.ndarray:
    """For each row of transformers' order, the stored row it comes from (a gather index)."""
    return unpermute_rows(np.arange(rows, dtype=np.int64), n_head)


__all__ = ["transformers_name", "transformers_config", "permuted_heads", "permute_rows", "unpermute_rows", "source_rows", "TABLES"]

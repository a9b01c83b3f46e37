"""GGUF tensor names -> transformers' names, per architecture; the config; the q/k row order llama.cpp
gives Llama attention.

`ARCHS`: the architectures planc maps into transformers modules (llama, mistral, qwen2, qwen3,
qwen3moe, gemma3), each an `Arch`: its name table, config table, and how llama.cpp stored its values
(Llama's permuted q/k rows, Gemma's norms plus one, Qwen3-MoE's experts in two stacked tensors that
transformers fuses). `arch_of(metadata)` picks one from a file's header as transformers does.

`transformers_config(metadata, tensor_names)` -> the keyword arguments of the model type's config
class (`LlamaConfig`, `Qwen3MoeConfig`, ...) for the file, read from planc's header as transformers'
GGUF loader reads it.

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
from dataclasses import dataclass

import numpy as np

# GGUF name (the layer as {L}) -> transformers name, for the Llama family (llama; Mistral, which
# llama.cpp writes as a llama file and transformers tells apart by "mistral" in general.name).
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
# Qwen2: Llama's tensors plus q/k/v biases (llama.cpp keeps its rows in transformers' order).
QWEN2 = {**LLAMA, **{f"blk.{{L}}.attn_{x}.bias": f"model.layers.{{L}}.self_attn.{x}_proj.bias" for x in "qkv"}}
# Qwen3: Llama's tensors plus the per-head q/k RMSNorms.
QWEN3 = {**LLAMA, "blk.{L}.attn_q_norm.weight": "model.layers.{L}.self_attn.q_norm.weight",
         "blk.{L}.attn_k_norm.weight": "model.layers.{L}.self_attn.k_norm.weight"}
# Qwen3-MoE: Qwen3's attention; the router and the experts stacked by llama.cpp ([E, I, H] each) in
# place of the MLP. transformers 5 holds the experts fused: gate_up_proj [E, 2I, H] is ffn_gate_exps and
# ffn_up_exps concatenated along dim 1 (a spec's `fuse: {over: W, order: [gate, up], dim: 1}`).
QWEN3MOE = {**{k: v for k, v in QWEN3.items() if ".ffn_" not in k},
            "blk.{L}.ffn_gate_inp.weight": "model.layers.{L}.mlp.gate.weight",
            "blk.{L}.ffn_gate_exps.weight": "model.layers.{L}.mlp.experts.gate_up_proj",
            "blk.{L}.ffn_up_exps.weight": "model.layers.{L}.mlp.experts.gate_up_proj",
            "blk.{L}.ffn_down_exps.weight": "model.layers.{L}.mlp.experts.down_proj",
            "blk.{L}.ffn_norm.weight": "model.layers.{L}.post_attention_layernorm.weight"}
# Gemma 3 (its text model): four norms a layer and the q/k norms; no output.weight (tied embeddings).
# llama.cpp stores every RMSNorm weight plus one (Gemma's norm scales by 1 + w); transformers' loader
# subtracts it again: the shipped spec's `add: -1` on each `*norm.weight` (NORM_SHIFTED).
GEMMA3 = {k: v for k, v in QWEN3.items() if k != "output.weight"}
GEMMA3.update({"blk.{L}.post_attention_norm.weight": "model.layers.{L}.post_attention_layernorm.weight",
               "blk.{L}.ffn_norm.weight": "model.layers.{L}.pre_feedforward_layernorm.weight",
               "blk.{L}.post_ffw_norm.weight": "model.layers.{L}.post_feedforward_layernorm.weight"})

# GGUF tensors with no transformers parameter (computed by the model from its config).
LLAMA_UNLOADED = ("rope_freqs.weight",)
# The tensors whose rows llama.cpp permutes (Llama-family files only), and the metadata key giving
# each one's head count.
LLAMA_PERMUTED = {"attn_q": "llama.attention.head_count", "attn_k": "llama.attention.head_count_kv"}

# llama.cpp's metadata key (after "{arch}.") -> transformers' config key, and its type: the tables
# transformers' own GGUF loader applies (its GGUF_CONFIG_MAPPING[model type]).
_COMMON_CONFIG = {
    "context_length": ("max_position_embeddings", int),
    "block_count": ("num_hidden_layers", int),
    "feed_forward_length": ("intermediate_size", int),
    "embedding_length": ("hidden_size", int),
    "rope.freq_base": ("rope_theta", float),
    "attention.head_count": ("num_attention_heads", int),
    "attention.head_count_kv": ("num_key_value_heads", int),
    "attention.layer_norm_rms_epsilon": ("rms_norm_eps", float),
    "vocab_size": ("vocab_size", int),
}
LLAMA_CONFIG = {**_COMMON_CONFIG, "rope.dimension_count": ("head_dim", int)}
QWEN_CONFIG = dict(_COMMON_CONFIG)  # qwen2, qwen3: the head dim is the config's (Qwen3's default 128)
QWEN3MOE_CONFIG = {**_COMMON_CONFIG, "attention.key_length": ("head_dim", int),
                   "expert_count": ("num_experts", int), "expert_used_count": ("num_experts_per_tok", int)}
GEMMA3_CONFIG = {**_COMMON_CONFIG, "attention.key_length": ("head_dim", int),
                 "attention.sliding_window": ("sliding_window", int)}


# The tokenizer's special ids transformers' GGUF loader puts into the config (its "tokenizer" table),
# for every architecture.
TOKEN_IDS = {"tokenizer.ggml.bos_token_id": "bos_token_id", "tokenizer.ggml.eos_token_id": "eos_token_id",
             "tokenizer.ggml.unknown_token_id": "unk_token_id", "tokenizer.ggml.padding_token_id": "pad_token_id"}


@dataclass(frozen=True)
class Arch:
    """What planc knows of one GGUF architecture: its names, config and stored-value conventions."""

    gguf: str  # general.architecture as llama.cpp writes it
    model_type: str  # transformers' model type of the config
    names: dict  # GGUF name -> transformers name (the layer as {L})
    config: dict  # metadata key after "{gguf}." -> (config key, type)
    defaults: dict  # config values transformers' loader sets when the file has none
    permuted: bool = False  # q/k rows in llama.cpp's rotary order (`unpermute`)
    norm_shift: float = 0.0  # what llama.cpp added to each RMSNorm weight
    fused: tuple = ()  # (transformers name, GGUF names in concatenation order, dim) of fused tensors


ARCHS = {
    "llama": Arch("llama", "llama", LLAMA, LLAMA_CONFIG, {}, permuted=True),
    "mistral": Arch("llama", "mistral", LLAMA, LLAMA_CONFIG, {}, permuted=True),
    "qwen2": Arch("qwen2", "qwen2", QWEN2, QWEN_CONFIG, {}),
    "qwen3": Arch("qwen3", "qwen3", QWEN3, QWEN_CONFIG, {}),
    "qwen3moe": Arch("qwen3moe", "qwen3_moe", QWEN3MOE, QWEN3MOE_CONFIG, {"norm_topk_prob": True},
                     fused=(("model.layers.{L}.mlp.experts.gate_up_proj",
                             ("blk.{L}.ffn_gate_exps.weight", "blk.{L}.ffn_up_exps.weight"), 1),)),
    "gemma3": Arch("gemma3", "gemma3_text", GEMMA3, GEMMA3_CONFIG, {}, norm_shift=1.0),
}
TABLES = {name: a.names for name, a in ARCHS.items()}
_COMPILED: dict = {}


def arch_of(metadata: dict) -> Arch:
    """The architecture of a GGUF file from its header (values as text), as transformers' loader
    tells them apart: a llama file whose general.name holds "mistral" is a Mistral."""
    gguf = str(metadata.get("general.architecture", ""))
    if gguf == "llama" and "mistral" in str(metadata.get("general.name", "")):
        return ARCHS["mistral"]
    for a in ARCHS.values():
        if a.gguf == gguf:
            return a
    raise ValueError(f"no tables for a GGUF of architecture {gguf[:40]!r} (known: "
                     f"{', '.join(sorted({a.gguf for a in ARCHS.values()}))})")


def _arch(arch: str) -> Arch:
    if arch not in ARCHS:
        raise ValueError(f"no GGUF name table for architecture {arch!r} (known: {', '.join(sorted(ARCHS))})")
    return ARCHS[arch]


def _patterns(arch: str) -> list:
    got = _COMPILED.get(arch)
    if got is None:
        got = _COMPILED[arch] = [(re.compile("^" + re.escape(g).replace(r"\{L\}", r"(?P<L>\d+)") + "$"), t)
                                 for g, t in TABLES[arch].items()]
    return got


def transformers_name(gguf_name: str, arch: str = "llama") -> str | None:
    """transformers' name of a GGUF tensor, or None for a tensor it does not load; KeyError for a
    name the table does not know, ValueError for an architecture it has no table for. The two
    halves of a fused tensor (Qwen3-MoE's ffn_gate_exps, ffn_up_exps) both give the fused name."""
    _arch(arch)
    if gguf_name in LLAMA_UNLOADED:
        return None
    for rx, target in _patterns(arch):
        m = rx.match(gguf_name)
        if m:
            return target.format(**m.groupdict())
    raise KeyError(f"{gguf_name}: not a {arch} tensor name GGUF uses")


def transformers_config(metadata: dict, tensor_names, arch: str | None = None) -> dict:
    """The transformers config (as keyword arguments of the model type's config class) of a GGUF file,
    from the header planc read (`Manifest.shards[0].metadata`, values as text): the keys transformers'
    GGUF loader reads, with their values as it reads them (the tokenizer's bos / eos / unknown /
    padding ids too), its defaults for the model type, and `tie_word_embeddings` when the file has
    no `output.weight`. The same config as
    `AutoConfig.from_pretrained(dir, gguf_file=...)` without parsing the header again in Python (its
    tokenizer arrays are what takes that one seconds). `arch`: the ARCHS key (None: from the header);
    a header of another architecture is refused."""
    a = arch_of(metadata) if arch is None else _arch(arch)
    found = str(metadata.get("general.architecture"))
    if found != a.gguf:
        raise ValueError(f"no config table for a GGUF of architecture {found[:40]!r} as {arch!r}")
    out = {"model_type": a.model_type, "tie_word_embeddings": "output.weight" not in set(tensor_names)}
    out.update(a.defaults)
    for key, (name, kind) in a.config.items():
        v = metadata.get(f"{a.gguf}.{key}")
        if v is not None:
            out[name] = kind(v)
    for key, name in TOKEN_IDS.items():
        v = metadata.get(key)
        if v is not None and re.fullmatch(r"[0-9]{1,10}", str(v)):
            out[name] = int(str(v))
    return out


def permuted_heads(gguf_name: str, metadata: dict, arch: str = "llama") -> int | None:
    """The head count whose rows llama.cpp permuted in this tensor, or None when it is not permuted."""
    if not _arch(arch).permuted:
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


__all__ = ["ARCHS", "Arch", "arch_of", "transformers_name", "transformers_config", "permuted_heads", "permute_rows", "unpermute_rows", "source_rows", "TABLES"]

"""A GGUF of a transformers Llama, written as llama.cpp's `convert_hf_to_gguf.py` writes it (the Llama
case of `planc.tools.gguf_model`, which writes every architecture planc maps).

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

from planc.tools.gguf_model import FILE_NAME, QUANTS, config_of, placeholder_tokens, random_state, write_from_state
from planc.tools.gguf_model import gguf_name as _gguf_name


def gguf_name(name: str) -> str:
    """llama.cpp's name of a transformers Llama tensor (`model.layers.3.mlp.up_proj.weight` ->
    `blk.3.ffn_up.weight`); KeyError for a name the Llama table has not."""
    return _gguf_name(name, "llama")


def write_llama_from_state(out_dir: str | os.PathLike, state: dict, config: dict, *, quant: str = "Q8_0",
                           name: str = "llama", tokens: list[str] | None = None) -> Path:
    """Write `out_dir/model.gguf` (out_dir created if missing) from a Llama's float32 state dict and config;
    returns the file's path."""
    if config.get("intermediate_size") is None:
        raise ValueError("the config has no intermediate_size")
    try:
        return write_from_state(out_dir, state, config, "llama", quant=quant, name=name, tokens=tokens)
    except ValueError as e:
        raise ValueError(str(e).replace("not llama tensors", "not Llama tensors")) from None


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, *,
                 context: int = 2048, rms_norm_eps: float = 1e-5, rope_theta: float = 10000.0,
                 tie: bool = False) -> dict:
    """A Llama config as transformers' keys (what `write_llama_from_state` and `LlamaConfig(**...)` take)."""
    c = config_of("llama", hidden, layers, heads, kv_heads, intermediate, vocab, context=context,
                  rms_norm_eps=rms_norm_eps, rope_theta=rope_theta, tie=tie)
    return {"architectures": ["LlamaForCausalLM"], **c}


def random_llama_state(config: dict, seed: int = 0) -> dict:
    """A Llama's weights under transformers' names, float32: normal(0, 0.02), norms 1 + normal(0, 0.05)."""
    return random_state("llama", config, seed)


__all__ = ["write_llama_from_state", "random_llama_state", "llama_config", "gguf_name", "placeholder_tokens",
           "QUANTS", "FILE_NAME"]

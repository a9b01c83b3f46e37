"""planc.tools.gguf_llama writes a transformers Llama's weights as llama.cpp's converter writes them:
planc's reader reads the file back, every name maps to the transformers name it came from, the
metadata holds every key transformers' GGUF loader builds the config from, the 2-D weights are the
`gguf` package's quantization of the rows in llama.cpp's q/k order, and the shipped spec loads them
(CUDA simulator) as transformers' GGUF load makes them: the package's float32 dequantization, rows
permuted back, rounded once to bfloat16. No torch."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from execute_support import SMALL_IO, load_checked  # noqa: E402
from planc.execute.kernels.gguf_dequant import dequantize  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402
from planc.manifest.gguf_names import permute_rows, transformers_name, unpermute_rows  # noqa: E402
from planc.tools.gguf_llama import (gguf_name, llama_config, placeholder_tokens, random_llama_state,  # noqa: E402
                                    write_llama_from_state)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = llama_config(64, 2, 4, 2, 96, 300, context=512, rms_norm_eps=1e-6, rope_theta=500000.0)
# The device case's model: the simulated kernels run every element in Python threads; this one has a
# fifth of CONFIG's elements, every kind of tensor and the q/k permutation still.
DEVICE_CONFIG = llama_config(64, 1, 4, 2, 32, 32, context=512, rms_norm_eps=1e-6, rope_theta=500000.0)
# transformers' GGUF_CONFIG_MAPPING["llama"]: the keys its loader turns into the config
TX_KEYS = ("context_length", "block_count", "feed_forward_length", "embedding_length", "rope.dimension_count",
           "rope.freq_base", "attention.head_count", "attention.head_count_kv",
           "attention.layer_norm_rms_epsilon", "vocab_size")


@pytest.fixture(scope="module")
def state():
    return random_llama_state(CONFIG, seed=3)


def _field(reader, key):
    f = reader.fields[key]
    return f.contents()


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0"])
def test_the_file_reads_back_with_transformers_names_and_the_converters_tensors(tmp_path, state, quant):
    path = write_llama_from_state(tmp_path, state, CONFIG, quant=quant)
    man = read_manifest(str(path))
    by = {t.name: t for t in man.tensors}
    assert {transformers_name(n) for n in by} == set(state)
    assert all(gguf_name(transformers_name(n)) == n for n in by)
    qt = gguf.GGMLQuantizationType[quant]
    heads = {"q_proj": CONFIG["num_attention_heads"], "k_proj": CONFIG["num_key_value_heads"]}
    with open(path, "rb") as f:
        for name, w in state.items():
            t = by[gguf_name(name)]
            f.seek(t.start)
            raw = np.frombuffer(f.read(t.nbytes), np.uint8)
            if w.ndim == 1:
                assert t.dtype == "F32" and np.array_equal(raw.view(np.float32), w), name
                continue
            assert t.dtype == quant and tuple(t.shape) == w.shape, name
            kind = name.split(".")[-2]
            stored = permute_rows(w, heads[kind]) if kind in heads else w
            assert np.array_equal(raw.reshape(w.shape[0], -1), gguf.quants.quantize(stored, qt)), name
            got = dequantize(raw, quant, tuple(t.shape), "F32")
            if kind in heads:
                got = unpermute_rows(got, heads[kind])
            # the quantization's error, in steps of each block's scale (Q8_0: |max| / 127, half a step and
            # the float16 scale's rounding; Q4_0: |max| / 8, a step where the top value is clamped)
            step = np.abs(w).reshape(w.shape[0], -1, 32).max(-1, keepdims=True) / (127 if quant == "Q8_0" else 8)
            err = np.abs(got - w).reshape(step.shape[0], step.shape[1], 32)
            assert (err <= step * (0.6 if quant == "Q8_0" else 1.1)).all(), name


def test_the_metadata_is_what_transformers_builds_the_config_from(tmp_path, state):
    path = write_llama_from_state(tmp_path, state, CONFIG)
    r = gguf.GGUFReader(str(path))
    assert _field(r, "general.architecture") == "llama" and "mistral" not in _field(r, "general.name")
    want = {"context_length": 512, "block_count": 2, "feed_forward_length": 96, "embedding_length": 64,
            "rope.dimension_count": 16, "attention.head_count": 4, "attention.head_count_kv": 2, "vocab_size": 300}
    for k in TX_KEYS:
        v = _field(r, f"llama.{k}")
        if k in want:
            assert v == want[k], k
    assert _field(r, "llama.rope.freq_base") == 500000.0
    assert _field(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert _field(r, "llama.attention.key_length") == _field(r, "llama.attention.value_length") == 16
    assert _field(r, "general.file_type") == 7  # MOSTLY_Q8_0
    toks = _field(r, "tokenizer.ggml.tokens")
    assert _field(r, "tokenizer.ggml.model") == "llama" and len(toks) == 300 and toks[:3] == ["<unk>", "<s>", "</s>"]
    assert (_field(r, "tokenizer.ggml.bos_token_id"), _field(r, "tokenizer.ggml.eos_token_id")) == (1, 2)
    assert len(placeholder_tokens(2)[0]) == 2


def test_tied_embeddings_write_no_output_tensor(tmp_path):
    cfg = {**CONFIG, "tie_word_embeddings": True}
    s = random_llama_state(cfg, seed=1)
    assert "lm_head.weight" not in s
    names = {t.name for t in read_manifest(str(write_llama_from_state(tmp_path, s, cfg))).tensors}
    assert "output.weight" not in names and "token_embd.weight" in names


def test_a_tensor_that_is_not_llamas_is_refused(tmp_path, state):
    with pytest.raises(ValueError, match="not Llama tensors"):
        write_llama_from_state(tmp_path, {**state, "model.extra.weight": np.zeros(4, np.float32)}, CONFIG)


@pytest.mark.parametrize("on", ["host", "device"])
def test_the_shipped_spec_loads_it_as_transformers_gguf_load_does(tmp_path, state, on):
    config = CONFIG if on == "host" else DEVICE_CONFIG
    state = state if on == "host" else random_llama_state(DEVICE_CONFIG, seed=3)
    """Every tensor under its transformers name, equal bit for bit to what transformers' GGUF load
    makes of it in bfloat16: `gguf.quants.dequantize` in float32, q/k rows permuted back, then one
    round to nearest even (`torch.Tensor.to(torch.bfloat16)`; ml_dtypes rounds the same)."""
    path = write_llama_from_state(tmp_path / "ck", state, config)
    doc = yaml.safe_load((ROOT / "specs" / "transformers-llama-gguf.yaml").read_text())
    doc["checkpoint"], doc["io"], doc["budget"] = str(path), SMALL_IO, {"host": "64MiB"}
    if on == "host":
        for r in doc["rules"]:
            if "dtype" in r:
                r["on"] = "host"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    models = []
    try:
        _, model = load_checked(spec, models)
        assert set(model.keys()) == set(state)
        by = {t.name: t for t in read_manifest(str(path)).tensors}
        heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        with open(path, "rb") as f:
            for name in state:
                t = by[gguf_name(name)]
                f.seek(t.start)
                raw = np.frombuffer(f.read(t.nbytes), np.uint8)
                if t.dtype == "F32":
                    want = raw.view(np.float32)
                else:
                    want = gguf.quants.dequantize(raw.reshape(t.shape[0], -1), gguf.GGMLQuantizationType[t.dtype])
                    kind = name.split(".")[-2]
                    if kind in heads:  # transformers' LlamaTensorProcessor._reverse_permute_weights
                        n = heads[kind]
                        want = want.reshape(n, want.shape[0] // n // 2, 2, -1).swapaxes(2, 1).reshape(want.shape)
                want = np.ascontiguousarray(want.astype(ml_dtypes.bfloat16))
                got = model[name]
                assert got.dtype == "BF16" and got.to_host().tobytes() == want.tobytes(), name
    finally:
        for m in models:
            m.free()


def test_the_config_from_planc_header_read_is_transformers_keys(tmp_path, state):
    """`gguf_names.transformers_config`: what transformers' GGUF loader makes of the llama.* keys,
    from planc's header read (values as text), tied when there is no output.weight."""
    from planc.manifest.gguf_names import transformers_config

    man = read_manifest(str(write_llama_from_state(tmp_path, state, CONFIG)))
    got = transformers_config(dict(man.shards[0].metadata), [t.name for t in man.tensors])
    assert got == {"model_type": "llama", "tie_word_embeddings": False, "max_position_embeddings": 512,
                   "num_hidden_layers": 2, "intermediate_size": 96, "hidden_size": 64, "head_dim": 16,
                   "rope_theta": 500000.0, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "rms_norm_eps": float(np.float32(1e-6)), "vocab_size": 300, "bos_token_id": 1,
                   "eos_token_id": 2, "unk_token_id": 0}
    # a special id that is not an integer is left to the config class's default
    odd = {**dict(man.shards[0].metadata), "tokenizer.ggml.bos_token_id": "[2 x UINT32]"}
    assert "bos_token_id" not in transformers_config(odd, [t.name for t in man.tensors])
    assert transformers_config({"general.architecture": "llama"}, [])["tie_word_embeddings"] is True
    with pytest.raises(ValueError, match="phi3"):
        transformers_config({"general.architecture": "phi3"}, [])
    with pytest.raises(ValueError, match="qwen2"):  # a header of another architecture than the one asked for
        transformers_config({"general.architecture": "qwen2"}, [], arch="llama")

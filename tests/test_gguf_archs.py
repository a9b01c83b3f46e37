"""The architectures planc maps from GGUF into transformers modules (Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 3,
beside Llama in test_gguf_llama.py): each written as llama.cpp's converter writes it
(`planc.tools.gguf_model`), its names held equal to the `gguf` package's TensorNameMap (which
transformers' GGUF loading inverts), the config from planc's header read equal to what transformers'
loader makes of the keys (its GGUF_CONFIG_MAPPING and defaults for the model type), and the shipped
spec's load equal bit for bit to what transformers' GGUF load makes of every tensor in bfloat16:
`gguf.quants.dequantize` in float32, Llama's q/k rows permuted back, Qwen3-MoE's gate and up experts
concatenated along dim 1, Gemma's norms less one, one round to nearest even. The same models against transformers itself, on
the GPU: bench/gguf_archs.py."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from pathlib import Path  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

gguf = pytest.importorskip("gguf")

from execute_support import SMALL_IO, load_checked  # noqa: E402
from planc.base.errors import PlancError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402
from planc.manifest.gguf_names import ARCHS, arch_of, transformers_config, transformers_name  # noqa: E402
from planc.tools.gguf_model import config_of, random_state, write_from_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPECS = {"mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3-moe", "gemma3": "gemma3"}
GGUF_ARCH = {"mistral": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
             "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}


def _config(arch: str, device: bool = False) -> dict:
    # The simulated kernels run each element in a Python thread: the device case's model is small,
    # and its Qwen3 head dim and expert width smaller than the ones transformers' loader assumes.
    if device:
        return config_of(arch, 64, 1, 4, 2, 32, 32, head_dim=16, experts=2, experts_used=1, moe_intermediate=32)
    return config_of(arch, 64, 2, 4, 2, 96, 300, head_dim=32 if arch == "qwen3" else None, experts=4,
                     moe_intermediate=64, context=512, rope_theta=500000.0)


def _write(tmp_path, arch, quant="Q8_0", device=False):
    cfg = _config(arch, device)
    state = random_state(arch, cfg, seed=5)
    return write_from_state(tmp_path / arch, state, cfg, arch, quant=quant), state, cfg


def _spec(tmp_path, arch, path, on="device", **doc_extra):
    doc = yaml.safe_load((ROOT / "specs" / f"transformers-{SPECS[arch]}-gguf.yaml").read_text())
    doc["checkpoint"], doc["io"], doc["budget"] = str(path), SMALL_IO, {"host": "64MiB"}
    if on == "host":
        for r in doc["rules"]:
            if "dtype" in r:
                r["on"] = "host"
    doc.update(doc_extra)
    spec = tmp_path / f"{arch}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    return spec


def _transformers_values(path, arch: str, cfg: dict) -> dict:
    """What transformers' GGUF loader makes of the file, per transformers name, in float32 (its
    TensorProcessor for the architecture, written out here from its source: dequantize, Llama's
    reverse permute, Qwen3-MoE's experts concatenated gate then up along dim 1)."""
    out: dict = {}
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        kind = t.name.split(".")[-2]
        if ARCHS[arch].permuted and kind in ("attn_q", "attn_k"):
            n = cfg["num_attention_heads"] if kind == "attn_q" else cfg["num_key_value_heads"]
            w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
        hf = transformers_name(t.name, arch)
        if hf is None:
            continue
        if kind in ("ffn_gate_exps", "ffn_up_exps"):
            out.setdefault(hf, {})[kind] = w
            continue
        if ARCHS[arch].norm_shift and "norm.weight" in t.name:  # its Gemma2TensorProcessor: weights - 1
            w = w - 1
        out[hf] = w
    for k, v in list(out.items()):
        if isinstance(v, dict):
            out[k] = np.concatenate([v["ffn_gate_exps"], v["ffn_up_exps"]], axis=1)
    return out


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_every_name_is_the_gguf_packages(tmp_path, arch):
    """Each GGUF name of the file maps to a transformers name whose TensorNameMap entry is that GGUF
    name (transformers' loader inverts the same map); the fused halves both map to gate_up_proj."""
    path, state, cfg = _write(tmp_path, arch)
    names = [t.name for t in read_manifest(str(path)).tensors]
    table = gguf.get_tensor_name_map(GGUF_ARCH[arch], cfg["num_hidden_layers"])
    hf = set()
    for g in names:
        h = transformers_name(g, arch)
        hf.add(h)
        if h.endswith("gate_up_proj"):  # transformers maps it to both halves itself (its MoE fallback)
            assert g.split(".")[-2] in ("ffn_gate_exps", "ffn_up_exps")
            continue
        base, suffix = h.rsplit(".", 1) if h.endswith((".weight", ".bias")) else (h, "weight")
        assert f"{table.get_name(base)}.{suffix}" == g, (g, h)  # experts.down_proj has no suffix: .weight
    assert hf == set(state)
    assert arch_of(dict(read_manifest(str(path)).shards[0].metadata)) is ARCHS[arch]


# What transformers' loader makes of each architecture's keys (its GGUF_CONFIG_MAPPING and
# GGUF_CONFIG_DEFAULTS_MAPPING for the model type): qwen2 and qwen3 read no head dim (Qwen3's config
# class defaults to 128), qwen3_moe and gemma3 read key_length; qwen3_moe adds norm_topk_prob.
WANT = {
    "mistral": {"model_type": "mistral", "head_dim": 16},
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3"},
    "qwen3moe": {"model_type": "qwen3_moe", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                 "norm_topk_prob": True},
    "gemma3": {"model_type": "gemma3_text", "head_dim": 256, "sliding_window": 512, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_the_config_from_the_header_is_transformers(tmp_path, arch):
    path, _, _ = _write(tmp_path, arch)
    man = read_manifest(str(path))
    got = transformers_config(dict(man.shards[0].metadata), [t.name for t in man.tensors])
    want = {"tie_word_embeddings": False, "max_position_embeddings": 512, "num_hidden_layers": 2,
            "intermediate_size": 96, "hidden_size": 64, "rope_theta": 500000.0, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": float(np.float32(1e-6)), "vocab_size": 300,
            "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0, **WANT[arch]}
    assert got == want


@pytest.mark.parametrize("arch,on,quant", [("mistral", "host", "Q8_0"), ("qwen2", "host", "Q4_0"),
                                           ("qwen3", "host", "Q8_0"), ("qwen3moe", "host", "Q8_0"),
                                           ("qwen3moe", "device", "Q4_0"), ("qwen2", "device", "Q8_0"),
                                           ("gemma3", "host", "Q8_0"), ("gemma3", "device", "Q4_0")])
def test_the_shipped_spec_loads_it_as_transformers_does(tmp_path, arch, on, quant):
    path, state, cfg = _write(tmp_path, arch, quant, device=on == "device")
    want = _transformers_values(path, arch, cfg)
    models = []
    try:
        _, model = load_checked(_spec(tmp_path, arch, path, on), models)
        assert set(model.keys()) == set(state) == set(want)
        for name, w in want.items():
            got = model[name]
            assert got.dtype == "BF16" and tuple(got.shape) == w.shape == state[name].shape, name
            assert got.to_host().tobytes() == np.ascontiguousarray(w.astype(ml_dtypes.bfloat16)).tobytes(), name
    finally:
        for m in models:
            m.free()


def test_a_fused_expert_of_two_types_dequantizes_each_as_its_own(tmp_path):
    """llama.cpp's Q4_K_M may store a layer's gate and up experts in different types: each part of the
    fuse names its own GGML type, and both land dequantized in one gate_up_proj."""
    cfg = _config("qwen3moe", device=True)
    state = random_state("qwen3moe", cfg, seed=2)
    path = write_from_state(tmp_path / "m", state, cfg, "qwen3moe", quants={"blk.0.ffn_up_exps.weight": "Q4_0"})
    kinds = {t.name: t.dtype for t in read_manifest(str(path)).tensors}
    assert kinds["blk.0.ffn_up_exps.weight"] == "Q4_0" and kinds["blk.0.ffn_gate_exps.weight"] == "Q8_0"
    want = _transformers_values(path, "qwen3moe", cfg)
    models = []
    try:
        plan, model = load_checked(_spec(tmp_path, "qwen3moe", path), models)
        ggml = {p.ggml for p in plan.parts if p.tensor == "model.layers.0.mlp.experts.gate_up_proj"}
        assert ggml == {"Q8_0", "Q4_0"}
        got = model["model.layers.0.mlp.experts.gate_up_proj"].to_host().tobytes()
        assert got == want["model.layers.0.mlp.experts.gate_up_proj"].astype(ml_dtypes.bfloat16).tobytes()
    finally:
        for m in models:
            m.free()


def test_an_interleaved_fuse_that_cannot_be_is_refused(tmp_path):
    """A fuse along dim 1 of stacked experts whose other dims differ, or split across ranks: exit-2
    errors naming the rule and the tensor."""
    path, _, _ = _write(tmp_path, "qwen3moe", device=True)
    doc = yaml.safe_load(_spec(tmp_path, "qwen3moe", path).read_text())
    doc["tensor_parallel"] = {"size": 2}
    for r in doc["rules"]:
        if "fuse" in r:
            r["split"] = {"dim": 1}
    bad = tmp_path / "split.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlancError, match=r"rules\[\d+\] fuses model.layers.0.mlp.experts.gate_up_proj along dim 1"):
        compile_spec(bad)
    doc = yaml.safe_load(_spec(tmp_path, "qwen3moe", path).read_text())
    for r in doc["rules"]:
        if "fuse" in r:
            r["fuse"]["order"] = ["gate", "up", "down"]
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlancError, match="incompatible"):
        compile_spec(bad)


def test_gemma3_norms_are_stored_plus_one_and_loaded_minus_one(tmp_path):
    """llama.cpp's converter stores each Gemma RMSNorm weight plus one; the shipped spec's `add: -1`
    takes it off on the device, in float32 before the rounding: every norm's loaded value is
    bfloat16(stored - 1), and the other weights carry no add."""
    path, state, cfg = _write(tmp_path, "gemma3", "Q8_0", device=True)
    stored = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    w = np.asarray(stored["blk.0.attn_norm.weight"].data, dtype=np.float32)
    assert np.array_equal(w, state["model.layers.0.input_layernorm.weight"] + np.float32(1))
    models = []
    try:
        plan, model = load_checked(_spec(tmp_path, "gemma3", path), models)
        adds = {p.tensor: p.add for p in plan.parts}
        assert {t for t, a in adds.items() if a} == {t for t in state if t.endswith("norm.weight")}
        assert set(adds.values()) == {0.0, -1.0}
        got = model["model.layers.0.input_layernorm.weight"].to_host().tobytes()
        assert got == (w - np.float32(1)).astype(ml_dtypes.bfloat16).tobytes()
    finally:
        for m in models:
            m.free()


def test_every_mapped_architecture_has_its_shipped_spec():
    from planc.face.cli import _SPEC_NAME

    for key in ARCHS:
        name = f"transformers-{_SPEC_NAME.get(key, key)}-gguf.yaml"
        assert (ROOT / "specs" / name).is_file() and (ROOT / "planc" / "specs" / name).is_file(), key


def test_inspect_says_what_planc_does_with_a_gguf(tmp_path, capsys):
    """`planc inspect` of a GGUF names the transformers model type and shipped spec of its
    architecture, or why there is none, and the block types planc loads as stored only."""
    import json

    from execute_support import cli_run

    path, _, _ = _write(tmp_path, "gemma3", device=True)
    rc, out, err = cli_run(capsys, "inspect", str(path), "--json")
    g = json.loads(out)["gguf"]
    assert rc == 0 and g["transformers"] == {"model_type": "gemma3_text",
                                             "spec": "specs/transformers-gemma3-gguf.yaml"}
    assert g["kept_only"] == [] and g["transformers_unmapped"] is None
    w = gguf.GGUFWriter(str(tmp_path / "iq.gguf"), "phi3")
    w.add_tensor_info("blk.0.attn_q.weight", (2, 66), np.dtype(np.uint8), 132,
                      raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.write_tensor_data(np.zeros(132, np.uint8))
    w.close()
    rc, out, err = cli_run(capsys, "inspect", str(tmp_path / "iq.gguf"))
    assert rc == 0 and "IQ2_XXS blocks as stored only" in out and "no tables for a GGUF of architecture 'phi3'" in out

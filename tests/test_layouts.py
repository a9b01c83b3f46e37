"""Serving layouts: rename, fuse along a dim, fuse inside a stack, and the shipped specs.

Compile only (headers): the names, shapes and dtypes each shipped spec produces on a tiny
checkpoint of its family (real Hugging Face names), written out below; the byte offsets of a fuse
inside a stack; the rules refused with a named code; and coalescing: a fused-experts load issues
as many requests and about as many copies as a plain load of the same file.
The bytes themselves are checked under the CUDA simulator in tests/test_api.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

import families
from conftest import write_spec, write_st
from planc.compiler.bind import bind
from planc.compiler.compile import compile_spec
from planc.base.errors import BindError
from planc.plan.explain import explain_doc
from planc.manifest import read_manifest
from planc.spec.model import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"


def shipped(tmp_path, spec: str, tensors: dict, shards: int = 1) -> Path:
    """Write `tensors` as a checkpoint (an index over `shards` files when > 1) and a copy of the
    shipped spec pointing at it; returns the spec's path."""
    ck = tmp_path / "ckpt"
    ck.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(ck / "model.safetensors"))
    else:
        import json

        per = -(-len(names) // shards)
        weight_map = {}
        for k in range(shards):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
            save_file(part, str(ck / fname))
            weight_map.update({n: fname for n in part})
        (ck / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    doc = yaml.safe_load((SPECS / f"{spec}.yaml").read_text())
    doc["checkpoint"] = str(ck)
    path = tmp_path / f"{spec}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def outputs(spec_path) -> dict:
    """name -> (shape, dtype) of what the plan loads, read from explain --json's tensors[]."""
    doc = explain_doc(compile_spec(spec_path))
    assert doc["fits"]
    names = [t["name"] for t in doc["tensors"]]
    assert names == sorted(names)
    for t in doc["tensors"]:
        n = int(np.prod(t["shape"])) if t["shape"] else 1
        assert t["bytes"] == n * (4 if t["dtype"] == "F32" else 2)
    return {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in doc["tensors"]}


def per_layer(layer: dict, ends: dict, layers: int = 2) -> dict:
    out = dict(ends)
    for L in range(layers):
        out.update({k.format(L=L): v for k, v in layer.items()})
    return out


ENDS = {"lm_head.weight": ((40, 32), "BF16"), "model.embed_tokens.weight": ((40, 32), "BF16"),
        "model.norm.weight": ((32,), "BF16")}
NORMS = {"model.layers.{L}.input_layernorm.weight": ((32,), "BF16"),
         "model.layers.{L}.post_attention_layernorm.weight": ((32,), "BF16")}
ATTN = {"model.layers.{L}.self_attn.q_proj.weight": ((32, 32), "BF16"),
        "model.layers.{L}.self_attn.k_proj.weight": ((16, 32), "BF16"),
        "model.layers.{L}.self_attn.v_proj.weight": ((16, 32), "BF16"),
        "model.layers.{L}.self_attn.o_proj.weight": ((32, 32), "BF16")}
QKV = {"model.layers.{L}.self_attn.qkv_proj.weight": ((64, 32), "BF16"),
       "model.layers.{L}.self_attn.o_proj.weight": ((32, 32), "BF16")}

EXPECTED = {
    "transformers-llama": ("llama", per_layer({
        **NORMS, **ATTN,
        "model.layers.{L}.mlp.gate_proj.weight": ((24, 32), "BF16"),
        "model.layers.{L}.mlp.up_proj.weight": ((24, 32), "BF16"),
        "model.layers.{L}.mlp.down_proj.weight": ((32, 24), "BF16")}, ENDS)),
    "vllm-llama": ("llama", per_layer({
        **NORMS, **QKV,
        "model.layers.{L}.mlp.gate_up_proj.weight": ((48, 32), "BF16"),
        "model.layers.{L}.mlp.down_proj.weight": ((32, 24), "BF16")}, ENDS)),
    "transformers-mixtral": ("mixtral", per_layer({
        **NORMS, **ATTN,
        "model.layers.{L}.mlp.gate.weight": ((4, 32), "BF16"),
        "model.layers.{L}.mlp.experts.gate_up_proj": ((4, 48, 32), "BF16"),
        "model.layers.{L}.mlp.experts.down_proj": ((4, 32, 24), "BF16")}, ENDS)),
    "vllm-mixtral": ("mixtral", per_layer({
        **NORMS, **QKV,
        "model.layers.{L}.block_sparse_moe.gate.weight": ((4, 32), "BF16"),
        "model.layers.{L}.block_sparse_moe.experts.w13_weight": ((4, 48, 32), "BF16"),
        "model.layers.{L}.block_sparse_moe.experts.w2_weight": ((4, 32, 24), "BF16")}, ENDS)),
}
MLA = {"model.layers.{L}.self_attn.fused_qkv_a_proj.weight": ((48, 32), "BF16"),  # q_lora 24 + kv_lora 16 + rope 8
       "model.layers.{L}.self_attn.q_a_layernorm.weight": ((24,), "BF16"),
       "model.layers.{L}.self_attn.q_b_proj.weight": ((32, 24), "BF16"),
       "model.layers.{L}.self_attn.kv_a_layernorm.weight": ((16,), "BF16"),
       "model.layers.{L}.self_attn.kv_b_proj.weight": ((32, 16), "BF16"),
       "model.layers.{L}.self_attn.o_proj.weight": ((32, 16), "BF16")}
DEEPSEEK = {
    **{k.format(L=0): v for k, v in {**NORMS, **MLA,
                                     "model.layers.{L}.mlp.gate_up_proj.weight": ((80, 32), "BF16"),
                                     "model.layers.{L}.mlp.down_proj.weight": ((32, 40), "BF16")}.items()},
    **{k.format(L=1): v for k, v in {**NORMS, **MLA,
                                     "model.layers.{L}.mlp.gate.weight": ((4, 32), "BF16"),
                                     "model.layers.{L}.mlp.gate.e_score_correction_bias": ((4,), "F32"),
                                     "model.layers.{L}.mlp.experts.w13_weight": ((4, 32, 32), "BF16"),
                                     "model.layers.{L}.mlp.experts.w2_weight": ((4, 32, 16), "BF16"),
                                     "model.layers.{L}.mlp.shared_experts.gate_up_proj.weight": ((32, 32), "BF16"),
                                     "model.layers.{L}.mlp.shared_experts.down_proj.weight": ((32, 16), "BF16")}.items()},
    **ENDS,
}


@pytest.mark.parametrize("spec", sorted(EXPECTED))
def test_shipped_spec_outputs(tmp_path, spec):
    family, want = EXPECTED[spec]
    assert outputs(shipped(tmp_path, spec, getattr(families, family)(), shards=2)) == want


def test_shipped_deepseek_v3_fp8_outputs(tmp_path):
    path = shipped(tmp_path, "deepseek-v3-fp8", families.deepseek_v3())
    assert outputs(path) == DEEPSEEK
    plan = compile_spec(path)
    consumed = [n for n in families.deepseek_v3() if n.endswith("_scale_inv")]
    assert plan.totals.source_tensors == len(families.deepseek_v3()) - len(consumed)
    assert {p["op"] for p in plan.to_dict()["parts"] if p["tensor"].endswith(("w13_weight", "fused_qkv_a_proj.weight"))} == \
        {"dequantize"}


def test_every_shipped_spec_is_tested():
    assert {p.stem for p in SPECS.glob("*.yaml")} >= set(EXPECTED) | {"deepseek-v3-fp8"}


def test_fuse_inside_stack_offsets(tmp_path):
    """gate_up_proj [E, 2I, H]: expert e's w1 at e * 2IH items, its w3 IH items further on."""
    src = families.mixtral()
    plan = compile_spec(shipped(tmp_path, "transformers-mixtral", src))
    item, ih = 2, families.I * families.H
    parts = {p["inputs"][0]["tensor"]: p for p in plan.to_dict()["parts"]}
    base = {t["name"]: t["offset_bytes"] for t in plan.to_dict()["tensors"]}
    for L in range(2):
        g = base[f"model.layers.{L}.mlp.experts.gate_up_proj"]
        d = base[f"model.layers.{L}.mlp.experts.down_proj"]
        for e in range(families.E):
            q = f"model.layers.{L}.block_sparse_moe.experts.{e}"
            assert parts[f"{q}.w1.weight"]["dst_offset"] == g + e * 2 * ih * item
            assert parts[f"{q}.w3.weight"]["dst_offset"] == g + (e * 2 + 1) * ih * item
            assert parts[f"{q}.w2.weight"]["dst_offset"] == d + e * ih * item
    assert {p["path"] for p in plan.to_dict()["parts"]} == {"direct"}
    assert plan.layout.landing_region_bytes == (0, 0)  # placed by offset: no scratch, no landing


def test_fused_moe_coalesces_like_a_plain_copy(tmp_path):
    """The same file, fused into transformers 5's experts or copied as stored: the same requests
    and bytes read, and about as many copies. A fused load adds at most one copy where a request
    crosses from one expert tensor into the next (their places on the device are not adjacent):
    with each tensor spanning four slots here, 1.16x; a Mixtral-8x7B expert spans seven 16 MiB slots."""
    src = families.mixtral(experts=8, inter=256)  # each expert weight 16 KiB
    fused = shipped(tmp_path, "transformers-mixtral", src)
    doc = yaml.safe_load(fused.read_text())
    doc["io"] = {"workers": 4, "slot": "4KiB", "slots": 4, "run": "256KiB", "merge_gap": "64KiB"}
    fused.write_text(yaml.safe_dump(doc))
    plain = write_spec(tmp_path, {**doc, "rules": [{"match": "*"}]}, "plain.yaml")
    f, p = compile_spec(fused).totals._asdict(), compile_spec(plain).totals._asdict()
    assert p["requests"] > 100 and p["copies"] == p["requests"]  # the file spans many slots
    assert (f["requests"], f["read_bytes"], f["payload_bytes"]) == (p["requests"], p["read_bytes"], p["payload_bytes"])
    assert f["copies"] <= 1.2 * p["copies"], (f, p)
    assert f["copies"] - p["copies"] <= f["source_tensors"]
    assert f["kernels"] == 0  # placed by offset: no kernel either


# ------------------------------------------------------------------------------------------
# bind: the rules themselves


def do_bind(tmp_path, tensors: dict, rules: list):
    write_st(tmp_path / "m.safetensors", tensors)
    spec = load_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1GiB"}, "rules": rules}))
    return {p.name: p for p in bind(spec.spec, read_manifest(spec.checkpoint_path)).placements}


def test_rename_uses_match_placeholders(tmp_path):
    got = do_bind(tmp_path, {"a.3.gate.weight": np.zeros((2, 4), np.float32), "b": np.zeros(3, np.float32)},
                  [{"match": "a.{L}.gate.weight", "rename": "x.layers.{L}.router.weight"}, {"match": "*"}])
    assert sorted(got) == ["b", "x.layers.3.router.weight"]
    p = got["x.layers.3.router.weight"]
    assert p.shape == (2, 4) and p.parts[0].source.name == "a.3.gate.weight"


def test_rename_clash_is_named(tmp_path):
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)},
                [{"match": "a", "rename": "b"}, {"match": "*"}])
    assert info.value.code == "name-clash" and "'b'" in info.value.message


def test_fuse_along_a_later_dim_with_unit_leading_dims(tmp_path):
    t = {"x.p": np.zeros((1, 3, 4), np.float32), "x.q": np.zeros((1, 5, 4), np.float32)}
    got = do_bind(tmp_path, t, [{"match": "x.{P}", "fuse": {"into": "y", "over": "P", "order": ["p", "q"], "dim": 1}}])
    assert got["y"].shape == (1, 8, 4)
    assert [pt.offset_bytes for pt in got["y"].parts] == [0, 48]


def test_fuse_along_a_later_dim_that_interleaves_is_refused(tmp_path):
    t = {"x.p": np.zeros((2, 3), np.float32), "x.q": np.zeros((2, 5), np.float32)}
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, t, [{"match": "x.{P}", "fuse": {"into": "y", "over": "P", "order": ["p", "q"], "dim": 1}}])
    assert info.value.code == "fuse-interleaved"
    assert "rules[0]" in info.value.message and "dim 1" in info.value.message


def test_fuse_dim_beyond_the_tensor_is_refused(tmp_path):
    t = {"x.p": np.zeros((2, 3), np.float32), "x.q": np.zeros((2, 3), np.float32)}
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, t, [{"match": "x.{P}", "fuse": {"into": "y", "over": "P", "order": ["p", "q"], "dim": 2}}])
    assert info.value.code == "fuse-dim"


def test_fuse_dim_mismatch_on_other_dims(tmp_path):
    t = {"x.p": np.zeros((2, 3), np.float32), "x.q": np.zeros((4, 5), np.float32)}
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, t, [{"match": "x.{P}", "fuse": {"into": "y", "over": "P", "order": ["p", "q"]}}])
    assert info.value.code == "group-mismatch"


def test_fuse_inside_stack_needs_every_part_of_every_item(tmp_path):
    t = {f"e.{e}.{w}": np.zeros((2, 3), np.float32) for e in range(2) for w in ("a", "b")}
    del t["e.1.b"]
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, t, [{"match": "e.{E}.{W}", "stack": {"into": "s", "over": "E"},
                               "fuse": {"over": "W", "order": ["a", "b"]}}])
    assert info.value.code == "fuse-incomplete" and "item E=1" in info.value.message


def test_fuse_inside_stack_items_must_agree(tmp_path):
    t = {"e.0.a": np.zeros((2, 3), np.float32), "e.0.b": np.zeros((2, 3), np.float32),
         "e.1.a": np.zeros((1, 3), np.float32), "e.1.b": np.zeros((2, 3), np.float32)}
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, t, [{"match": "e.{E}.{W}", "stack": {"into": "s", "over": "E"},
                               "fuse": {"over": "W", "order": ["a", "b"]}}])
    assert info.value.code == "group-mismatch"


def test_fuse_inside_stack_tensor_parallel(tmp_path):
    """vLLM's w13 under TP: each rank takes its rows of every w1 and w3 (split dim 1 of [E, 2I, H])."""
    t = {f"e.{e}.{w}": np.arange(12, dtype=np.float32).reshape(4, 3) for e in range(2) for w in ("a", "b")}
    write_st(tmp_path / "m.safetensors", t)
    spec = load_spec(write_spec(tmp_path, {
        "checkpoint": "m.safetensors", "budget": {"host": "1GiB"}, "tensor_parallel": {"size": 2},
        "rules": [{"match": "e.{E}.{W}", "stack": {"into": "s", "over": "E"},
                   "fuse": {"over": "W", "order": ["a", "b"]}, "split": {"dim": 1}}]}))
    m = read_manifest(spec.checkpoint_path)
    for rank in (0, 1):
        (p,) = bind(spec.spec, m, rank).placements
        assert p.shape == (2, 4, 3)
        assert [(pt.source.name, pt.offset_bytes, pt.src_slice.start) for pt in p.parts] == [
            ("e.0.a", 0, 2 * rank), ("e.0.b", 24, 2 * rank), ("e.1.a", 48, 2 * rank), ("e.1.b", 72, 2 * rank)]

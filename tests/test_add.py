"""A rule's `add`: a constant added to every value of an F32 / F16 / BF16 tensor in float32 (the sum rounded
to float32), then rounded to the loaded dtype (llama.cpp stores Gemma's RMSNorm weights plus one; `add: -1` takes it
off). Loaded on the device (the `add_{src}_{dst}` kernels, under the CUDA simulator here) and on the host,
each value equal to numpy's float32 sum rounded to the dtype; refused where it cannot apply; a plan whose `add`
was edited refused before anything is allocated."""

from __future__ import annotations

import json
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from execute_support import NP, SMALL_IO, TARGET, cli_run, handmade, load_checked, one_line, spec_file  # noqa: E402
from planc.base.errors import BindError, PlanFormatError, SpecError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.plan.codec import decode, encode  # noqa: E402


def _values(dtype: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 0.3 + 1).astype(np.float32)
    x[:6] = [1.0, 0.0, -0.0, np.inf, -np.inf, 1.0000001]  # exact, signed zeros, infinities, a near tie
    x[6] = np.float32(1e-40)  # a subnormal: kept, not flushed
    return x.astype(NP[dtype])


def _want(x: np.ndarray, add: float, target: str) -> bytes:
    """numpy's float32 sum, rounded once to the target (ml_dtypes for BF16)."""
    return (x.astype(np.float32) + np.float32(add)).astype(NP[target]).tobytes()


@pytest.mark.parametrize("src,dtype", [("F32", "bfloat16"), ("F32", "float32"), ("F32", "float16"),
                                       ("BF16", "float32"), ("F16", "bfloat16"), ("BF16", "bfloat16")])
@pytest.mark.parametrize("on", ["device", "host"])
def test_add_loads_each_value_plus_the_constant_rounded_once(tmp_path, src, dtype, on):
    norm = _values(src, 700)
    other = _values(src, 300, seed=1)
    ck, _ = handmade(tmp_path, {"blk.0.attn_norm.weight": norm, "blk.0.attn_q.weight": other})
    spec = spec_file(tmp_path, ck, [{"match": "*norm.weight", "add": -1, "dtype": dtype, "on": on},
                                    {"match": "*", "dtype": dtype}], io=SMALL_IO)
    models = []
    try:
        plan, model = load_checked(spec, models)
        adds = {p.tensor: (p.op, p.add) for p in plan.parts}
        assert adds["blk.0.attn_norm.weight"] == ("convert", -1.0)
        assert adds["blk.0.attn_q.weight"][1] == 0.0
        kernels = [k for r in plan.runs for k in r.kernels]
        assert all(k.add == plan.parts[k.part].add for k in kernels)
        assert model["blk.0.attn_norm.weight"].to_host().tobytes() == _want(norm, -1.0, TARGET[dtype])
        assert model["blk.0.attn_q.weight"].to_host().tobytes() == other.astype(NP[TARGET[dtype]]).tobytes()
    finally:
        for m in models:
            m.free()


def test_a_nan_stays_nan_and_a_same_size_add_runs_in_place(tmp_path):
    x = np.array([np.nan, 1.5, -np.nan, 2.0] * 64, dtype=np.float32)
    ck, _ = handmade(tmp_path, {"n.weight": x})
    spec = spec_file(tmp_path, ck, [{"match": "*", "add": 0.5}], io=SMALL_IO)  # keep: F32 -> F32 in place
    models = []
    try:
        plan, model = load_checked(spec, models)
        (p,) = plan.parts
        assert (p.op, p.landing_bytes, p.out_dtype) == ("convert", 0, "F32")
        got = model["n.weight"].to_host().view(np.float32)
        assert np.isnan(got[0::2]).all() and list(got[1:4:2]) == [2.0, 2.5]
    finally:
        for m in models:
            m.free()


def test_neighbours_of_another_add_are_not_one_kernel(tmp_path):
    """Two tensors end to end in the file and the arena, converted alike, would share a launch; one
    that adds and one that does not get a kernel each."""
    a, b = _values("F32", 256), _values("F32", 256, seed=2)
    ck, _ = handmade(tmp_path, {"a.norm.weight": a, "b.weight": b})
    spec = spec_file(tmp_path, ck, [{"match": "*norm.weight", "add": -1, "dtype": "bfloat16"},
                                    {"match": "*", "dtype": "bfloat16"}], io=SMALL_IO)
    plan = compile_spec(spec)
    kernels = [k for r in plan.runs for k in r.kernels]
    assert sorted(k.add for k in kernels) == [-1.0, 0.0] and all(not k.more for k in kernels)
    spec2 = spec_file(tmp_path, ck, [{"match": "*", "dtype": "bfloat16"}], io=SMALL_IO, name="plain.yaml")
    assert sum(1 for r in compile_spec(spec2).runs for _ in r.kernels) == 1  # without the add: one launch


def test_an_add_of_zero_is_no_add_and_numpy_numbers_are_numbers(tmp_path):
    ck, _ = handmade(tmp_path, {"n.weight": _values("F32", 16), "ids": np.arange(4, dtype=np.int32)})
    spec = spec_file(tmp_path, ck, [{"match": "n.weight", "add": 0, "skip": True}, {"match": "*", "add": -0.0}],
                     io=SMALL_IO)
    plan = compile_spec(spec)  # 0 and -0.0: no add, so no convert and no bad-add on the I32 tensor
    assert [(p.tensor, p.op, p.add) for p in plan.parts] == [("ids", "copy", 0.0)]
    from planc.spec.model import Rule

    assert Rule(match="*", add=np.float64(-1)).add == -1.0 and Rule(match="*", add=np.int64(2)).add == 2.0


@pytest.mark.parametrize("value,why", [("one", "takes a number"), (True, "takes a number"), (0.1, "not a float32 value"),
                                       (1e39, "outside float32's range"), (float("nan"), "finite")])
def test_an_add_that_is_not_a_float32_number_is_a_spec_error(tmp_path, value, why):
    ck, _ = handmade(tmp_path, {"n.weight": _values("F32", 16)})
    spec = spec_file(tmp_path, ck, [{"match": "*", "add": value}], io=SMALL_IO)
    with pytest.raises(SpecError, match=why) as e:
        compile_spec(spec)
    assert "rules[0].add" in str(e.value)


@pytest.mark.parametrize("extra", [{"transpose": True}, {"skip": True},
                                   {"fuse": {"into": "f.weight", "over": "X", "order": ["n"]}}])
def test_add_with_a_pack_or_a_skip_is_a_spec_error(tmp_path, extra):
    ck, _ = handmade(tmp_path, {"n.weight": _values("F32", 16)})
    rule = {"match": "{X}.weight", "add": -1, **extra}
    spec = spec_file(tmp_path, ck, [rule], io=SMALL_IO)
    with pytest.raises(SpecError, match="add|skip rule"):
        compile_spec(spec)


def test_add_on_a_tensor_that_is_not_a_float_is_bad_add(tmp_path, capsys):
    ck, _ = handmade(tmp_path, {"ids": np.arange(16, dtype=np.int32), "n.weight": _values("F32", 16)})
    spec = spec_file(tmp_path, ck, [{"match": "*", "add": -1}], io=SMALL_IO)
    with pytest.raises(BindError) as e:
        compile_spec(spec)
    assert e.value.code == "bad-add" and "ids" in str(e.value) and "I32" in str(e.value)
    rc, out, err = cli_run(capsys, "compile", str(spec))
    assert rc == 2 and "[bad-add]" in one_line(err) and "rules[0]" in err


def test_add_on_gguf_blocks_is_bad_add(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    data = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = spec_file(tmp_path, tmp_path / "m.gguf", [{"match": "*", "add": -1, "dtype": "bfloat16"}], io=SMALL_IO)
    rc, out, err = cli_run(capsys, "compile", str(spec))
    assert rc == 2 and "[bad-add]" in one_line(err) and "GGUF Q8_0" in err and "blk.0.attn_q.weight" in err


def _plan_doc(tmp_path):
    ck, _ = handmade(tmp_path, {"a.norm.weight": _values("F32", 256), "b.weight": _values("F32", 256, seed=3)})
    spec = spec_file(tmp_path, ck, [{"match": "*norm.weight", "add": -1, "dtype": "bfloat16"}, {"match": "*"}],
                     io=SMALL_IO)
    return json.loads(encode(compile_spec(spec)))


@pytest.mark.parametrize("edit,field", [
    (lambda d, p, k: p.__setitem__(14, 0.1), "parts[0].add"),  # not a float32 value
    (lambda d, p, k: p.__setitem__(14, "x"), "parts[0].add"),
    (lambda d, p, k: p.__setitem__(14, 1e400), "parts[0].add"),  # infinity
    (lambda d, p, k: k.__setitem__(14, 0.0), "kernels[0]"),  # the kernel no longer adds what its part does
    (lambda d, p, k: k.__setitem__(14, "-1"), "kernels[0].add"),
])
def test_a_plan_whose_add_was_edited_is_refused(tmp_path, edit, field):
    doc = _plan_doc(tmp_path)
    part = next(p for p in doc["parts"] if p[14])
    kernel = next(k for r in doc["runs"] for k in r[2] if k[14])
    edit(doc, part, kernel)
    with pytest.raises(PlanFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode(json.dumps(doc))


def test_a_plan_that_adds_on_a_copy_is_refused(tmp_path):
    doc = _plan_doc(tmp_path)
    copy = next(p for p in doc["parts"] if p[2] == "copy")
    copy[14] = -1.0
    with pytest.raises(PlanFormatError, match=r"parts\[\d\]\.out_dtype: a copy .*adds no constant"):
        decode(json.dumps(doc))


@pytest.mark.parametrize("on", ["device", "host"])
def test_each_rank_adds_to_its_own_slice(tmp_path, on):
    import ml_dtypes
    import yaml

    from planc.execute import execute

    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    ck, _ = handmade(tmp_path, {"w.norm.weight": x})
    spec = spec_file(tmp_path, ck, [{"match": "*", "add": -1, "dtype": "bfloat16", "on": on, "split": {"dim": 1}}],
                     io=SMALL_IO)
    doc = yaml.safe_load(spec.read_text())
    doc["tensor_parallel"] = {"size": 2}
    spec.write_text(yaml.safe_dump(doc))
    for rank in range(2):
        model = execute(compile_spec(spec, rank=rank), verify=True)
        try:
            want = (x[:, rank * 32:(rank + 1) * 32] - np.float32(1)).astype(ml_dtypes.bfloat16).tobytes()
            assert model["w.norm.weight"].to_host().tobytes() == want and model.report["verify"]["ok"]
        finally:
            model.free()

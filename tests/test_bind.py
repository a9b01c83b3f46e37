"""bind: rules x manifest -> placements (first match wins, groups, dequantize, errors)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import write_spec, write_st
from planc.compiler.bind import bind
from planc.base.errors import BindError
from planc.manifest import read_manifest
from planc.spec.model import load_spec

F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def z(shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def do_bind(tmp_path, tensors: dict, rules: list):
    write_st(tmp_path / "m.safetensors", tensors)
    spec = load_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1GiB"}, "rules": rules}))
    m = read_manifest(spec.checkpoint_path)
    return bind(spec.spec, m), m


def bind_error(tmp_path, tensors, rules, code) -> BindError:
    with pytest.raises(BindError) as info:
        do_bind(tmp_path, tensors, rules)
    assert info.value.code == code, str(info.value)
    return info.value


def by_name(binding):
    return {p.name: p for p in binding.placements}


def test_first_match_wins(tmp_path):
    b, _ = do_bind(tmp_path, {"a.weight": z((2, 3)), "a.bias": z(3), "b.weight": z(4)},
                   [{"match": "a.*", "dtype": "float16"}, {"match": "*.weight", "dtype": "bfloat16"}, {"match": "*"}])
    p = by_name(b)
    assert [x.name for x in b.placements] == ["a.bias", "a.weight", "b.weight"]
    assert (p["a.weight"].dtype, p["a.weight"].rule, p["a.weight"].op) == ("F16", 0, "convert")
    assert (p["a.bias"].dtype, p["a.bias"].rule) == ("F16", 0)
    assert (p["b.weight"].dtype, p["b.weight"].rule, p["b.weight"].nbytes) == ("BF16", 1, 8)
    assert p["a.weight"].nbytes == 12 and p["a.weight"].shape == (2, 3)


def test_unmatched_lists_sorted_names(tmp_path):
    e = bind_error(tmp_path, {"zeta": z(1), "alpha": z(1), "mid.x": z(1), "keep.me": z(1)},
                   [{"match": "keep.*"}], "unmatched")
    assert "3 tensor(s) match no rule: alpha, mid.x, zeta;" in e.message
    assert 'match: "*"' in e.message


def test_unmatched_list_is_capped(tmp_path):
    e = bind_error(tmp_path, {f"t{i:02d}": z(1) for i in range(25)}, [{"match": "none"}], "unmatched")
    assert "25 tensor(s)" in e.message and "t19" in e.message and "t20" not in e.message
    assert "(+5 more)" in e.message


def test_catch_all_and_copy(tmp_path):
    b, m = do_bind(tmp_path, {"x": z((2, 2), np.int32), "y": z(3, BF16)}, [{"match": "*"}])
    p = by_name(b)
    assert (p["x"].op, p["x"].dtype, p["x"].pack, p["x"].on) == ("copy", "I32", "none", "device")
    assert p["y"].parts[0].source == m.tensor("y")
    assert b.skipped == () and b.consumed == ()


def test_skip(tmp_path):
    b, _ = do_bind(tmp_path, {"a": z(2), "b.drop": z(2), "a.drop": z(2)},
                   [{"match": "*.drop", "skip": True}, {"match": "*"}])
    assert [p.name for p in b.placements] == ["a"]
    assert b.skipped == ("a.drop", "b.drop")


def test_fuse_qkv_with_offsets(tmp_path):
    t = {f"l.{L}.{p}": z((r, 8)) for L in (0, 1) for p, r in (("q", 4), ("k", 2), ("v", 2))}
    b, m = do_bind(tmp_path, {**t, "l.0.o": z((8, 8))},
                   [{"match": "l.{L}.{P}", "fuse": {"into": "l.{L}.qkv", "over": "P", "order": ["q", "k", "v"]}},
                    {"match": "*"}])
    p = by_name(b)
    assert sorted(p) == ["l.0.o", "l.0.qkv", "l.1.qkv"]  # o is not in `order`: it falls to the catch-all
    qkv = p["l.1.qkv"]
    assert (qkv.shape, qkv.pack, qkv.dtype, qkv.nbytes) == ((8, 8), "fuse", "F32", 256)
    assert [(x.source.name, x.offset_bytes, x.out_bytes) for x in qkv.parts] == [
        ("l.1.q", 0, 128), ("l.1.k", 128, 64), ("l.1.v", 192, 64)]


def test_fuse_converts_each_part(tmp_path):
    b, _ = do_bind(tmp_path, {"a.q": z((3, 2)), "a.k": z((1, 2))},
                   [{"match": "a.{P}", "dtype": "float16", "fuse": {"into": "a.qk", "over": "P", "order": ["q", "k"]}}])
    (qk,) = b.placements
    assert (qk.shape, qk.dtype, qk.op) == ((4, 2), "F16", "convert")
    assert [(x.offset_bytes, x.out_bytes) for x in qk.parts] == [(0, 12), (12, 4)]


def test_fuse_missing_part(tmp_path):
    e = bind_error(tmp_path, {"a.q": z((2, 2)), "a.k": z((2, 2))},
                   [{"match": "a.{P}", "fuse": {"into": "a.qkv", "over": "P", "order": ["q", "k", "v"]}}],
                   "fuse-incomplete")
    assert "['v']" in e.message


def test_fuse_shape_mismatch(tmp_path):
    bind_error(tmp_path, {"a.q": z((2, 2)), "a.k": z((2, 3))},
               [{"match": "a.{P}", "fuse": {"into": "a.qk", "over": "P", "order": ["q", "k"]}}], "group-mismatch")


def test_group_dtype_mismatch(tmp_path):
    bind_error(tmp_path, {"a.q": z((2, 2)), "a.k": z((2, 2), np.float16)},
               [{"match": "a.{P}", "fuse": {"into": "a.qk", "over": "P", "order": ["q", "k"]}}], "group-mismatch")


def test_group_with_the_same_value_twice_is_an_error(tmp_path):
    e = bind_error(tmp_path, {f"l.{L}.{p}": z((2, 2)) for L in (0, 1) for p in "qk"},
                   [{"match": "l.*.{P}", "fuse": {"into": "qk", "over": "P", "order": ["q", "k"]}}], "group-duplicate")
    assert "l.0.k and l.1.k" in e.message


def test_stack_experts_in_numeric_order(tmp_path):
    t = {f"m.experts.{e}.w": np.full((2, 3), e, np.float32) for e in range(12)}
    b, _ = do_bind(tmp_path, t, [{"match": "m.experts.{E}.w", "stack": {"into": "m.experts.w", "over": "E"}}])
    (s,) = b.placements
    assert (s.name, s.shape, s.pack, s.nbytes) == ("m.experts.w", (12, 2, 3), "stack", 288)
    assert [x.source.name for x in s.parts] == [f"m.experts.{e}.w" for e in range(12)]  # 10 after 9, not after 1
    assert [x.offset_bytes for x in s.parts] == [24 * e for e in range(12)]


def test_stack_gap_is_an_error(tmp_path):
    e = bind_error(tmp_path, {f"x.{e}": z(2) for e in (0, 1, 3)},
                   [{"match": "x.{E}", "stack": {"into": "x", "over": "E"}}], "stack-incomplete")
    assert "missing [2]" in e.message


def test_stack_not_from_zero(tmp_path):
    e = bind_error(tmp_path, {f"x.{e}": z(2) for e in (1, 2)},
                   [{"match": "x.{E}", "stack": {"into": "x", "over": "E"}}], "stack-incomplete")
    assert "missing [0]" in e.message


def test_stack_explicit_order_and_shape_mismatch(tmp_path):
    b, _ = do_bind(tmp_path, {"x.a": z(2), "x.b": z(2)},
                   [{"match": "x.{E}", "stack": {"into": "x", "over": "E", "order": ["b", "a"]}}])
    assert [p.source.name for p in b.placements[0].parts] == ["x.b", "x.a"]
    bind_error(tmp_path / "2", {"x.0": z(2), "x.1": z(3)},
               [{"match": "x.{E}", "stack": {"into": "x", "over": "E"}}], "group-mismatch")


def test_stack_transposed(tmp_path):
    b, _ = do_bind(tmp_path, {"x.0": z((2, 5)), "x.1": z((2, 5))},
                   [{"match": "x.{E}", "transpose": True, "stack": {"into": "x", "over": "E"}}])
    (s,) = b.placements
    assert (s.shape, s.op) == ((2, 5, 2), "transpose")


def test_source_dtype_filter(tmp_path):
    b, _ = do_bind(tmp_path, {"a": z(2), "b": z(2, np.float16), "c": z(2, np.int8)},
                   [{"match": "*", "source_dtype": ["F32"], "dtype": "bfloat16"},
                    {"match": "*", "source_dtype": ["F16", "BF16"], "dtype": "float32"}, {"match": "*"}])
    p = by_name(b)
    assert (p["a"].dtype, p["a"].rule) == ("BF16", 0)
    assert (p["b"].dtype, p["b"].rule) == ("F32", 1)
    assert (p["c"].dtype, p["c"].rule, p["c"].op) == ("I8", 2, "copy")


def fp8_tensors(rows=130, cols=5, scale=None):
    scale = scale if scale is not None else (-(-rows // 128), -(-cols // 128))
    return {"w.weight": z((rows, cols), F8), "w.weight_scale_inv": z(scale), "norm": z(4, BF16)}


def test_dequantize_consumes_scale(tmp_path):
    b, m = do_bind(tmp_path, fp8_tensors(), [{"match": "*.weight", "source_dtype": ["F8_E4M3"], "dequantize": {}},
                                             {"match": "norm"}])
    p = by_name(b)
    assert sorted(p) == ["norm", "w.weight"]
    w = p["w.weight"]
    assert (w.op, w.dtype, w.shape, w.block, w.nbytes) == ("dequantize", "BF16", (130, 5), 128, 1300)
    assert w.parts[0].scale == m.tensor("w.weight_scale_inv")
    assert b.consumed == ("w.weight_scale_inv",)


def test_dequantize_float16_and_custom_scale(tmp_path):
    t = {"w": z((4, 4), F8), "w.s": z((2, 2))}
    b, _ = do_bind(tmp_path, t, [{"match": "w", "dtype": "float16", "dequantize": {"scale": "{name}.s", "block": 2}}])
    (w,) = b.placements
    assert (w.dtype, w.block, w.parts[0].scale.name) == ("F16", 2, "w.s")


def test_dequantize_scale_missing(tmp_path):
    t = fp8_tensors()
    del t["w.weight_scale_inv"]
    e = bind_error(tmp_path, t, [{"match": "w.weight", "dequantize": {}}, {"match": "*"}], "scale-missing")
    assert "w.weight_scale_inv" in e.message


def test_dequantize_scale_wrong_shape(tmp_path):
    e = bind_error(tmp_path, fp8_tensors(scale=(1, 1)), [{"match": "w.weight", "dequantize": {}}, {"match": "*"}],
                   "scale-shape")
    assert "[2, 1]" in e.message and "[1, 1]" in e.message


def test_dequantize_non_fp8(tmp_path):
    bind_error(tmp_path, {"w": z((4, 4)), "w_scale_inv": z((1, 1))}, [{"match": "w", "dequantize": {}}, {"match": "*"}],
               "bad-dequantize")


def test_transpose(tmp_path):
    b, _ = do_bind(tmp_path, {"w": z((2, 5))}, [{"match": "w", "transpose": True}])
    (w,) = b.placements
    assert (w.op, w.shape, w.nbytes) == ("transpose", (5, 2), 40)


def test_transpose_of_non_2d(tmp_path):
    e = bind_error(tmp_path, {"w": z((2, 3, 4))}, [{"match": "w", "transpose": True}], "bad-transpose")
    assert "[2, 3, 4]" in e.message


def test_transpose_and_convert_on_device(tmp_path):
    bind_error(tmp_path, {"w": z((2, 3))}, [{"match": "w", "transpose": True, "dtype": "float16"}], "bad-transpose")
    b, _ = do_bind(tmp_path / "host", {"w": z((2, 3))},
                   [{"match": "w", "transpose": True, "dtype": "float16", "on": "host"}])
    assert (b.placements[0].op, b.placements[0].dtype, b.placements[0].on) == ("transpose", "F16", "host")


def test_convert_non_float(tmp_path):
    e = bind_error(tmp_path, {"ids": z(4, np.int64)}, [{"match": "*", "dtype": "float16"}], "bad-convert")
    assert "I64" in e.message and "source_dtype" in e.message


def test_name_clash(tmp_path):
    e = bind_error(tmp_path, {"a.q": z((1, 2)), "a.k": z((1, 2)), "a.qk": z((1, 2))},
                   [{"match": "a.{P}", "fuse": {"into": "a.qk", "over": "P", "order": ["q", "k"]}}, {"match": "*"}],
                   "name-clash")
    assert "'a.qk'" in e.message

"""Hostile FP4 checkpoints: zero-size packed weights are refused at compile with a typed error naming
the tensor (they failed inside the load, or made a plan the plan check refused)."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import planc  # noqa: E402
from conftest import write_spec  # noqa: E402
from execute_support import cli_run, one_line  # noqa: E402
from planc.base.errors import BindError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402

NV = [{"match": "*.weight", "source_dtype": ["U8"], "dequantize": {"format": "nvfp4"}, "dtype": "bfloat16"},
      {"match": "*"}]
MX = [{"match": "*_blocks", "dequantize": {"format": "mxfp4"}, "dtype": "bfloat16"}, {"match": "*"}]


def _nv(rows, cols):
    return {"w.weight": np.ones((rows, cols // 2), np.uint8),
            "w.weight_scale": np.ones((rows, cols // 16), ml_dtypes.float8_e4m3fn),
            "w.weight_scale_2": np.array(0.5, np.float32)}


def _mx(experts, rows, cols):
    return {"e.w_blocks": np.ones((experts, rows, cols // 32, 16), np.uint8),
            "e.w_scales": np.full((experts, rows, cols // 32), 127, np.uint8)}


def _spec(tmp_path, tensors, rules):
    save_file(tensors, str(tmp_path / "m.safetensors"))
    return write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                                 "io": {"slot": "64KiB", "slots": 4}, "rules": rules})


@pytest.mark.parametrize("case", ["nv-rows", "nv-cols", "mx-experts", "mx-rows", "mx-groups"])
def test_a_zero_size_fp4_weight_is_refused_at_compile(tmp_path, capsys, case):
    tensors, rules = {"nv-rows": (_nv(0, 64), NV), "nv-cols": (_nv(4, 0), NV), "mx-experts": (_mx(0, 4, 64), MX),
                      "mx-rows": (_mx(2, 0, 64), MX), "mx-groups": (_mx(2, 4, 0), MX)}[case]
    spec = _spec(tmp_path, tensors, rules)
    with pytest.raises(BindError) as e:
        compile_spec(spec)
    assert e.value.code == "bad-dequantize" and "holds no values" in str(e.value)
    rc, out, err = cli_run(capsys, "run", spec)
    assert rc == 2 and "[bad-dequantize]" in one_line(err) and ("w.weight" in err or "e.w_blocks" in err)


def test_a_small_fp4_weight_still_loads(tmp_path):
    model = planc.load(_spec(tmp_path, _nv(4, 64), NV))
    try:
        assert model["w.weight"].shape == (4, 64)
    finally:
        model.free()

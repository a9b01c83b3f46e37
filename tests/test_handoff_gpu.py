"""The torch hand-off on a real GPU (marked `gpu`; skipped without torch, a GPU, or with the simulator on).

    python -m pytest -m gpu -p no:cacheprovider tests/test_handoff_gpu.py

`state_dict()` must share the arena (same device pointers, no copy) in the true dtypes, and
`load_into` must leave a meta-device module holding those very tensors.
"""

import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip("the CUDA simulator is on in this process; run this file alone, without NUMBA_ENABLE_CUDASIM",
                allow_module_level=True)

import numba  # noqa: E402
from numba import cuda  # noqa: E402

if numba.config.ENABLE_CUDASIM or not cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import families  # noqa: E402
import planc  # noqa: E402
from execute_support import bits  # noqa: E402
from test_layouts import shipped  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]


def test_state_dict_shares_the_arena(tmp_path):
    src = families.mixtral()
    model = planc.load(shipped(tmp_path, "transformers-mixtral", src))
    try:
        sd = model.state_dict()
        for name, t in sd.items():
            d = model[name]
            assert t.is_cuda and t.data_ptr() == d.__cuda_array_interface__["data"][0], name
            assert tuple(t.shape) == d.shape and t.dtype == torch.bfloat16
        w = src["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
        got = sd["model.layers.1.mlp.experts.gate_up_proj"][2, families.I:]
        assert np.array_equal(got.view(torch.int16).cpu().numpy().view(np.uint16), w.view(np.uint16))
    finally:
        model.free()


def test_state_dict_fp8(tmp_path):
    src = families.deepseek_v3()
    spec = shipped(tmp_path, "deepseek-v3-fp8", src)
    spec.write_text(spec.read_text().split("rules:")[0] + "rules:\n  - match: '*'\n")
    model = planc.load(spec)
    try:
        name = "model.layers.1.mlp.experts.3.up_proj.weight"
        t = model.state_dict()[name]
        assert t.dtype == torch.float8_e4m3fn and t.is_cuda
        assert np.array_equal(t.view(torch.uint8).cpu().numpy().reshape(-1), bits(src[name]))
    finally:
        model.free()


def test_load_into_no_copy(tmp_path):
    src = families.llama()
    nn = torch.nn
    with torch.device("meta"):
        module = nn.Module()
        module.model = nn.Module()
        module.model.embed_tokens = nn.Embedding(40, 32)
        module.model.norm = nn.RMSNorm(32)
        module.lm_head = nn.Linear(32, 40, bias=False)
    keep = {n: a for n, a in src.items() if not n.startswith("model.layers.")}
    res = planc.load_into(module, shipped(tmp_path, "transformers-llama", keep))
    try:
        assert module.lm_head.weight.is_cuda
        assert module.lm_head.weight.data_ptr() == res.model["lm_head.weight"].__cuda_array_interface__["data"][0]
    finally:
        res.model.free()

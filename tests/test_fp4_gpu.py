"""MXFP4 and NVFP4 on a real GPU (marked `gpu`; skipped without one, or with the simulator on).

    python -m pytest -m gpu -p no:cacheprovider tests/test_fp4_gpu.py

The shipped machine code bit-exact to the reference (`planc.execute.kernels.fp4ref`), nothing compiled at
load time; the shipped specs on the device path with --verify; and a small gpt-oss loaded by
`planc.load_into` into transformers' GptOss equal, weight for weight and in its logits, to
transformers' own dequantizing load (`Mxfp4Config(dequantize=True)`) of the same files.
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

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from planc.compiler.compile import compile_spec  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.kernels import fp4ref  # noqa: E402
from planc.execute.device import launch, seam  # noqa: E402
from planc.execute.kernels.fp4_dispatch import dequantize_fp4  # noqa: E402
from planc.tools.synth_fp4 import TINY, tensors, write_fp4_checkpoint  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]
ROOT = os.path.join(os.path.dirname(__file__), "..")


def _run(fmt, w, s, s2, target, batch, rows, cols, t):
    size = {"BF16": 2, "F16": 2, "F32": 4}[target]
    out = cuda.device_array(batch * rows * cols * size, np.uint8)
    s2_d = None if s2 is None else cuda.to_device(np.asarray(s2, np.float32).reshape(1).view(np.uint8))
    dequantize_fp4(cuda.to_device(w.reshape(-1)), cuda.to_device(s.reshape(-1).view(np.uint8)), s2_d, out, fmt, target,
                   batch, rows, cols, t, dev=seam.device())
    cuda.synchronize()
    return out.copy_to_host()


@pytest.mark.parametrize("target", ["BF16", "F16", "F32"])
def test_shipped_kernels_bit_exact(target, monkeypatch):
    monkeypatch.setenv("PLANC_RAW_LAUNCH", "1")
    dev = seam.device()
    before = dev.kernel_stats()
    rng = np.random.default_rng(3)
    classes = np.array([0, 1, 127, 254, 255], np.uint8)
    every = np.tile(np.arange(256, dtype=np.uint8).reshape(1, 16, 16), (5, 1, 1, 1))
    cases = [(every, np.repeat(classes[:, None, None], 16, axis=2)),
             (rng.integers(0, 256, (3, 100, 5, 16), dtype=np.uint8),
              rng.choice(np.array([0, 1, 100, 127, 140, 254, 255], np.uint8), (3, 100, 5)))]
    for b, s in cases:
        for t in (False, True):
            want = fp4ref.mxfp4(b, s, target, t).reshape(-1).view(np.uint8)
            assert np.array_equal(_run("mxfp4", b, s, None, target, b.shape[0], b.shape[1], b.shape[2] * 32, t), want)
    w = rng.integers(0, 256, (70, 40), dtype=np.uint8)
    sc = rng.integers(0, 256, (70, 5), dtype=np.uint8)
    for s2 in (np.float32(0.0123), np.float32(np.inf), np.float32(0.0)):
        for t in (False, True):
            want = fp4ref.nvfp4(w, sc, s2, target, t).reshape(-1).view(np.uint8)
            assert np.array_equal(_run("nvfp4", w, sc, s2, target, 1, 70, 80, t), want)
    got = launch.since(before, dev.kernel_stats())
    assert got["kernels_compiled"] == 0, got["fallbacks"]


@pytest.mark.parametrize("fam", ["mxfp4", "nvfp4"])
def test_shipped_specs_on_the_device(tmp_path, fam):
    write_fp4_checkpoint(tmp_path / fam, fam)
    name = "gpt-oss" if fam == "mxfp4" else "llama-nvfp4"
    doc = yaml.safe_load(open(os.path.join(ROOT, "specs", f"transformers-{name}.yaml")))
    doc["checkpoint"] = str(tmp_path / fam / "model.safetensors")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    plan = compile_spec(spec)
    assert {p.path for p in plan.parts if p.op.startswith("dequantize")} == {"direct"}
    dev = seam.device()
    before = dev.kernel_stats()
    m = execute(plan, verify=True)
    try:
        assert m.report["verify"]["ok"]
        assert m.report["kernels"].predicted == m.report["kernels"].issued
        src = tensors(fam, TINY[fam])
        if fam == "mxfp4":
            e = "model.layers.1.mlp.experts"
            want = fp4ref.mxfp4(src[f"{e}.down_proj_blocks"], src[f"{e}.down_proj_scales"], transpose=True)
            got = m[f"{e}.down_proj"].to_host()
        else:
            p = "model.layers.1.self_attn.q_proj"
            want = fp4ref.nvfp4(src[f"{p}.weight"], src[f"{p}.weight_scale"], src[f"{p}.weight_scale_2"])
            got = m[f"{p}.weight"].to_host()
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    finally:
        m.free()
    assert launch.since(before, dev.kernel_stats())["kernels_compiled"] == 0


def test_gpt_oss_load_into_equals_transformers_dequantizing_load(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import planc
    from planc.tools.synth_fp4 import write_gpt_oss

    d = tmp_path / "gpt-oss"
    write_gpt_oss(d)
    doc = yaml.safe_load(open(os.path.join(ROOT, "specs", "transformers-gpt-oss.yaml")))
    doc["checkpoint"] = str(d / "model.safetensors")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        d, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.bfloat16, device_map="cuda")
    config = transformers.AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        mine = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    res = planc.load_into(mine, spec)
    try:
        a, b = hf.state_dict(), mine.state_dict()
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) if a[k].dtype == torch.bfloat16 \
                else torch.equal(a[k], b[k]), k
        ids = torch.randint(0, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0)).to("cuda")
        with torch.no_grad():
            assert torch.equal(hf.eval()(ids).logits, mine.eval()(ids).logits)
    finally:
        res.model.free()

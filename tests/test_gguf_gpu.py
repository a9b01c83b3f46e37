"""The GGUF dequantization kernels on a real GPU (marked `gpu`): bit-exact to the `gguf` package.

Run this file alone, in a process where the CUDA simulator is off:

    python -m pytest -m gpu -p no:cacheprovider tests/test_gguf_gpu.py

Each type into each float dtype, over tensors of many blocks (full grids, several grid-stride
steps), twice: from the shipped PTX (`planc/execute/kernels/ptx`, nothing compiled) and compiled by numba
(`launch.go` with the raw launch off), so that a kernel the GPU's compiler cannot type, or types
otherwise than the simulator, fails here.
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

gguf = pytest.importorskip("gguf")

from planc.execute.device import launch, seam  # noqa: E402
from planc.execute.kernels.gguf_dispatch import dequantize_gguf  # noqa: E402
from planc.tools.synth_gguf import GGUFTensor, tensor_bytes  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]

QTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
ROWS, COLS = 300, 4096  # 1.2 M elements: more than one grid-stride step


def _want(raw, qtype, out):
    import ml_dtypes

    ref = gguf.quants.dequantize(raw.reshape(ROWS, -1), gguf.GGMLQuantizationType[qtype]).reshape(-1)
    return {"F32": ref.view(np.uint32), "F16": ref.astype(np.float16).view(np.uint16),
            "BF16": ref.astype(ml_dtypes.bfloat16).view(np.uint16)}[out]


@pytest.mark.parametrize("raw_launch", ["1", "0"], ids=["shipped-ptx", "numba"])
@pytest.mark.parametrize("qtype", QTYPES)
def test_dequant_bit_exact_on_the_gpu(qtype, raw_launch, monkeypatch):
    monkeypatch.setenv("PLANC_RAW_LAUNCH", raw_launch)
    raw = tensor_bytes(GGUFTensor(f"gpu.{qtype}", qtype, (ROWS, COLS)))
    src = cuda.to_device(raw)
    dev = seam.device()
    before = dev.kernel_stats()
    for out in ("F32", "F16", "BF16"):
        dst = cuda.device_array(ROWS * COLS, np.uint32 if out == "F32" else np.uint16)
        dequantize_gguf(src, dst, qtype, out, ROWS * COLS, dev=dev)
        got = dst.copy_to_host()
        want = _want(raw, qtype, out)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{qtype}->{out}: {bad.size} elements differ, first at {bad[:4].tolist()}: "
                               f"{got[bad[:4]].tolist()} != {want[bad[:4]].tolist()}")
    used = launch.since(before, dev.kernel_stats())
    if raw_launch == "1":
        assert used["kernels_compiled"] == 0, used["fallbacks"]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
def test_shipped_llama_spec_on_the_gpu(tmp_path, quant):
    """specs/transformers-llama-gguf.yaml on a one-layer Llama GGUF, dequantized to bfloat16 on the
    GPU: q / k each one part read whole, dequantized by one shared kernel that writes their rows in
    transformers' order (no 2-D copy); every tensor bit for bit against the `gguf` package's dequantization (q / k unpermuted), the
    requests, copies and kernels as planned, `--verify`'s host check passing."""
    import ml_dtypes
    import yaml

    from execute_support import gguf_llama_want, load_checked
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant=quant, layers=1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = yaml.safe_load(open(os.path.join(root, "specs", "transformers-llama-gguf.yaml")).read())
    doc["checkpoint"], doc["budget"] = str(res.path), {"host": "1GiB"}
    spec = tmp_path / "llama-gguf.yaml"
    spec.write_text(yaml.safe_dump(doc))
    models = []
    try:
        plan, model = load_checked(spec, models)
        qk = [p for p in plan.parts if p.unpermute]
        assert len(qk) == 2 and all(p.op == "gguf" and len(p.inputs) == 1 and p.inputs[0].count == 1 for p in qk)
        kernels = [k for r in plan.runs for k in r.kernels if k.unpermute]
        assert [sorted(k.parts) for k in kernels] == [sorted(p.id for p in qk)]  # one launch for q and k
        assert all(c.rows == 1 for r in plan.runs for q in r.requests for c in q.copies)
        for name, (gguf_name, want) in gguf_llama_want(res.path).items():
            assert model[name].to_host().tobytes() == want.astype(ml_dtypes.bfloat16).tobytes(), gguf_name
    finally:
        for m in models:
            m.free()


def _llamacpp_files():
    """The committed llama.cpp-made Q4_K_M file, and any llama.cpp-made files in $PLANC_LLAMACPP_DIR."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, "data", "llamacpp-Q4_K_M.gguf")]
    extra = os.environ.get("PLANC_LLAMACPP_DIR")
    if extra and os.path.isdir(extra):
        files += sorted(os.path.join(extra, f) for f in os.listdir(extra) if f.endswith(".gguf"))
    return files


@pytest.mark.parametrize("path", _llamacpp_files(), ids=os.path.basename)
def test_llamacpp_files_dequantized_on_the_gpu(tmp_path, path):
    """A file made by llama.cpp's `llama-quantize`, every tensor dequantized to float32 on the GPU
    (the shipped kernels), each value bit for bit as `gguf.quants.dequantize` makes it; requests,
    copies and kernels as planned, `--verify` passing."""
    from execute_support import llamacpp_want, load_checked, spec_file

    spec = spec_file(tmp_path, path, [{"match": "*", "dtype": "float32"}], host="1GiB", name="lc.yaml")
    models = []
    try:
        plan, model = load_checked(spec, models)
        for name, w in llamacpp_want(path).items():
            got = model[name].to_host()
            assert got.tobytes() == w.tobytes(), (os.path.basename(path), name)
    finally:
        for m in models:
            m.free()

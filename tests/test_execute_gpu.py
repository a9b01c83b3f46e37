"""The executor's key cases on a real GPU (marked `gpu`), with tensors large enough for full grids.

Run this file alone, in a process where the CUDA simulator is off:

    python -m pytest -m gpu -p no:cacheprovider tests/test_execute_gpu.py

numba fixes simulator or GPU once, at its first import, and the simulator tests
(tests/test_execute.py, tests/test_kernels.py) switch it on; so this module skips itself when
NUMBA_ENABLE_CUDASIM is set, and when no GPU is present. Each load is checked by
`execute(plan, verify=True)` and independently against numpy / ml_dtypes arrays built from the
tensors the test wrote (tests/execute_support.py).
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

import json  # noqa: E402

import numpy as np  # noqa: E402
from execute_support import (CONVERSIONS, QKV, STACK, TARGET, assert_model, cast, convert_source,  # noqa: E402
                             dequantized, fp8_rules, fused, load_checked, reader_of, spec_file, stacked, synth,
                             use_parts)

from planc.execute.pipeline.parts import Parts  # noqa: E402
from planc.face import cli  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import AdmissionError, ReadError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.io.reader import Reader  # noqa: E402
from planc.execute.device.seam import memory_info  # noqa: E402

# Small tensors get small grids on purpose.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]

GPU_IO = {"workers": 8, "slot": "1MiB", "slots": 8, "run": "8MiB", "merge_gap": "1MiB"}
MIB = 2**20


@pytest.fixture
def load():
    models = []
    yield lambda spec_path, **kw: load_checked(spec_path, models, **kw)
    for m in models:
        m.free()


@pytest.fixture(scope="module")
def dense32(tmp_path_factory):
    """A ~32 MiB dense BF16 checkpoint in two shards (MLP widths not multiples of 128)."""
    return synth(tmp_path_factory.mktemp("dense32"), "dense", size_bytes=32 * MIB, shards=2)


def _free_bytes() -> int:
    """Free device memory as the driver reports it, with no flush of numba's own: the executor and
    `LoadedModel.free()` must have given their memory back themselves."""
    return memory_info()[0]


def _no_allocation(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("allocated although the plan was refused")

    use_parts(monkeypatch, regions=refuse, reader=refuse, pool=refuse, warmer=refuse)


# ------------------------------------------------------------------------------------------
# loads


FUSE_CONVERT = [QKV, {"match": "*.mlp.*", "dtype": "float16"}, {"match": "*layernorm.weight", "dtype": "float32"},
                {"match": "*"}]


def _fused_and_converted(want: dict) -> dict:
    """What FUSE_CONVERT makes of the dense checkpoint's arrays."""
    layers = sum(1 for k in want if k.endswith(".self_attn.q_proj.weight"))
    out = fused(want, layers)
    for k in out:
        if ".mlp." in k:
            out[k] = cast(out[k], "F16")
        elif k.endswith("layernorm.weight"):
            out[k] = cast(out[k], "F32")
    return out


def test_dense_fuse_and_convert(tmp_path, load, dense32):
    path, want = dense32
    plan, model = load(spec_file(tmp_path, path, FUSE_CONVERT, io=GPU_IO, host="1GiB"))
    assert plan.totals.runs > 2 and plan.totals.kernels > 0
    assert_model(model, _fused_and_converted(want))
    rep = model.report
    assert rep["simulator"] is False and rep["gb_per_s"] > 0
    assert rep["device_memory"]["measured_allocated_bytes"] >= plan.layout.arena_bytes


@pytest.mark.parametrize("on", ["device", "host"])
@pytest.mark.parametrize("src,target", CONVERSIONS)
def test_conversion(tmp_path, load, src, target, on):
    path, want = convert_source(tmp_path, src, n=1 << 20)
    rules = [{"match": "conv.*", "dtype": target, "on": on}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=GPU_IO, host="1GiB"))
    t = TARGET[target]
    assert_model(model, {k: v if k == "keep.c" else cast(v, t) for k, v in want.items()})


def test_stack_moe_experts(tmp_path, load):
    path, want = synth(tmp_path, "moe", size_bytes=64 * MIB)
    rules = [dict(STACK, dtype="float16"), {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=GPU_IO, host="1GiB"))
    assert plan.totals.scatters > 0  # requests of many experts go through the scatter kernel
    layers = sum(1 for k in want if k.endswith(".self_attn.q_proj.weight"))
    experts = sum(1 for k in want if k.startswith("model.layers.0.mlp.experts.") and k.endswith(".up_proj.weight"))
    assert_model(model, stacked(want, layers, experts, "F16"))


@pytest.mark.parametrize("on,target", [("device", "keep"), ("host", "keep"), ("host", "float32")])
def test_transpose(tmp_path, load, dense32, on, target):
    path, want = dense32
    rules = [{"match": "*.mlp.down_proj.weight", "transpose": True, "on": on, "dtype": target}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=GPU_IO, host="1GiB"))
    out = dict(want)
    for k in out:
        if k.endswith(".mlp.down_proj.weight"):
            t = np.ascontiguousarray(out[k].T)
            out[k] = cast(t, "F32") if target == "float32" else t
    assert_model(model, out)


@pytest.mark.parametrize("on", ["device", "host"])
@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_dequantize_fp8(tmp_path, load, on, target):
    path, want = synth(tmp_path, "fp8", size_bytes=32 * MIB)
    plan, model = load(spec_file(tmp_path, path, fp8_rules(target, on), io=GPU_IO, host="1GiB"))
    with np.errstate(over="ignore", invalid="ignore"):
        assert_model(model, dequantized(want, TARGET[target]))


def test_small_io_shapes(tmp_path, load):
    """A one-slot ring of 4 KiB, more workers than parts, many small runs."""
    path, want = synth(tmp_path, "dense", layers=2)
    rules = [QKV, {"match": "*.mlp.*", "dtype": "float32"}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 1, "workers": 64, "run": "8KiB"}))
    assert plan.layout.ring_bytes == 4096 and plan.totals.runs > 10
    out = fused(want, 2)
    assert_model(model, {k: cast(v, "F32") if ".mlp." in k else v for k, v in out.items()})


@pytest.mark.parametrize("direct", ["off", "auto", "on"])
def test_direct_modes(tmp_path, load, dense32, direct):
    path, want = dense32
    spec = spec_file(tmp_path, path, [{"match": "*"}], io=dict(GPU_IO, direct=direct), host="1GiB")
    try:
        plan, model = load(spec)
    except ReadError as e:
        assert direct == "on" and e.code == "direct-refused", e
        return
    assert len(model.report["files"]) == 2 and all(m["why"] for m in model.report["files"].values())
    assert_model(model, want)


# ------------------------------------------------------------------------------------------
# the device side: zero-copy views, memory given back, refusals


def test_cuda_array_interface_and_torch(tmp_path, load, dense32):
    path, want = dense32
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=GPU_IO, host="1GiB"))
    name = "model.layers.0.mlp.up_proj.weight"
    d = model[name]
    iface = d.__cuda_array_interface__
    assert iface["shape"] == want[name].shape and iface["typestr"] == "<u2"
    view = cuda.as_cuda_array(d)
    assert np.array_equal(view.copy_to_host(), want[name].view(np.uint16))
    torch = pytest.importorskip("torch")
    t = d.torch()
    assert t.dtype == torch.bfloat16 and t.is_cuda and t.data_ptr() == iface["data"][0]
    assert np.array_equal(t.view(torch.int16).cpu().numpy().view(np.uint16), want[name].view(np.uint16))


def test_free_gives_the_device_memory_back(tmp_path, dense32):
    path, _ = dense32
    spec = spec_file(tmp_path, path, [QKV, {"match": "*.mlp.*", "dtype": "float32"}, {"match": "*"}], io=GPU_IO,
                     host="1GiB")
    plan = compile_spec(spec)
    execute(plan).free()  # compiles the kernels and creates the context: the baseline after it
    before = _free_bytes()
    model = execute(plan)
    assert before - _free_bytes() >= plan.layout.arena_bytes
    model.free()
    assert _free_bytes() >= before - 4 * MIB


def test_failed_read_gives_the_memory_back(tmp_path, load, dense32, monkeypatch):
    path, want = dense32
    spec = spec_file(tmp_path, path, [{"match": "*.mlp.*", "dtype": "float32"}, {"match": "*"}], io=GPU_IO,
                     host="1GiB")
    plan = compile_spec(spec)
    execute(plan).free()
    before = _free_bytes()
    calls = []

    class FailingReader(Reader):  # fails on its 5th planned read
        def read_into(self, *a):
            calls.append(1)
            if len(calls) == 5:
                raise ReadError("injected failure", code="read-failed")
            return super().read_into(*a)

    with pytest.raises(ReadError) as ei:
        execute(plan, parts=Parts(reader=reader_of(FailingReader)))
    assert _free_bytes() >= before - 4 * MIB, "device memory held after the failed load"
    del ei
    _, model = load(spec)
    assert_model(model, {k: cast(v, "F32") if ".mlp." in k else v for k, v in want.items()})


def test_device_room_refusal_before_allocating(tmp_path, monkeypatch):
    """A sparse checkpoint larger than the GPU: refused by the live check, nothing allocated."""
    free, total = memory_info()
    path, _ = _sparse(tmp_path, total + 16 * 2**30)
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=GPU_IO, host="1GiB"))
    assert plan.fits  # no budget.device: only the live check can refuse it
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.code == "device-room" and ei.value.exit_code == 3


def _sparse(tmp_path, size: int):
    from planc.tools.synth import write_checkpoint

    res = write_checkpoint(tmp_path / "sparse", "dense", size_bytes=size, shards=4, sparse=True)
    return res.path, None


def test_live_room_refusal(tmp_path, dense32, monkeypatch):
    path, _ = dense32
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=GPU_IO, host="1GiB"))
    monkeypatch.setenv("PLANC_HOST_RESERVE", "100TiB")
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.code == "live-room" and ei.value.exit_code == 3


def test_cli_run_json_verify(tmp_path, capsys, dense32):
    path, _ = dense32
    spec = spec_file(tmp_path, path, [QKV, {"match": "*.mlp.*", "dtype": "float16"}, {"match": "*"}], io=GPU_IO,
                     host="1GiB")
    assert cli.main(["run", str(spec), "--json", "--verify"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verify"]["ok"] is True and rep["simulator"] is False
    for k in ("requests", "copies", "kernels"):
        assert rep[k]["issued"] == rep[k]["predicted"]


def test_kernels_launch_from_their_cubin_after_the_first_load(tmp_path, load, dense32):
    """The first load compiles through numba and writes each kernel's cubin; the second launches
    them through the driver (planc.execute.device.launch) and gives the same bits."""
    from planc.execute.device import launch, seam

    assert launch.enabled(seam.device())
    path, want = dense32
    spec = spec_file(tmp_path, path, FUSE_CONVERT, io=GPU_IO, host="1GiB")
    out = _fused_and_converted(want)
    for _ in range(2):
        plan, model = load(spec)
        assert_model(model, out)
    names = {k[0] for k, fn in launch.LAUNCHER.functions.items() if fn}
    assert {"bf16_to_f16", "bf16_to_f32"} <= names, names

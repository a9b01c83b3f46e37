"""MXFP4 and NVFP4 on the device (`planc.execute.kernels.fp4_kernels`), under the CUDA simulator: bit-exact to
the reference (`planc.execute.kernels.fp4ref`) for every byte and every scale class, in odd shapes; the
launcher's refusals; the device path end to end (single tensors, a stack of experts stored one
tensor each), its landing buffers admitted; and results independent of run and request boundaries."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numba import cuda  # noqa: E402

from conftest import write_spec, write_st  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import BindError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.kernels import fp4ref  # noqa: E402
from planc.execute.kernels.fp4_dispatch import dequantize_fp4  # noqa: E402
from planc.execute.device.seam import default_device  # noqa: E402

DEV = default_device()  # the simulator's (NUMBA_ENABLE_CUDASIM=1 above)

TARGETS = ("BF16", "F16", "F32")
E8M0_CLASSES = (0, 1, 127, 254, 255)


def _device(fmt, blocks, scales, scale_2, out_dtype, batch, rows, cols, transpose):
    """The kernel's output bytes for host inputs."""
    size = {"BF16": 2, "F16": 2, "F32": 4}[out_dtype]
    out = cuda.to_device(np.full(batch * rows * cols * size, 0xA5, np.uint8))
    s2 = None if scale_2 is None else cuda.to_device(np.asarray(scale_2, np.float32).reshape(1).view(np.uint8))
    dequantize_fp4(cuda.to_device(blocks.reshape(-1)), cuda.to_device(scales.reshape(-1).view(np.uint8)), s2, out,
                   fmt, out_dtype, batch, rows, cols, transpose, dev=DEV)
    return out.copy_to_host()


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return np.array_equal(got, np.ascontiguousarray(want).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_mxfp4_every_byte_and_exponent_class(target, transpose):
    # five single-row matrices, one per E8M0 class, each holding every byte value
    blocks = np.tile(np.arange(256, dtype=np.uint8).reshape(1, 16, 16), (len(E8M0_CLASSES), 1, 1, 1))
    scales = np.repeat(np.array(E8M0_CLASSES, np.uint8)[:, None, None], 16, axis=2)  # [5, 1, 16]
    want = fp4ref.mxfp4(blocks, scales, target, transpose)
    assert _same(_device("mxfp4", blocks, scales, None, target, 5, 1, 512, transpose), want)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's numpy: inf x 0, 3e38 x 448
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_nvfp4_every_byte_and_scale_class(target, transpose):
    # rows of every byte, each row's 32 blocks scaled by E4M3 zero, subnormals, 1, the largest, NaN,
    # negatives; and per-tensor scales that are ordinary, tiny, zero, huge and infinite
    e4m3 = np.array([0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0x7F, 0x80, 0xB8, 0xFE, 0xFF, 0x40,
                     0x30, 0x3F, 0x41, 0x77] * 2, np.uint8)
    w = np.arange(256, dtype=np.uint8).reshape(1, 256)
    for s2 in (np.float32(0.0123), np.float32(2.0 ** -120), np.float32(0.0), np.float32(3e38), np.float32(np.inf)):
        want = fp4ref.nvfp4(w, e4m3[None, :], s2, target, transpose)
        assert _same(_device("nvfp4", w, e4m3[None, :], s2, target, 1, 1, 512, transpose), want), s2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(2, 33, 3), (1, 1, 1), (3, 2, 5)])  # (batch, rows, G): odd tiles, one row
def test_mxfp4_odd_shapes(shape, target):
    b, r, g = shape
    rng = np.random.default_rng(sum(shape))
    blocks = rng.integers(0, 256, (b, r, g, 16), dtype=np.uint8)
    scales = rng.choice(np.array([0, 1, 100, 127, 140, 254, 255], np.uint8), (b, r, g))
    for t in (False, True):
        want = fp4ref.mxfp4(blocks, scales, target, t)
        assert _same(_device("mxfp4", blocks, scales, None, target, b, r, g * 32, t), want), t


@pytest.mark.parametrize("shape", [(1, 8), (33, 24), (5, 40)])  # [R, C/2]: a single row, 48 and 80 values
def test_nvfp4_odd_shapes(shape):
    rng = np.random.default_rng(shape[0])
    w = rng.integers(0, 256, shape, dtype=np.uint8)
    sc = rng.integers(0, 256, (shape[0], shape[1] // 8), dtype=np.uint8)
    for target in TARGETS:
        for t in (False, True):
            want = fp4ref.nvfp4(w, sc, np.float32(0.07), target, t)
            assert _same(_device("nvfp4", w, sc, np.float32(0.07), target, 1, shape[0], shape[1] * 2, t), want)


def test_the_launcher_refuses_what_the_kernels_cannot_do():
    buf, out = cuda.device_array(64, np.uint8), cuda.device_array(512, np.uint8)
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize_fp4(buf, buf, None, out, "mxfp4", "BF16", 1, 1, 48, dev=DEV)
    with pytest.raises(ValueError, match="bytes, 64 needed"):
        dequantize_fp4(buf[:16], buf[16:20], None, out, "mxfp4", "BF16", 1, 1, 128, dev=DEV)
    with pytest.raises(ValueError, match="overlap"):
        dequantize_fp4(out[:16], out[16:17], None, out, "mxfp4", "BF16", 1, 1, 32, dev=DEV)
    with pytest.raises(ValueError, match="per-tensor scale"):
        dequantize_fp4(buf[:8], buf[8:9], None, out, "nvfp4", "BF16", 1, 1, 16, dev=DEV)
    with pytest.raises(ValueError, match="aligned"):
        dequantize_fp4(buf[:8], buf[8:9], buf[9:13], out, "nvfp4", "BF16", 1, 1, 16, dev=DEV)
    with pytest.raises(ValueError, match="FP4 format"):
        dequantize_fp4(buf, buf, None, out, "fp8", "BF16", 1, 1, 32, dev=DEV)
    with pytest.raises(ValueError, match="float target"):
        dequantize_fp4(buf, buf, None, out, "mxfp4", "F8_E4M3", 1, 1, 32, dev=DEV)


# -- the device path end to end -------------------------------------------------------------------

def _experts(rng, e: int, rows: int, g: int) -> dict:
    out = {}
    for k in range(e):
        out[f"experts.{k}.w_blocks"] = rng.integers(0, 256, (rows, g, 16), dtype=np.uint8)
        out[f"experts.{k}.w_scales"] = rng.integers(118, 136, (rows, g), dtype=np.uint8)
    return out


def _checkpoint(folder: Path, seed: int = 0) -> dict:
    """A tiny mixed FP4 checkpoint: an MXFP4 expert stack [2, 40, 64], per-expert MXFP4 tensors, NVFP4
    linears (one of a single row) and a BF16 bystander."""
    rng = np.random.default_rng(seed)
    t = {"moe.w_blocks": rng.integers(0, 256, (2, 40, 2, 16), dtype=np.uint8),
         "moe.w_scales": rng.integers(118, 136, (2, 40, 2), dtype=np.uint8),
         "norm.weight": rng.standard_normal(24).astype(ml_dtypes.bfloat16)}
    t.update(_experts(rng, 3, 33, 1))
    for name, (r, c) in {"lin.a": (20, 48), "lin.b": (1, 32)}.items():
        t[f"{name}.weight"] = rng.integers(0, 256, (r, c // 2), dtype=np.uint8)
        t[f"{name}.weight_scale"] = rng.uniform(0.25, 2, (r, c // 16)).astype(ml_dtypes.float8_e4m3fn)
        t[f"{name}.weight_scale_2"] = np.array(0.004, np.float32)
        t[f"{name}.input_scale"] = np.array(0.05, np.float32)
    write_st(folder / "m.safetensors", t)
    return t


RULES = [
    {"match": "moe.w_blocks", "dequantize": {"format": "mxfp4"}, "transpose": True},
    {"match": "experts.{E}.w_blocks", "dequantize": {"format": "mxfp4"}, "transpose": True, "dtype": "float16",
     "stack": {"into": "experts.w", "over": "E"}},
    {"match": "lin.{N}.weight", "source_dtype": ["U8"], "dequantize": {"format": "nvfp4"}, "dtype": "float32"},
    {"match": "*"},
]


def _expected(t: dict) -> dict:
    return {
        "moe.w": fp4ref.mxfp4(t["moe.w_blocks"], t["moe.w_scales"], "BF16", True),
        "experts.w": np.stack([fp4ref.mxfp4(t[f"experts.{k}.w_blocks"], t[f"experts.{k}.w_scales"], "F16", True)
                               for k in range(3)]),
        **{f"lin.{n}.weight": fp4ref.nvfp4(t[f"lin.{n}.weight"], t[f"lin.{n}.weight_scale"],
                                           t[f"lin.{n}.weight_scale_2"], "F32") for n in ("a", "b")},
        "norm.weight": t["norm.weight"],
    }


def _load(folder: Path, io: dict | None = None):
    doc = {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"}, "rules": RULES}
    if io:
        doc["io"] = io
    plan = compile_spec(write_spec(folder, doc, f"spec{abs(hash(str(io)))}.yaml"))
    assert plan.fits
    return plan, execute(plan, verify=True)


def _check(m, want: dict) -> None:
    assert sorted(m.keys()) == sorted(want)
    for name, w in want.items():
        got = m[name].to_host()
        assert got.shape == w.shape, name
        assert np.array_equal(got.reshape(-1).view(np.uint8), np.ascontiguousarray(w).reshape(-1).view(np.uint8)), name


def test_device_path_bit_exact_with_a_stack_and_its_landing_admitted(tmp_path):
    t = _checkpoint(tmp_path)
    plan, m = _load(tmp_path)
    try:
        assert m.report["verify"]["ok"]
        _check(m, _expected(t))
        assert m.report["kernels"].predicted == m.report["kernels"].issued == 6  # the stack, 3 experts, 2 linears
    finally:
        m.free()
    fp4_parts = [p for p in plan.parts if p.op in ("dequantize", "dequantize_t")]
    assert len(fp4_parts) == 6 and all(p.path == "direct" and p.host_bytes == 0 for p in fp4_parts)
    for r in plan.runs:
        mine = [plan.parts[k.part] for k in r.kernels]
        # the landing region holds every input of the run's parts (NVFP4's tensor scale 4-aligned after its scales)
        assert r.landing_bytes >= sum(i.nbytes for p in mine for i in p.inputs)
        assert r.landing_bytes <= sum(i.nbytes + 3 for p in mine for i in p.inputs)
    assert plan.layout.landing_bytes >= max(r.landing_bytes for r in plan.runs if r.kernels)


def test_device_plans_pass_the_plan_check(tmp_path):
    """A plan on the device path survives its file: written, read back and checked (NVFP4's per-tensor
    scale lands after its block scales), and a landing offset moved is refused."""
    import dataclasses

    from planc.base.errors import PlanFormatError
    from planc.plan.codec import checked, decode, encode, load_plan, save_plan

    _checkpoint(tmp_path)
    plan, m = _load(tmp_path)
    m.free()
    save_plan(plan, tmp_path / "plan.json")
    assert encode(load_plan(tmp_path / "plan.json")) == encode(plan)
    checked(plan)
    r = next(r for r in plan.runs if any(len(plan.parts[k.part].inputs) == 3 for k in r.kernels))
    k = next(k for k in r.kernels if len(plan.parts[k.part].inputs) == 3)
    moved = r._replace(kernels=tuple(x._replace(scale_offset=x.scale_offset + 4) if x is k else x for x in r.kernels))
    bad = dataclasses.replace(plan, runs=tuple(moved if x.index == r.index else x for x in plan.runs))
    with pytest.raises(PlanFormatError) as ei:
        decode(encode(bad))
    assert ei.value.code == "plan-invalid"


def test_hostile_scales_are_refused_on_the_device_path_too(tmp_path):
    t = _checkpoint(tmp_path)
    t["lin.a.weight_scale"] = t["lin.a.weight_scale"].view(np.uint8)  # U8, not F8_E4M3
    write_st(tmp_path / "m.safetensors", t)
    with pytest.raises(BindError) as ei:
        _load(tmp_path)
    assert ei.value.code == "scale-shape" and "lin.a.weight_scale" in str(ei.value) and "lin.a.weight " in str(ei.value)


_FOLDER = Path(tempfile.mkdtemp(prefix="planc-fp4-device-"))
_TENSORS = _checkpoint(_FOLDER, seed=7)
_WANT = _expected(_TENSORS)


@settings(max_examples=6, deadline=None)
@given(run=st.sampled_from([1, 700, 3000, 9000, 1 << 20]), slot=st.sampled_from([4096, 8192, 12288]),
       gap=st.sampled_from([0, 4096]))
def test_results_do_not_depend_on_run_and_request_boundaries(run, slot, gap):
    _plan, m = _load(_FOLDER, {"run": run, "slot": slot, "slots": 2, "merge_gap": gap})
    try:
        _check(m, _WANT)
    finally:
        m.free()


def test_the_transposing_geometry_fits_the_tile():
    """The transposing kernels read a tile row's 32 bytes with the 32 threads along x and write its
    32 rows with them: every grid must give blocks 32 threads wide, and tiles must not straddle two
    matrices of a batch (rows padded to whole tiles)."""
    from planc.execute.kernels import fp4_kernels
    from planc.execute.kernels.fp4_dispatch import TILE_ROWS, TILE_VALUES, geometry
    from planc.execute.device.geometry import GpuGrid, SimGrid

    assert (TILE_ROWS, TILE_VALUES) == (fp4_kernels.TILE_ROWS, 2 * fp4_kernels.TILE_BYTES)
    for grid in (GpuGrid(132), SimGrid()):
        (gx, gy), block = geometry(grid, 3 * 33 * 96, 33, 96, True)
        assert block[0] == 32 and gx >= 1 and gy >= 1
    (gx, gy), _ = geometry(GpuGrid(132), 3 * 33 * 96, 33, 96, True)
    assert (gx, gy) == (2, 6)  # 96 values: 2 column tiles; 33 rows: 2 row tiles per matrix, 3 matrices
    blocks, threads = geometry(GpuGrid(132), 2 * 64, 2, 64, False)
    assert blocks * threads >= 64  # one thread a byte

"""Bit-exact tests of the GPU kernels in planc.execute.kernels.kernels against planc.execute.kernels.refconv.

The CUDA simulator is switched on here, before numba is first imported, unless the environment
already says otherwise: with NUMBA_ENABLE_CUDASIM=0 the same tests run on a real GPU. Each
simulated thread is a Python thread, so cases stay at a few thousand elements, except the
exhaustive 65,536-pattern runs of the 16-bit conversions.

NaN results are compared by position and sign where the reference rule could differ between
numpy builds, and then checked against the kernels' own documented NaN rule.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import ml_dtypes  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip(
        "numba was imported before the CUDA simulator could be switched on, and no GPU is present",
        allow_module_level=True,
    )

from planc.execute.kernels import dispatch as D  # noqa: E402
from planc.execute.kernels import kernels as K  # noqa: E402
from planc.execute.kernels import refconv as R  # noqa: E402
from planc.execute.device.seam import default_device  # noqa: E402

DEV = default_device()  # the simulator's (NUMBA_ENABLE_CUDASIM=1 above)

NP = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
BITS = {"F32": np.uint32, "F16": np.uint16, "BF16": np.uint16}
ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


# ------------------------------------------------------------------------------------------
# helpers


def _dev(a: np.ndarray):
    return cuda.to_device(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _host(d, name: str) -> np.ndarray:
    return d.copy_to_host().view(BITS[name])


def _is_nan(bits: np.ndarray, name: str) -> np.ndarray:
    return np.isnan(bits.view(NP[name]).astype(np.float32))


def _assert_same(got: np.ndarray, ref: np.ndarray, name: str, nan_sign: bool = True) -> None:
    """Bit-exact on every non-NaN reference; NaN exactly where the reference is NaN."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    g_nan, r_nan = _is_nan(got, name), _is_nan(ref, name)
    where = np.flatnonzero(g_nan != r_nan)[:8]
    assert np.array_equal(g_nan, r_nan), f"NaN positions differ at {where}"
    bad = np.flatnonzero((got != ref) & ~r_nan)
    assert bad.size == 0, (
        f"{bad.size} mismatches, first at {bad[:4]}: got {[hex(v) for v in got[bad[:4]]]}, "
        f"want {[hex(v) for v in ref[bad[:4]]]}"
    )
    if nan_sign:
        top = np.uint64(got.dtype.itemsize * 8 - 1)
        sign_g = got[r_nan].astype(np.uint64) >> top
        sign_r = ref[r_nan].astype(np.uint64) >> top
        assert np.array_equal(sign_g, sign_r), "NaN signs differ"


def _convert(bits: np.ndarray, src: str, dst: str) -> np.ndarray:
    bits = np.ascontiguousarray(bits, dtype=BITS[src])
    n = bits.size
    d_src = _dev(bits)
    d_dst = cuda.device_array(n * np.dtype(BITS[dst]).itemsize, dtype=np.uint8)
    D.convert(d_src, d_dst, src, dst, n, dev=DEV)
    return _host(d_dst, dst)


def _ref(bits: np.ndarray, src: str, dst: str) -> np.ndarray:
    return R.convert_host(np.ascontiguousarray(bits).view(np.uint8), src, dst).view(BITS[dst])


# NaN rules of the kernels (the module docstring of planc.execute.kernels.kernels).
def _nan_to_bf16(f32_bits):
    return ((f32_bits >> 16) & 0x8000 | 0x7FC0).astype(np.uint16)


def _nan_to_f16(f32_bits):
    payload = (f32_bits & 0x7FFFFF) >> 13
    return ((f32_bits >> 16) & 0x8000 | 0x7C00 | np.maximum(payload, 1)).astype(np.uint16)


def _f16_nan_to_f32(h):
    h = h.astype(np.uint32)
    return (h & 0x8000) << 16 | 0x7F800000 | (h & 0x3FF) << 13


def _with_signs(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32)
    return np.concatenate([x, x | np.uint32(0x80000000)])


def _f32_specials() -> np.ndarray:
    return _with_signs(
        [
            0x00000000,  # zero
            0x7F800000,  # infinity
            0x7FC00000,  # quiet NaN
            0x7F800001,  # signalling NaN, payload below every narrow mantissa
            0x7F801FFF,
            0x7F802000,
            0x7FBFFFFF,
            0x7FFFFFFF,
            0x7F810000,
            0x00000001,  # smallest subnormal
            0x007FFFFF,  # largest subnormal
            0x00800000,  # smallest normal
            0x7F7FFFFF,  # largest finite
            0x3F800000,  # 1.0
            0x3F800001,
            0x3FFFFFFF,
        ]
    )


def _f32_midpoints(target: str, rng: np.random.Generator, count: int) -> np.ndarray:
    """float32 values exactly halfway between two consecutive `target` values, and one ulp either
    side, over the whole finite range (subnormals and the step to infinity included)."""
    table = NP[target]
    finite_top = 0x7F7F if target == "BF16" else 0x7BFF
    lows = np.concatenate(
        [
            np.arange(0, 0x0400, dtype=np.uint32),  # subnormals of F16, tiny normals of BF16
            np.arange(finite_top - 0x0400, finite_top + 1, dtype=np.uint32),  # up to max finite
            rng.integers(0, finite_top + 1, count, dtype=np.uint32),
        ]
    ).astype(np.uint16)
    lo = lows.view(table).astype(np.float64)
    hi = (lows.astype(np.uint32) + 1).astype(np.uint16).view(table).astype(np.float64)
    if target == "F16":
        hi[lows == 0x7BFF] = 65536.0  # the next step above the largest finite value
    else:
        hi[lows == 0x7F7F] = 2.0**128
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: one bit more than the target holds
    assert np.array_equal(mid.astype(np.float64), (lo + hi) / 2)
    m = mid.view(np.uint32)
    return _with_signs(np.concatenate([m, m - 1, m + 1]))


def _f32_random(rng: np.random.Generator, count: int) -> np.ndarray:
    raw = rng.integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32)
    # Magnitudes spread over the range of F16 and BF16 alike, subnormals included.
    mags = np.exp2(rng.uniform(-30.0, 20.0, count)) * rng.choice([-1.0, 1.0], count)
    return np.concatenate([raw, mags.astype(np.float32).view(np.uint32)])


# ------------------------------------------------------------------------------------------
# widening, exhaustive over all 65,536 patterns, one launch each


def test_bf16_to_f32_exhaustive():
    got = _convert(ALL16, "BF16", "F32")
    assert np.array_equal(got, ALL16.astype(np.uint32) << 16)
    _assert_same(got, _ref(ALL16, "BF16", "F32"), "F32")


def test_f16_to_f32_exhaustive():
    got = _convert(ALL16, "F16", "F32")
    _assert_same(got, _ref(ALL16, "F16", "F32"), "F32")
    nan = _is_nan(ALL16, "F16")
    assert nan.sum() == 2 * 1023
    assert np.array_equal(got[nan], _f16_nan_to_f32(ALL16[nan]))
    # subnormal inputs become exact normals
    sub = ALL16[1:0x400]
    assert np.array_equal(got[1:0x400].view(np.float32), sub.view(np.float16).astype(np.float32))


# ------------------------------------------------------------------------------------------
# 16-bit <-> 16-bit, exhaustive, then in place


def test_bf16_to_f16_exhaustive():
    got = _convert(ALL16, "BF16", "F16")
    _assert_same(got, _ref(ALL16, "BF16", "F16"), "F16")
    nan = _is_nan(ALL16, "BF16")
    assert np.array_equal(got[nan], _nan_to_f16(ALL16[nan].astype(np.uint32) << 16))


def test_f16_to_bf16_exhaustive():
    got = _convert(ALL16, "F16", "BF16")
    _assert_same(got, _ref(ALL16, "F16", "BF16"), "BF16")
    nan = _is_nan(ALL16, "F16")
    assert np.array_equal(got[nan], _nan_to_bf16(_f16_nan_to_f32(ALL16[nan])))


@pytest.mark.parametrize(("src", "dst"), [("BF16", "F16"), ("F16", "BF16")])
def test_16bit_conversion_in_place(src, dst):
    rng = np.random.default_rng(7)
    bits = np.concatenate(
        [
            rng.integers(0, 1 << 16, 3000, dtype=np.uint32).astype(np.uint16),
            np.array([0, 0x8000, 0x7C00, 0xFC00, 0x7F80, 0xFF80, 0x7E00, 0x7FC0, 1, 0x3FF],
                     dtype=np.uint16),
        ]
    )
    buf = _dev(bits)
    D.convert(buf, buf, src, dst, bits.size, dev=DEV)
    _assert_same(_host(buf, dst), _ref(bits, src, dst), dst)
    # the launcher on uint16 views, in place as well
    buf2 = _dev(bits)
    view = buf2.view(np.uint16)
    D.launch_map("bf16_to_f16" if src == "BF16" else "f16_to_bf16", view, view, bits.size, dev=DEV)
    _assert_same(_host(buf2, dst), _ref(bits, src, dst), dst)


# ------------------------------------------------------------------------------------------
# narrowing from float32


@pytest.mark.parametrize("dst", ["BF16", "F16"])
def test_f32_narrowing(dst):
    rng = np.random.default_rng(11 if dst == "BF16" else 12)
    bits = np.concatenate(
        [_f32_specials(), _f32_midpoints(dst, rng, 200), _f32_random(rng, 1000)]
    )
    got = _convert(bits, "F32", dst)
    ref = _ref(bits, "F32", dst)
    _assert_same(got, ref, dst)
    nan = _is_nan(bits, "F32")
    want_nan = _nan_to_bf16(bits[nan]) if dst == "BF16" else _nan_to_f16(bits[nan])
    assert np.array_equal(got[nan], want_nan)
    if dst == "BF16":  # ml_dtypes' NaN rule is the contract for BF16
        assert np.array_equal(got, ref)


def test_f32_narrowing_ties_to_even_by_hand():
    # (float32 bits, F16 bits): halfway cases go to the even neighbour
    f16_cases = [
        (0x3F801000, 0x3C00),  # 1 + 2**-11: between 0x3C00 and 0x3C01 -> even 0x3C00
        (0x3F803000, 0x3C02),  # 1 + 3 * 2**-11: between 0x3C01 and 0x3C02 -> even 0x3C02
        (0x477FF000, 0x7C00),  # 65520: between 65504 (odd) and 2**16 -> infinity
        (0x477FEFFF, 0x7BFF),
        (0x33000000, 0x0000),  # 2**-25: halfway to the smallest subnormal -> 0
        (0x33000001, 0x0001),
        (0x33C00000, 0x0002),  # 3 * 2**-25: between 0x0001 and 0x0002 -> even 0x0002
        (0x387FE000, 0x0400),  # halfway between the largest subnormal (odd) and 2**-14
    ]
    src = np.array([c[0] for c in f16_cases], dtype=np.uint32)
    assert [hex(v) for v in _convert(src, "F32", "F16")] == [hex(c[1]) for c in f16_cases]
    bf16_cases = [
        (0x3F808000, 0x3F80),  # halfway, even below
        (0x3F818000, 0x3F82),  # halfway, even above
        (0x7F7F8000, 0x7F80),  # halfway between the largest finite (odd) and infinity
        (0x00008000, 0x0000),
        (0x00018000, 0x0002),
    ]
    src = np.array([c[0] for c in bf16_cases], dtype=np.uint32)
    assert [hex(v) for v in _convert(src, "F32", "BF16")] == [hex(c[1]) for c in bf16_cases]


# ------------------------------------------------------------------------------------------
# arenas: offsets, identity, validation


def test_convert_inside_an_arena_leaves_the_rest_alone():
    rng = np.random.default_rng(3)
    arena_host = rng.integers(0, 256, 4096, dtype=np.uint8)
    src_bits = _f32_random(rng, 100)[:200]
    n = src_bits.size
    arena_src = np.concatenate([arena_host[:16], src_bits.view(np.uint8), arena_host[16 + 4 * n:]])
    arena = cuda.to_device(arena_src)
    off_dst = 2048 + 6  # 2-byte aligned
    D.convert(arena[16:16 + 4 * n], arena[off_dst:off_dst + 2 * n], "F32", "BF16", n, dev=DEV)
    out = arena.copy_to_host()
    want = arena_src.copy()
    want[off_dst:off_dst + 2 * n] = _ref(src_bits, "F32", "BF16").view(np.uint8)
    assert np.array_equal(out, want)
    # identical dtypes copy
    D.convert(arena[16:16 + 4 * n], arena[3000:3000 + 4 * n], "F32", "F32", n, dev=DEV)
    assert np.array_equal(arena.copy_to_host()[3000:3000 + 4 * n], src_bits.view(np.uint8))


def test_convert_refuses_bad_arguments():
    buf = cuda.device_array(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="convertible"):
        D.convert(buf, buf, "F64", "F32", 4, dev=DEV)
    with pytest.raises(ValueError, match="aligned"):
        D.convert(buf[1:33], buf[32:64], "F32", "BF16", 8, dev=DEV)
    with pytest.raises(ValueError, match="needed"):
        D.convert(buf[:8], buf[32:64], "F32", "BF16", 8, dev=DEV)
    with pytest.raises(ValueError, match="overlap"):
        D.convert(buf[:32], buf[16:48], "F32", "BF16", 8, dev=DEV)
    with pytest.raises(ValueError, match="overlap"):
        D.convert(buf[:16], buf[2:18], "F16", "BF16", 8, dev=DEV)
    with pytest.raises(ValueError, match="uint8"):
        D.convert(buf.view(np.uint16), buf, "F16", "BF16", 8, dev=DEV)
    D.convert(buf, buf, "F32", "F32", 16, dev=DEV)  # the same memory, the same dtype: nothing to do
    D.convert(buf, buf, "F32", "BF16", 0, dev=DEV)  # nothing at all


# ------------------------------------------------------------------------------------------
# FP8 block dequantization


def _scales(rng: np.random.Generator, n: int) -> np.ndarray:
    pool = np.array(
        [1.0, -0.5, 2.0**-10, 3.3e-3, 1.7e-7, 1e-30, 1e35, 3e38, 0.0, 123.456, 1e-42],
        dtype=np.float32,
    )
    s = rng.standard_normal(n).astype(np.float32) * np.float32(0.01)
    s[: min(n, pool.size)] = pool[: min(n, pool.size)]
    return rng.permutation(s)


def _dequant(fp8, out_dtype, rows, cols, block, seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, rows * cols, dtype=np.uint8)
    assert w.size >= 256
    w[:256] = np.arange(256, dtype=np.uint8)  # every FP8 pattern at least once
    n_scale = -(-rows // block) * -(-cols // block)
    s = _scales(rng, n_scale)
    out = cuda.device_array(rows * cols * np.dtype(BITS[out_dtype]).itemsize, dtype=np.uint8)
    D.dequantize_fp8(_dev(w), _dev(s), out, fp8, out_dtype, rows, cols, block, dev=DEV)
    ref = R.dequantize_fp8_host(w, s.view(np.uint8), fp8, out_dtype, rows, cols, block)
    # The brief's formula, on the whole matrix at once.
    full = np.repeat(np.repeat(s.reshape(-(-rows // block), -1), block, 0), block, 1)[:rows, :cols]
    with np.errstate(over="ignore", invalid="ignore"):
        direct = (w.view(R._FP8_NUMPY[fp8]).astype(np.float32).reshape(rows, cols) * full)
        direct = direct.astype(NP[out_dtype]).reshape(-1).view(BITS[out_dtype])
    assert np.array_equal(ref.view(BITS[out_dtype]), direct)
    return _host(out, out_dtype), ref.view(BITS[out_dtype])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("fp8", "out_dtype", "seed"),
                         [("F8_E4M3", "BF16", 1), ("F8_E4M3", "F16", 2),
                          ("F8_E5M2", "BF16", 3), ("F8_E5M2", "F16", 4)])
def test_dequantize_fp8_partial_edge_blocks(fp8, out_dtype, seed):
    # 130 x 200 with 128-blocks: a full block, then partial blocks on both edges
    got, ref = _dequant(fp8, out_dtype, 130, 200, 128, seed=seed)
    # A NaN times a scale is a NaN whose sign the hardware may not keep.
    _assert_same(got, ref, out_dtype, nan_sign=False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fp8", ["F8_E4M3", "F8_E5M2"])
@pytest.mark.parametrize(
    ("out_dtype", "rows", "cols", "block"),
    [
        ("BF16", 9, 30, 4),
        ("BF16", 7, 40, 1),
        ("F16", 17, 23, 5),
        ("F16", 11, 26, 3),
        ("F32", 13, 22, 5),
        ("F32", 3, 300, 7),
    ],
)
def test_dequantize_fp8_small_blocks(fp8, out_dtype, rows, cols, block):
    got, ref = _dequant(fp8, out_dtype, rows, cols, block, seed=rows * cols + block)
    _assert_same(got, ref, out_dtype, nan_sign=False)


def test_dequantize_fp8_refuses_bad_arguments():
    w = cuda.device_array(64, dtype=np.uint8)
    s = cuda.device_array(4, dtype=np.uint8)
    out = cuda.device_array(128, dtype=np.uint8)
    with pytest.raises(ValueError, match="FP8"):
        D.dequantize_fp8(w, s, out, "F8_E8M0", "BF16", 8, 8, dev=DEV)
    with pytest.raises(ValueError, match="needed"):
        D.dequantize_fp8(w, s, out, "F8_E4M3", "BF16", 8, 8, block=4, dev=DEV)  # 4 scales wanted
    with pytest.raises(ValueError, match="overlap"):
        D.dequantize_fp8(out[:64], s, out, "F8_E4M3", "BF16", 8, 8, dev=DEV)


def test_fp8_device_table_is_cached():
    assert D.fp8_device_table("F8_E4M3", DEV) is D.fp8_device_table("F8_E4M3", DEV)
    assert D.fp8_device_table("F8_E4M3", DEV) is not D.fp8_device_table("F8_E5M2", DEV)
    assert np.array_equal(
        D.fp8_device_table("F8_E5M2", DEV).copy_to_host().view(np.uint32),
        R.fp8_table("F8_E5M2").view(np.uint32),
    )


# ------------------------------------------------------------------------------------------
# transpose


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_transpose_non_square(itemsize):
    rng = np.random.default_rng(itemsize)
    rows, cols = 37, 70  # tiles of 32: partial tiles along both edges
    src = rng.integers(0, 256, rows * cols * itemsize, dtype=np.uint8)
    dst = cuda.device_array(src.size, dtype=np.uint8)
    D.transpose2d(_dev(src), dst, rows, cols, itemsize, dev=DEV)
    assert np.array_equal(dst.copy_to_host(), R.transpose_host(src, rows, cols, itemsize))


@pytest.mark.parametrize(("rows", "cols"), [(1, 45), (70, 3), (64, 32)])
def test_transpose_thin_and_exact_tiles(rows, cols):
    rng = np.random.default_rng(rows * cols)
    src = rng.integers(0, 1 << 16, rows * cols, dtype=np.uint32).astype(np.uint16)
    dst = cuda.device_array(src.size * 2, dtype=np.uint8)
    D.transpose2d(_dev(src), dst, rows, cols, 2, dev=DEV)
    want = src.reshape(rows, cols).T.reshape(-1)
    assert np.array_equal(dst.copy_to_host().view(np.uint16), want)


def test_transpose_refuses_bad_arguments():
    buf = cuda.device_array(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="itemsize"):
        D.transpose2d(buf, buf, 2, 2, 3, dev=DEV)
    with pytest.raises(ValueError, match="overlap"):
        D.transpose2d(buf[:32], buf[16:48], 4, 8, 1, dev=DEV)
    D.transpose2d(buf, buf, 0, 5, 4, dev=DEV)  # empty


# ------------------------------------------------------------------------------------------
# the scalar operations under numba's own integer typing (what a GPU build sees), on the CPU


def test_scalar_ops_compiled_by_numba_match_the_reference():
    ops = K._scalar_ops(numba.njit)

    def apply(fn):
        @numba.njit
        def run(src, dst):
            for i in range(src.size):
                dst[i] = fn(np.int64(src[i]))

        return run

    for name, src, dst in [
        ("bf16_to_f16", "BF16", "F16"),
        ("f16_to_bf16", "F16", "BF16"),
        ("f16_to_f32", "F16", "F32"),
        ("bf16_to_f32", "BF16", "F32"),
    ]:
        out = np.empty(ALL16.size, dtype=BITS[dst])
        apply(getattr(ops, name))(ALL16, out)
        _assert_same(out, _ref(ALL16, src, dst), dst)
    rng = np.random.default_rng(5)
    for name, dst in [("f32_to_bf16", "BF16"), ("f32_to_f16", "F16")]:
        bits = np.concatenate(
            [_f32_specials(), _f32_midpoints(dst, rng, 2000), _f32_random(rng, 20000)]
        )
        out = np.empty(bits.size, dtype=np.uint16)
        apply(getattr(ops, name))(bits, out)
        _assert_same(out, _ref(bits, "F32", dst), dst)


# ------------------------------------------------------------------------------------------
# launch geometry


def test_grid_choices():
    """Each device's geometry: the simulator's small grids, an H200's (132 multiprocessors) full ones."""
    from planc.execute.device.geometry import GpuGrid, SimGrid

    sim = SimGrid()
    blocks, threads = sim.map(10**6)
    assert blocks * threads <= 64 and threads == 32
    assert sim.map(5) == (1, 32)
    gpu = GpuGrid(132)
    assert gpu.map(10**9) == (132 * 32, 256)
    assert gpu.map(1000) == (4, 256)
    gx, gy = gpu.grid_2d(7168, 18432, (32, 8))
    assert gx == 576 and gx * gy <= 132 * 32 and gy >= 1
    assert gpu.grid_2d(1, 1, (32, 8)) == (1, 1)

"""Numba CUDA kernels that dequantize GGUF blocks -> F32, F16 or BF16: every type of
`planc.execute.kernels.signatures.GGUF_DEQUANTIZABLE` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL, IQ4_XS).

Each kernel reads a tensor's stored bytes (uint8, whole blocks in order) and writes one element per
step of a grid-stride loop over the output, as bits (uint32 for F32, uint16 for F16 and BF16). The
values are those of `planc.execute.kernels.gguf_dequant` (and so of the `gguf` package's numpy): float32 products
rounded once each, then rounded to the output type by the bit operations the other kernels use
(`planc.execute.kernels.kernels`). Q2_K, Q4_K and Q5_K subtract two products, Q4_1 and Q5_1 add the
block's minimum to one; on the GPU those products go through
`libdevice.fmul_rn`, which the compiler may not fuse into a multiply-add (NVVM contracts a plain
`a * b - c` by default, which would round once instead of twice). The simulator has no fused
multiply-add (and its libdevice calls return NaN), so there the products are plain: `kernels(target)`
builds the set for the target its caller's device names.

Element i of the output is element j = i % B of block b = i // B (B the type's block); a block's
scale bytes are read by each of its elements' threads, from cache after the first. Q2_K, Q3_K and
Q6_K (`signatures.QUADS`) hold values j, j + 32, j + 64 and j + 96 of each half of a block in one
quant byte: their kernels run a thread per such byte (`_quad_kernel`), which reads it once,
converts the block's float16 factor(s) once and writes the four values, each the same float32
products as a thread per value would compute (the load of those types was as slow as their
kernels: docs/gguf.md).

A kernel given a head size `hd` (a GGUF Llama q / k weight, `Part.unpermute`) writes the value of stored row r to
row (k % 2) * hd/2 + k // 2 of its head (k = r % hd): transformers' order
(`planc.manifest.gguf_names.unpermute_rows`); `row` is the values per row, `hd` 0 keeps the order.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from numba.cuda import libdevice

from planc.base.simulation import GPU, SIM

from .kernels import CACHE, _ops, _scalar_ops
from .signatures import GGUF_DEQUANTIZABLE, QUADS

# IQ4_NL's and IQ4_XS's 16 non-linear levels (llama.cpp's kvalues_iq4nl; `gguf_dequant.IQ4_LEVELS`,
# which a test holds equal): a tuple, which numba indexes as a constant array
_IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _mul_rn_py(a, b):  # the GPU's: a product rounded once, never fused into a multiply-add
    return libdevice.fmul_rn(a, b)


def _mul_plain_py(a, b):  # the simulator's, whose libdevice calls return NaN (it has no fused multiply-add)
    return np.float32(a * b)


def _value_fns(jit, f16_to_f32, mul_rn_py) -> dict:
    """The per-element dequantizers, type name -> device function(src, i) -> float32, built by `jit`.

    A factory, as `kernels._scalar_ops`, so that the same source compiles as CUDA device functions
    and, in tests on a machine without a GPU, under numba's CPU target (`numba.njit`), whose typing
    is the GPU's: the simulator runs any Python and so hides code numba cannot type. Each helper is
    a closure variable (a dispatcher numba types), never an attribute of a module or namespace
    object: numba cannot type `_ops.f16_to_f32` (a `SimpleNamespace` global), and on the GPU the
    K-quant kernels, which read a float16 scale through it, failed to compile.
    """
    mul_rn = jit(mul_rn_py)

    @jit
    def half(src, at):
        """float32 of the little-endian float16 at src[at]."""
        h = np.int64(src[at]) | (np.int64(src[at + 1]) << 8)
        return np.uint32(f16_to_f32(h)).view(np.float32)

    @jit
    def signed(b):
        return b - 256 if b >= 128 else b

    @jit
    def q8_0(src, i):
        base = (i // 32) * 34
        d = half(src, base)
        q = signed(np.int64(src[base + 2 + i % 32]))
        return np.float32(np.float32(q) * d)

    @jit
    def q4_0(src, i):
        base = (i // 32) * 18
        j = i % 32
        d = half(src, base)
        b = np.int64(src[base + 2 + (j % 16)])
        q = ((b >> 4) if j >= 16 else b) & 0xF
        return np.float32(d * np.float32(q - 8))

    @jit
    def nibble(src, at, j):
        """Element j of 32 stored as 16 bytes at src[at]: low nibbles first, then high."""
        b = np.int64(src[at + (j % 16)])
        return ((b >> 4) if j >= 16 else b) & 0xF

    @jit
    def q4_1(src, i):
        base = (i // 32) * 20
        d = half(src, base)
        m = half(src, base + 2)
        return np.float32(mul_rn(d, np.float32(nibble(src, base + 4, i % 32))) + m)

    @jit
    def q5_bit(src, at, j):
        """Bit j of the little-endian 32-bit word at src[at]."""
        return (np.int64(src[at + j // 8]) >> (j % 8)) & 1

    @jit
    def q5_0(src, i):
        base = (i // 32) * 22
        j = i % 32
        d = half(src, base)
        q = (nibble(src, base + 6, j) | (q5_bit(src, base + 2, j) << 4)) - 16
        return np.float32(d * np.float32(q))

    @jit
    def q5_1(src, i):
        base = (i // 32) * 24
        j = i % 32
        d = half(src, base)
        m = half(src, base + 2)
        q = nibble(src, base + 8, j) | (q5_bit(src, base + 4, j) << 4)
        return np.float32(mul_rn(d, np.float32(q)) + m)

    @jit
    def q2_k_value(d, dmin, sc, q):
        dl = np.float32(d * np.float32(sc & 0xF))
        ml = mul_rn(dmin, np.float32(sc >> 4))
        return np.float32(mul_rn(dl, np.float32(q)) - ml)

    @jit
    def q2_k(src, base, h, m):
        d = half(src, base + 80)
        dmin = half(src, base + 82)
        b = np.int64(src[base + 16 + h * 32 + m])
        g = base + h * 8 + m // 16  # the scale byte of value j = h*128 + m; + 2 per step of 32 values
        return (q2_k_value(d, dmin, np.int64(src[g]), b & 3),
                q2_k_value(d, dmin, np.int64(src[g + 2]), (b >> 2) & 3),
                q2_k_value(d, dmin, np.int64(src[g + 4]), (b >> 4) & 3),
                q2_k_value(d, dmin, np.int64(src[g + 6]), b >> 6))

    @jit
    def q3_k_value(src, base, dl32, h, m, s, b, hm):
        g = 2 * s + m // 16  # sub-block h*8 + g of 16
        lo = (np.int64(src[base + 96 + g]) >> (4 * h)) & 0xF
        hi = (np.int64(src[base + 104 + g % 4]) >> (2 * (2 * h + g // 4))) & 3
        ql = (b >> (2 * s)) & 3
        qh = ((hm >> (4 * h + s)) & 1) ^ 1  # the high bit set means no offset
        dl = np.float32(dl32 * np.float32((lo | (hi << 4)) - 32))
        return np.float32(dl * np.float32(ql - (qh << 2)))

    @jit
    def q3_k(src, base, h, m):
        d = half(src, base + 108)
        b = np.int64(src[base + 32 + h * 32 + m])
        hm = np.int64(src[base + m])
        return (q3_k_value(src, base, d, h, m, 0, b, hm), q3_k_value(src, base, d, h, m, 1, b, hm),
                q3_k_value(src, base, d, h, m, 2, b, hm), q3_k_value(src, base, d, h, m, 3, b, hm))

    @jit
    def k_scale(src, sb, s):
        """The 6-bit scale and minimum of sub-block s of a Q4_K / Q5_K block's 12 scale bytes at src[sb]."""
        if s < 4:
            sc = np.int64(src[sb + s]) & 63
            m = np.int64(src[sb + 4 + s]) & 63
        else:
            md = np.int64(src[sb + 8 + s - 4])
            sc = (md & 0xF) | ((np.int64(src[sb + s - 4]) >> 2) & 0x30)
            m = (md >> 4) | ((np.int64(src[sb + s]) >> 2) & 0x30)
        return sc, m

    @jit
    def q4_k(src, i):
        base = (i // 256) * 144
        j = i % 256
        d = half(src, base)
        dmin = half(src, base + 2)
        s = j // 32
        sc, m = k_scale(src, base + 4, s)
        b = np.int64(src[base + 16 + (s // 2) * 32 + j % 32])
        q = (b >> (4 * (s % 2))) & 0xF
        ds = np.float32(d * np.float32(sc))
        dm = mul_rn(dmin, np.float32(m))
        return np.float32(mul_rn(ds, np.float32(q)) - dm)

    @jit
    def q5_k(src, i):
        base = (i // 256) * 176
        j = i % 256
        d = half(src, base)
        dmin = half(src, base + 2)
        s = j // 32
        sc, m = k_scale(src, base + 4, s)
        lo = (np.int64(src[base + 48 + (s // 2) * 32 + j % 32]) >> (4 * (s % 2))) & 0xF
        hi = (np.int64(src[base + 16 + j % 32]) >> s) & 1
        ds = np.float32(d * np.float32(sc))
        dm = mul_rn(dmin, np.float32(m))
        return np.float32(mul_rn(ds, np.float32(lo | (hi << 4))) - dm)

    @jit
    def q6_k_value(src, base, d, lo, hi, g):
        q = (lo | (hi << 4)) - 32
        ds = np.float32(d * np.float32(signed(np.int64(src[base + 192 + g]))))
        return np.float32(ds * np.float32(q))

    @jit
    def q6_k(src, base, h, m):
        d = half(src, base + 208)
        a = np.int64(src[base + h * 64 + m])  # low nibbles of values m (s 0) and m + 64 (s 2), of 128
        c = np.int64(src[base + h * 64 + 32 + m])  # of values m + 32 (s 1) and m + 96 (s 3)
        hb = np.int64(src[base + 128 + h * 32 + m])  # the four values' high two bits
        g = h * 8 + m // 16
        return (q6_k_value(src, base, d, a & 0xF, hb & 3, g), q6_k_value(src, base, d, c & 0xF, (hb >> 2) & 3, g + 2),
                q6_k_value(src, base, d, a >> 4, (hb >> 4) & 3, g + 4), q6_k_value(src, base, d, c >> 4, hb >> 6, g + 6))

    levels = _IQ4_LEVELS

    @jit
    def iq4_nl(src, i):
        base = (i // 32) * 18
        d = half(src, base)
        return np.float32(d * np.float32(levels[nibble(src, base + 2, i % 32)]))

    @jit
    def iq4_xs(src, i):
        base = (i // 256) * 136
        j = i % 256
        s = j // 32
        d = half(src, base)
        sh = np.int64(src[base + 2]) | (np.int64(src[base + 3]) << 8)
        lo = (np.int64(src[base + 4 + s // 2]) >> (4 * (s % 2))) & 0xF
        sc = (lo | (((sh >> (2 * s)) & 3) << 4)) - 32
        dl = np.float32(d * np.float32(sc))
        return np.float32(dl * np.float32(levels[nibble(src, base + 8 + s * 16, j % 32)]))

    return {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q2_K": q2_k, "Q3_K": q3_k,
            "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}


def _kernel(value, out_bits):
    @cuda.jit(cache=CACHE)
    def kernel(src, dst, n, row, hd):
        i = cuda.grid(1)
        s = cuda.gridsize(1)
        half = hd // 2
        while i < n:
            v = value(src, i)
            o = i
            if hd > 0:  # row k of each head of hd rows (llama.cpp's order) is row (k % 2) * hd/2 + k // 2 of it
                k = (i // row) % hd
                o = i + ((k % 2) * half + k // 2 - k) * row
            dst[o] = out_bits(np.int64(v.view(np.uint32)))
            i += s

    return kernel


def _quad_kernel(quad, size, out_bits):
    """A kernel of a 256-value K-quant block of `size` bytes whose quant byte m of half h (of two)
    holds values h*128 + m + 32*s, s = 0..3 (Q2_K, Q3_K, Q6_K): a thread computes those four from one
    read of their bytes and one conversion of the block's float16 factors. A row holds whole blocks,
    so the four share a row and its head's reorder."""
    @cuda.jit(cache=CACHE)
    def kernel(src, dst, n, row, hd):
        t = cuda.grid(1)
        s = cuda.gridsize(1)
        half = hd // 2
        quads = n // 4
        while t < quads:
            b = t // 64
            k = t % 64
            h = k // 32
            m = k % 32
            v0, v1, v2, v3 = quad(src, b * size, h, m)
            o = b * 256 + h * 128 + m
            if hd > 0:
                r = (o // row) % hd
                o += ((r % 2) * half + r // 2 - r) * row
            dst[o] = out_bits(np.int64(v0.view(np.uint32)))
            dst[o + 32] = out_bits(np.int64(v1.view(np.uint32)))
            dst[o + 64] = out_bits(np.int64(v2.view(np.uint32)))
            dst[o + 96] = out_bits(np.int64(v3.view(np.uint32)))
            t += s

    return kernel


_BITS = {"F32": _ops.identity, "F16": _ops.f32_to_f16, "BF16": _ops.f32_to_bf16}
_MUL = {GPU: _mul_rn_py, SIM: _mul_plain_py}
_built: dict = {}


def kernels(target: str) -> dict:
    """name -> kernel ("gguf_{type}_{out}") built for `target` (`planc.base.simulation.GPU` or `SIM`), which
    the device hands over (`Device.target`): this module never asks which one the process runs."""
    got = _built.get(target)
    if got is None:
        if target == GPU:
            jit, bits, f16_to_f32 = cuda.jit(device=True), _BITS, _ops.f16_to_f32
        else:
            # The simulator runs any Python, and each call of a device function there takes a lock of
            # the function's module, which its threads (one per simulated CUDA thread) queue on: a
            # kernel making three such calls per element ran minutes on 2 cores. Plain functions, the
            # same source, compute the same values without it.
            plain = _scalar_ops(_plain)
            jit, f16_to_f32 = _plain, plain.f16_to_f32
            bits = {"F32": plain.identity, "F16": plain.f32_to_f16, "BF16": plain.f32_to_bf16}
        values = _value_fns(jit, f16_to_f32, _MUL[target])
        got = _built[target] = {f"gguf_{t}_{o}": _quad_kernel(values[t], QUADS[t], b) if t in QUADS else _kernel(values[t], b)
                                for t in GGUF_DEQUANTIZABLE for o, b in bits.items()}
    return got


def _plain(fn):
    return fn


__all__ = ["kernels"]


"""Dequantization of GGUF blocks on the host, with numpy: every type of
`planc.manifest.ggml_types.DEQUANTIZABLE` (the legacy Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, the K-quants
Q2_K to Q6_K, and IQ4_NL / IQ4_XS).

Bit-exact to the `gguf` package's `gguf.quants.dequantize` (tests check every type against it): the
same float32 operations in the same order, each rounded once (`d * q`; for Q4_K `(d * sc) * q -
dmin * m`, the two products rounded before the subtraction). A float16 or bfloat16 output is that
float32 rounded once more, to nearest even. The device kernels (`planc.execute.kernels.gguf_kernels`)
compute the same bits.

`dequantize(raw, type_name, shape, out_dtype)` takes a tensor's stored bytes (uint8, whole blocks
along its rows) and returns an array of `shape`.
"""

from __future__ import annotations

import numpy as np

from planc.plan.hostcost import CHUNK_VALUES
from planc.manifest.ggml_types import BY_NAME, DEQUANTIZABLE

_OUT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks[:, :2])
    x = blocks[:, 2:].view(np.int8).astype(np.float32)
    return x * d


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])
    qs = blocks[:, 2:].reshape(n, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    qs = (qs & np.uint8(0x0F)).reshape(n, 32).astype(np.int8) - np.int8(8)
    return d * qs.astype(np.float32)


def _q4_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, mn = _q4_k_scales(blocks[:, 4:16])
    d = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (dmin * mn.astype(np.float32)).reshape(n, 8, 1)
    qs = blocks[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qs = (qs & np.uint8(0x0F)).reshape(n, 8, 32).astype(np.float32)
    return (d * qs - dm).reshape(n, 256)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    d = (d * scales).reshape(n, 16, 1)
    ql = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(0x0F)).reshape(n, 8, 32)
    qh = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & np.uint8(0x03)).reshape(n, 8, 32)
    q = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(32)
    return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _nibbles(qs: np.ndarray, groups: int, width: int) -> np.ndarray:
    """Low then high nibbles of `groups` runs of `width` bytes: (n, groups * 2 * width) uint8."""
    n = qs.shape[0]
    q = qs.reshape(n, groups, 1, width) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, groups * 2 * width)


def _bits(b: np.ndarray, shifts: int, bits: int) -> np.ndarray:
    """(n, 32 * ...) values of `bits` bits from runs of 32 bytes, each shifted 0, bits, ... in turn."""
    n = b.shape[0]
    q = b.reshape(n, -1, 1, 32) >> np.array([bits * k for k in range(shifts)], np.uint8).reshape(1, 1, shifts, 1)
    return (q & np.uint8((1 << bits) - 1)).reshape(n, -1)


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    return (d * _nibbles(blocks[:, 4:], 1, 16).astype(np.float32)) + m


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """Bit j of each block's little-endian 32-bit `qh`, for j = 0..31: (n, 32) uint8."""
    h = np.ascontiguousarray(qh).view("<u4").reshape(-1, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    return (h & np.uint32(1)).astype(np.uint8)


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks[:, 0:2])
    q = (_nibbles(blocks[:, 6:], 1, 16) | (_q5_high(blocks[:, 2:6]) << np.uint8(4))).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    q = (_nibbles(blocks[:, 8:], 1, 16) | (_q5_high(blocks[:, 4:8]) << np.uint8(4))).astype(np.float32)
    return (d * q) + m


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sc = blocks[:, :16]
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    dl = (d * (sc & np.uint8(0xF)).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (sc >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
    q = _bits(blocks[:, 16:80], 4, 2).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, 256)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask, qs, s = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks[:, 108:110])
    lo = (s[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (s[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & np.uint8(0x0F)) | ((hi & np.uint8(0x03)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (d * sc.astype(np.float32)).reshape(n, 16, 1)
    ql = _bits(qs, 4, 2)
    qh = _bits(hmask, 8, 1) ^ np.uint8(1)  # the high bit set means no offset
    q = (ql.astype(np.int8) - (qh << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (dl * q.reshape(n, 16, 16)).reshape(n, 256)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _q4_k_scales(blocks[:, 4:16])
    d = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (dmin * mn.astype(np.float32)).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 48:], 4, 32) | (_bits(blocks[:, 16:48], 8, 1) << np.uint8(4))
    return (d * q.reshape(n, 8, 32).astype(np.float32) - dm).reshape(n, 256)


# IQ4_NL's and IQ4_XS's 16 non-linear levels (llama.cpp's kvalues_iq4nl)
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_LEVELS = np.array(IQ4_LEVELS, np.float32)


def _iq4_nl(blocks: np.ndarray) -> np.ndarray:
    return _f16(blocks[:, 0:2]) * _LEVELS[_nibbles(blocks[:, 2:], 1, 16)]


def _iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    sh = np.ascontiguousarray(blocks[:, 2:4]).view("<u2").reshape(n, 1)
    lo = (blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], np.uint8).reshape(1, 1, 2)).reshape(n, 8) & np.uint8(0x0F)
    hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)) & np.uint16(3)).astype(np.uint8)
    sc = (lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    q = _LEVELS[_nibbles(blocks[:, 8:], 8, 16)].reshape(n, 8, 32)
    return (dl * q).reshape(n, 256)


_BLOCKS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q2_K": _q2_k,
           "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs}


def dequantize(raw, type_name: str, shape: tuple[int, ...], out_dtype: str = "F32") -> np.ndarray:
    """The float values of a quantized tensor's stored bytes, as `out_dtype` (F32, F16 or BF16)."""
    if type_name not in DEQUANTIZABLE:
        raise ValueError(f"no dequantization for {type_name}; planc dequantizes {', '.join(sorted(DEQUANTIZABLE))}")
    if out_dtype not in _OUT:
        raise ValueError(f"dequantization gives F32, F16 or BF16, not {out_dtype}")
    t = BY_NAME[type_name]
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    raw = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    if numel % t.block or raw.size != numel // t.block * t.block_bytes:
        raise ValueError(f"{raw.size} bytes are not {numel} {type_name} elements "
                         f"({numel // t.block} blocks of {t.block_bytes} bytes)")
    if out_dtype == "BF16":
        import ml_dtypes

        d_np = ml_dtypes.bfloat16
    else:
        d_np = np.float32 if out_dtype == "F32" else np.float16
    # A chunk of blocks at a time (at most `planc.plan.hostcost.CHUNK_VALUES` values), written into the
    # output: the float32 temporaries stay one chunk's, whatever the tensor (elementwise, so the bits
    # are those of the whole tensor at once).
    blocks = raw.reshape(-1, t.block_bytes)
    out = np.empty(numel, dtype=d_np)
    step = max(1, CHUNK_VALUES // t.block)
    for a in range(0, blocks.shape[0], step):
        out[a * t.block:(a + step) * t.block] = _BLOCKS[type_name](blocks[a:a + step]).reshape(-1)
    return out.reshape(shape)


__all__ = ["dequantize"]

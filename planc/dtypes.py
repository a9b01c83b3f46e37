"""The safetensors dtype table: name -> bits per element, numpy dtype where one exists.

Sub-byte types (F4, F6_*) are packed: a tensor of n elements takes n * bits / 8 bytes, and the
format refuses a tensor whose bit count is not a whole number of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # safetensors spelling, e.g. "BF16"
    bits: int
    numpy: np.dtype | None  # None for packed sub-byte types

    @property
    def itemsize(self) -> int:
        """Bytes per element (0 for sub-byte types)."""
        return self.bits // 8

    def nbytes(self, numel: int) -> int | None:
        """Bytes of `numel` packed elements, or None when they do not fill whole bytes."""
        total_bits = numel * self.bits
        return None if total_bits % 8 else total_bits // 8


def _d(name: str, bits: int, np_dtype) -> DType:
    return DType(name, bits, None if np_dtype is None else np.dtype(np_dtype))


DTYPES: dict[str, DType] = {
    d.name: d
    for d in [
        _d("BOOL", 8, np.bool_),
        _d("U8", 8, np.uint8),
        _d("I8", 8, np.int8),
        _d("I16", 16, np.int16),
        _d("U16", 16, np.uint16),
        _d("F16", 16, np.float16),
        _d("BF16", 16, ml_dtypes.bfloat16),
        _d("I32", 32, np.int32),
        _d("U32", 32, np.uint32),
        _d("F32", 32, np.float32),
        _d("F64", 64, np.float64),
        _d("I64", 64, np.int64),
        _d("U64", 64, np.uint64),
        _d("C64", 64, np.complex64),
        _d("F8_E4M3", 8, ml_dtypes.float8_e4m3fn),
        _d("F8_E5M2", 8, ml_dtypes.float8_e5m2),
        _d("F8_E4M3FNUZ", 8, ml_dtypes.float8_e4m3fnuz),
        _d("F8_E5M2FNUZ", 8, ml_dtypes.float8_e5m2fnuz),
        _d("F8_E8M0", 8, ml_dtypes.float8_e8m0fnu),
        _d("F4", 4, None),
        _d("F6_E2M3", 6, None),
        _d("F6_E3M2", 6, None),
    ]
}

# Spec spellings of the float targets a rule may convert to, and their safetensors names.
TARGETS: dict[str, str] = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
FLOAT_CONVERTIBLE = frozenset({"F16", "BF16", "F32"})
FP8_DEQUANTIZABLE = frozenset({"F8_E4M3", "F8_E5M2"})


def dtype(name: str) -> DType:
    return DTYPES[name]

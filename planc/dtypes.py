"""The safetensors dtype table: name -> bits per element, numpy dtype where one exists.

Sub-byte types (F4, F6_*) are packed: a tensor of n elements takes n * bits / 8 bytes, and the
format refuses a tensor whose bit count is not a whole number of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class DType:
    name: str  # safetensors spelling, e.g. "BF16"
    bits: int
    numpy_name: str | None  # numpy (or ml_dtypes) type name; None for packed sub-byte types

    @property
    def numpy(self):
        """The numpy dtype (ml_dtypes for bfloat16 and FP8), or None for packed sub-byte types.

        Resolved on first use: compiling and explaining a plan need bit widths only, and importing
        numpy with ml_dtypes costs a fresh process a large share of its start."""
        return _numpy(self.numpy_name)

    @property
    def itemsize(self) -> int:
        """Bytes per element (0 for sub-byte types)."""
        return self.bits // 8

    def nbytes(self, numel: int) -> int | None:
        """Bytes of `numel` packed elements, or None when they do not fill whole bytes."""
        total_bits = numel * self.bits
        return None if total_bits % 8 else total_bits // 8


@lru_cache(maxsize=None)
def _numpy(name: str | None):
    if name is None:
        return None
    import numpy as np

    if hasattr(np, name):
        return np.dtype(getattr(np, name))
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


DTYPES: dict[str, DType] = {
    d.name: d
    for d in [
        DType("BOOL", 8, "bool_"),
        DType("U8", 8, "uint8"),
        DType("I8", 8, "int8"),
        DType("I16", 16, "int16"),
        DType("U16", 16, "uint16"),
        DType("F16", 16, "float16"),
        DType("BF16", 16, "bfloat16"),
        DType("I32", 32, "int32"),
        DType("U32", 32, "uint32"),
        DType("F32", 32, "float32"),
        DType("F64", 64, "float64"),
        DType("I64", 64, "int64"),
        DType("U64", 64, "uint64"),
        DType("C64", 64, "complex64"),
        DType("F8_E4M3", 8, "float8_e4m3fn"),
        DType("F8_E5M2", 8, "float8_e5m2"),
        DType("F8_E4M3FNUZ", 8, "float8_e4m3fnuz"),
        DType("F8_E5M2FNUZ", 8, "float8_e5m2fnuz"),
        DType("F8_E8M0", 8, "float8_e8m0fnu"),
        DType("F4", 4, None),
        DType("F6_E2M3", 6, None),
        DType("F6_E3M2", 6, None),
    ]
}

# Spec spellings of the float targets a rule may convert to, and their safetensors names.
TARGETS: dict[str, str] = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
FLOAT_CONVERTIBLE = frozenset({"F16", "BF16", "F32"})
FP8_DEQUANTIZABLE = frozenset({"F8_E4M3", "F8_E5M2"})


def dtype(name: str) -> DType:
    return DTYPES[name]

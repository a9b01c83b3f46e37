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


# -- what each op can produce ---------------------------------------------------------------------
# One rule for the compiler (`bind`) and the plan reader (`plancheck`): a part's op takes its
# weight's dtype to its output dtype only as this table allows, so `compile` never writes a part the
# reader refuses, and an edited plan cannot relabel bytes (a device transpose of BF16 bits called
# F16) or ask a kernel for a conversion it does not have (integers, a dequantization of F32).
#
#   op            path     source dtype                 output dtype
#   copy          any      any                          the same
#   convert       any      F32, F16, BF16               another of F32, F16, BF16
#   transpose     direct   whole-byte elements          the same
#   transpose     host     whole-byte elements          the same, or (F32/F16/BF16) another of them
#   dequantize    any      F8_E4M3, F8_E5M2 (F32 scale) F32, F16, BF16
#   dequantize    any      an FP4 weight and scale      F32, F16, BF16   (planc.base.fp4: MXFP4, NVFP4)
#   dequantize_t  any      an FP4 weight and scale      F32, F16, BF16
#   gguf          any      U8 (GGUF blocks, the part's  F32, F16, BF16   (planc.execute.kernels.gguf_dequant; the
#                          `ggml` type: Q8_0 ... Q6_K)                    block type checked by plancheck)

def op_problem(op: str, path: str, src: str, dst: str, scale: str | None = None, add: bool = False) -> str | None:
    """Why a part of `op` on `path` cannot take `src` to `dst` (its scale input's dtype `scale`; `add`:
    it adds a constant to each value), or None when the table above allows it. The words fit after
    "a <op> part on the <path> path ..."."""
    from . import fp4

    floats = "F32, F16 or BF16"
    if add and op != "convert":
        return "adds no constant: only a convert of F32, F16 or BF16 does"
    if op == "copy":
        return None if src == dst else f"keeps its dtype ({src}), it cannot give {dst}"
    if op == "convert":
        if src not in FLOAT_CONVERTIBLE:
            return f"converts {floats} only, not {src}"
        if dst not in FLOAT_CONVERTIBLE or (dst == src and not add):
            return f"converts {src} to another of {floats}, not to {dst}"
        return None
    if op == "transpose":
        if DTYPES[src].bits % 8:
            return f"moves whole-byte elements, not packed {src}"
        if dst == src:
            return None
        if path == "host" and src in FLOAT_CONVERTIBLE and dst in FLOAT_CONVERTIBLE:
            return None
        where = "on the host converts F32, F16 and BF16 only" if path == "host" else "on the device keeps its dtype"
        return f"{where}: {src} cannot become {dst}"
    if op in ("dequantize", "dequantize_t"):
        fmt = fp4.format_of(src, scale) if scale is not None else None
        if fmt is None and (op == "dequantize_t" or src not in FP8_DEQUANTIZABLE or scale != "F32"):
            return (f"dequantizes F8_E4M3 or F8_E5M2 weights with F32 scales, or FP4 weights "
                    f"({', '.join(fp4.FORMATS)}), not {src} with {scale} scales") if op == "dequantize" else \
                f"dequantizes FP4 weights ({', '.join(fp4.FORMATS)}) only, not {src} with {scale} scales"
        if dst not in FLOAT_CONVERTIBLE:
            return f"produces {floats}, not {dst}"
        return None
    if op == "gguf":
        if src != "U8":
            return f"dequantizes GGUF blocks read as U8, not {src}"
        return None if dst in FLOAT_CONVERTIBLE else f"produces {floats}, not {dst}"
    return f"is not an op ({op})"

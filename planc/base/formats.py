"""The kernel formats: what each kernel record of a plan names (`Kernel.format`), one per kind of
stored value a device kernel turns into the loaded one.

* `float`: F32 / F16 / BF16 to each other (`convert`);
* `transpose`: the last two dims swapped, elements kept (`transpose`);
* `fp8`: FP8 (E4M3 / E5M2) blocks times F32 block scales (`dequantize`);
* `mxfp4`, `nvfp4`: packed FP4 with E8M0 / E4M3 block scales (`dequantize`, `dequantize_t`);
* `gguf`: GGUF blocks of the part's GGML type (`gguf`).

`kernel_format(op, weight_dtype, scale_dtype)` is the format a part's kernel has, from its op and
its inputs' dtypes: the compiler writes it, the plan reader holds each kernel record to it, and the
executor looks the format's launcher up by it (`planc.execute.kernels.formats`).
"""

from __future__ import annotations

from . import fp4

FORMATS = ("float", "transpose", "fp8", "mxfp4", "nvfp4", "gguf")
_BY_OP = {"convert": "float", "transpose": "transpose", "gguf": "gguf"}


def kernel_format(op: str, weight_dtype: str, scale_dtype: str | None = None) -> str:
    """The format of the kernel of a part doing `op` on a weight of `weight_dtype` (with block scales
    of `scale_dtype`, for a dequantize); ValueError for an op no kernel does."""
    got = _BY_OP.get(op)
    if got is not None:
        return got
    if op in ("dequantize", "dequantize_t"):
        return (fp4.format_of(weight_dtype, scale_dtype) if scale_dtype is not None else None) or "fp8"
    raise ValueError(f"no kernel does a {op!r}")


__all__ = ["FORMATS", "kernel_format"]

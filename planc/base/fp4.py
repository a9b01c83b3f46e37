"""The 4-bit microscaled formats planc dequantizes on load: their layouts, names and shapes.

* **MXFP4** (OCP Microscaling v1.0, as gpt-oss ships its experts): `<name>_blocks` U8
  `[..., R, G, 16]` holds two E2M1 values a byte, the low nibble first; `<name>_scales` U8
  `[..., R, G]` holds one E8M0 exponent per 32 values: scale 2^(s - 127), s = 255 is NaN. The
  dequantized tensor is `[..., R, G * 32]`, loaded as `<name>`.
* **NVFP4** (NVIDIA ModelOpt): `weight` U8 `[R, C / 2]` (E2M1 pairs, low nibble first),
  `weight_scale` F8_E4M3 `[R, C / 16]` (one per 16 values), `weight_scale_2` F32 (a scalar):
  w = e2m1 x (weight_scale x weight_scale_2). An `input_scale` beside the weight (activations) is
  consumed: a weight-only dequantization does not use it. Loaded under the weight's own name.

E2M1: sign, two exponent bits (bias 1), one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
negatives. `transpose` swaps the last two dims of the dequantized tensor (transformers' GptOss
experts hold `gate_up_proj` `[E, H, 2I]` where gpt-oss stores `[E, 2I, H]`).

This module imports nothing heavy: binding and plan checks use it; the reference dequantization
is `planc.execute.kernels.fp4ref`, the kernels `planc.execute.kernels.fp4_kernels`.
"""

from __future__ import annotations

import math

FORMATS = ("mxfp4", "nvfp4")
BLOCK = {"mxfp4": 32, "nvfp4": 16}  # values per scale
WEIGHT_DTYPE = "U8"
SCALE_DTYPE = {"mxfp4": "U8", "nvfp4": "F8_E4M3"}
SCALE2_DTYPE = "F32"
BLOCKS_SUFFIX = "_blocks"

# Defaults of the spec's templates; `{name}` is the loaded name (MXFP4: the weight's name without
# `_blocks`; NVFP4: the weight's name), `{module}` the loaded name without its last component.
DEFAULT_SCALE = {"fp8": "{name}_scale_inv", "mxfp4": "{name}_scales", "nvfp4": "{name}_scale"}
DEFAULT_SCALE2 = "{name}_scale_2"
DEFAULT_CONSUME = {"mxfp4": (), "nvfp4": ("{module}.input_scale",)}


def loaded_name(fmt: str, weight: str) -> str:
    """The name a weight loads under (before rename, stack or fuse)."""
    if fmt == "mxfp4" and weight.endswith(BLOCKS_SUFFIX):
        return weight[: -len(BLOCKS_SUFFIX)]
    return weight


def template_values(fmt: str, weight: str) -> dict[str, str]:
    name = loaded_name(fmt, weight)
    return {"name": name, "module": name.rsplit(".", 1)[0] if "." in name else name}


def geometry(fmt: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, rows, cols) of the dequantized tensor of a weight stored with `shape` (bytes).

    MXFP4 `[..., R, G, 16]` -> batch prod(...), R rows, G * 32 cols; NVFP4 `[R, C / 2]` -> 1, R, C."""
    if fmt == "mxfp4":
        *lead, g, _ = shape
        rows = lead[-1] if lead else 1
        return math.prod(lead[:-1]), rows, g * 32
    rows, half = shape
    return 1, rows, half * 2


def out_shape(fmt: str, shape: tuple[int, ...], transpose: bool) -> tuple[int, ...]:
    """The dequantized shape of a weight stored with `shape`; `transpose` swaps its last two dims."""
    if fmt == "mxfp4":
        out = (*shape[:-2], shape[-2] * 32)
    else:
        out = (shape[0], shape[1] * 2)
    if transpose:
        out = (*out[:-2], out[-1], out[-2])
    return tuple(out)


def weight_problem(fmt: str, shape: tuple[int, ...], dtype: str, transpose: bool) -> str | None:
    """Why a tensor cannot be the packed weight of `fmt`, or None."""
    if dtype != WEIGHT_DTYPE:
        return f"it is stored as {dtype}; {fmt} packs E2M1 pairs in U8"
    if 0 in shape:
        return f"its shape {list(shape)} holds no values"
    if fmt == "mxfp4":
        if len(shape) < 2 or shape[-1] != 16:
            return f"its shape {list(shape)} is not [..., G, 16] (16 bytes, 32 values, a block)"
        if transpose and len(shape) < 3:
            return f"its shape {list(shape)} has no row dim to transpose with"
        return None
    if len(shape) != 2:
        return f"its shape {list(shape)} is not [R, C / 2]"
    if shape[1] % (BLOCK["nvfp4"] // 2):
        return f"its {shape[1]} bytes a row are not whole 16-value blocks"
    return None


def scale_shape(fmt: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The block-scale shape a weight stored with `shape` needs."""
    if fmt == "mxfp4":
        return tuple(shape[:-1])
    return (shape[0], shape[1] * 2 // BLOCK["nvfp4"])


def scale2_ok(shape: tuple[int, ...]) -> bool:
    return math.prod(shape) == 1 and len(shape) <= 1


def format_of(weight_dtype: str, scale_dtype: str) -> str | None:
    """The FP4 format a dequantization's inputs are in (by their dtypes), or None (FP8 blocks)."""
    if weight_dtype != WEIGHT_DTYPE:
        return None
    for fmt, sdt in SCALE_DTYPE.items():
        if sdt == scale_dtype:
            return fmt
    return None


def align4(n: int) -> int:
    return -(-n // 4) * 4


def scale2_offset(scale_offset: int, scale_nbytes: int) -> int:
    """Landing offset of an NVFP4 part's per-tensor scale: right after its block scales, 4-aligned."""
    return align4(scale_offset + scale_nbytes)

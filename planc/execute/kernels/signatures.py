"""Every kernel launch the executor can make: kernel name and argument signature.

The executor's kernels are launched through the driver from PTX built ahead of time and shipped
with the package (`planc/execute/kernels/ptx`). A launch whose (name, signature) has no PTX is compiled
by numba at load time, which costs 0.5-1 s and about 100 MB of host memory; so this table is the
complete, explicit set of launches, derived from the dtype tables the compiler itself uses:

* convert: every ordered pair of `FLOAT_CONVERTIBLE` dtypes (a pair of equal dtypes copies), and
  the same pairs adding a constant to each value (`add_{src}_{dst}`, a rule's `add`);
* dequantize: every `FLOAT_CONVERTIBLE` target (each `FP8_DEQUANTIZABLE` source uses the same
  kernel: only its 256-entry decode table differs);
* transpose: elements of 1, 2, 4 and 8 bytes (every whole-byte dtype in `planc.base.dtypes`);
* scatter: the request widths the schedule picks (1, 2, 4, 8 bytes);
* zero: the zero-fill of tensor-parallel padding;
* gguf: the dequantization of each `GGUF_DEQUANTIZABLE` GGML block type to each `FLOAT_CONVERTIBLE` dtype.
* fp4: MXFP4 and NVFP4 into every `FLOAT_CONVERTIBLE` target, as stored or transposed.

A signature is what `planc.execute.device.launch.signature` computes from the arguments of a launch:
('a', numpy dtype string, ndim) per C-contiguous device array, ('i',) per integer (int64).
This module imports neither numba nor numpy: the shipped-PTX check runs on any machine.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from planc.base.dtypes import FLOAT_CONVERTIBLE
from planc.base.fp4 import FORMATS as FP4_FORMATS

# Compute capabilities PTX is built for. The driver JIT-compiles PTX for any device of the same or
# a later capability, so the lowest one covers every newer GPU; later ones are built for codegen
# that the lowest cannot use.
CCS: tuple[tuple[int, int], ...] = ((8, 0), (9, 0))

# The files whose text the kernels' machine code depends on. Any change to them needs the PTX built
# again (`REBUILD`); the shipped index records the hash of these sources.
SOURCES = ("kernels.py", "scatter.py", "gguf_kernels.py", "fp4_kernels.py")
SOURCE_DIR = Path(__file__).resolve().parent  # where they are: beside this module
REBUILD = "bash tools/build_ptx.sh"

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_UINT = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}
F32 = "<f4"
I64 = "<i8"
INT = ("i",)

# (src dtype, dst dtype) -> map kernel name; equal dtypes copy.
CONVERT_KERNEL = {
    ("F32", "BF16"): "f32_to_bf16",
    ("F32", "F16"): "f32_to_f16",
    ("BF16", "F32"): "bf16_to_f32",
    ("F16", "F32"): "f16_to_f32",
    ("BF16", "F16"): "bf16_to_f16",
    ("F16", "BF16"): "f16_to_bf16",
}
TRANSPOSE_SIZES = (1, 2, 4, 8)
# GGML block types the device dequantizes: `planc.manifest.ggml_types.DEQUANTIZABLE` (a test holds
# them equal; spelled here because importing planc.manifest brings in the safetensors reader).
GGUF_DEQUANTIZABLE = ("IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
# The K-quants whose kernels compute four values a thread (`gguf_kernels._quad_kernel`), with their block
# bytes: their launches cover a quarter as many threads as values.
QUADS = {"Q2_K": 84, "Q3_K": 110, "Q6_K": 210}
SCATTER_WIDTHS = (1, 2, 4, 8)


def arr(dtype_str: str, ndim: int = 1) -> tuple:
    return ("a", dtype_str, ndim)


def convert_launch(src: str, dst: str) -> tuple[str, tuple]:
    """(name, signature) of the launch converting `src` to `dst` (safetensors names)."""
    s, d = _ITEMSIZE[src], _ITEMSIZE[dst]
    name = "copy" if src == dst else CONVERT_KERNEL[(src, dst)]
    return name, (arr(_UINT[s]), arr(_UINT[d]), INT)


def add_launch(src: str, dst: str) -> tuple[str, tuple]:
    """(name, signature) of the conversion of `src` to `dst` that adds a float32 constant (its bits an
    integer argument) to each value (`planc.execute.kernels.kernels._add_kernel`)."""
    return f"add_{src.lower()}_{dst.lower()}", (arr(_UINT[_ITEMSIZE[src]]), arr(_UINT[_ITEMSIZE[dst]]), INT, INT)


def dequant_launch(out_dtype: str) -> tuple[str, tuple]:
    """(name, signature) of the FP8 dequantization into `out_dtype` (the FP8 kind is in the table)."""
    return f"dequant_{out_dtype}", (arr(_UINT[1]), arr(F32), arr(F32), arr(_UINT[_ITEMSIZE[out_dtype]]),
                                    INT, INT, INT, INT)


def transpose_launch(itemsize: int) -> tuple[str, tuple]:
    return f"transpose_{itemsize}", (arr(_UINT[itemsize]), arr(_UINT[itemsize]), INT, INT)


def scatter_launch(width: int) -> tuple[str, tuple]:
    return f"scatter_{width}", (arr(_UINT[width]), arr(_UINT[width]), arr(I64, 2), INT, INT)


def zero_launch() -> tuple[str, tuple]:
    return "zero", (arr(_UINT[1]), INT)


def gguf_launch(type_name: str, out_dtype: str) -> tuple[str, tuple]:
    """(name, signature) of the dequantization of GGML `type_name` blocks (bytes) into `out_dtype`."""
    return f"gguf_{type_name}_{out_dtype}", (arr(_UINT[1]), arr(_UINT[_ITEMSIZE[out_dtype]]), INT, INT, INT)


def fp4_launch(fmt: str, out_dtype: str, transpose: bool) -> tuple[str, tuple]:
    """(name, signature) of an FP4 dequantization (`planc.execute.kernels.fp4_dispatch`): weight, scales, for
    NVFP4 the E4M3 decode table and the per-tensor scale, the output bits, batch, rows, cols."""
    name = f"{fmt}{'t' if transpose else ''}_{out_dtype}"
    nv = (arr(F32), arr(F32)) if fmt == "nvfp4" else ()
    return name, (arr(_UINT[1]), arr(_UINT[1]), *nv, arr(_UINT[_ITEMSIZE[out_dtype]]), INT, INT, INT)


def launches() -> list[tuple[str, tuple]]:
    """Every (kernel name, signature) the executor launches, each once, in a stable order."""
    out = [convert_launch(a, b) for a in sorted(FLOAT_CONVERTIBLE) for b in sorted(FLOAT_CONVERTIBLE)]
    out += [add_launch(a, b) for a in sorted(FLOAT_CONVERTIBLE) for b in sorted(FLOAT_CONVERTIBLE)]
    out += [transpose_launch(s) for s in TRANSPOSE_SIZES]
    out += [dequant_launch(d) for d in sorted(FLOAT_CONVERTIBLE)]
    out += [fp4_launch(f, d, t) for f in FP4_FORMATS for d in sorted(FLOAT_CONVERTIBLE) for t in (False, True)]
    out += [gguf_launch(t, d) for t in sorted(GGUF_DEQUANTIZABLE) for d in sorted(FLOAT_CONVERTIBLE)]
    out += [scatter_launch(w) for w in SCATTER_WIDTHS]
    out.append(zero_launch())
    seen, unique = set(), []
    for x in out:
        if x not in seen:
            seen.add(x)
            unique.append(x)
    return unique


def sig_tag(sig: tuple) -> str:
    """A short, file-name-safe spelling of a signature: 'u2.u4.i' (2-D arrays get their ndim)."""
    parts = []
    for s in sig:
        if s[0] == "i":
            parts.append("i")
        else:
            t = s[1].lstrip("<|>=")
            parts.append(t if s[2] == 1 else f"{t}x{s[2]}")
    return ".".join(parts)


def source_hash() -> str:
    """sha256 of the kernel sources (`SOURCES`), as the shipped index records it."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0")
        h.update((SOURCE_DIR / name).read_bytes().replace(b"\r\n", b"\n"))
    return h.hexdigest()

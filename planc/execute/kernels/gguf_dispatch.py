"""Launcher of the GGUF dequantization kernels (`planc.execute.kernels.gguf_kernels`): a tensor's stored blocks
(flat uint8 device bytes) -> one launch of `gguf_{type}_{out}` over its elements, on the device's 1-D
grid. Imports no numba: on a GPU the launch is served by the shipped machine code, and numba comes
in only for a launch none serves (`launch.kernel_of`), as for every other kernel.

(The launcher once lived beside the kernels and built them for every launch: each GGUF load
imported numba, about 120 MB of host memory the plan does not count and a second or more of the
load's wall on the H200.)
"""

from __future__ import annotations

from ...base.dtypes import FLOAT_CONVERTIBLE
from .signatures import GGUF_DEQUANTIZABLE, QUADS

NAMES = frozenset(f"gguf_{t}_{o}" for t in GGUF_DEQUANTIZABLE for o in FLOAT_CONVERTIBLE)  # e.g. gguf_Q4_K_BF16


def dequantize_gguf(src_u8, dst, type_name: str, out_dtype: str, numel: int, stream=0, *, dev, row: int = 0,
                    hd: int = 0) -> None:
    """Launch `gguf_{type_name}_{out_dtype}` over `numel` elements: `src_u8` the stored blocks (flat
    uint8 device array), `dst` a flat uint32 (F32) or uint16 (F16, BF16) device array of `numel`.
    `hd` > 0: rows of `row` values, written in transformers' order by heads of `hd` rows (a GGUF q / k
    weight); 0: in the stored order. `dev`: the device."""
    name = f"gguf_{type_name}_{out_dtype}"
    if name not in NAMES:
        raise ValueError(f"no GGUF dequantization kernel {name}")
    if numel <= 0:
        return
    if hd and (hd % 2 or row <= 0 or numel % (row * hd)):
        raise ValueError(f"{name}: {numel} values are not whole heads of {hd} rows of {row}")
    per = 4 if type_name in QUADS else 1  # values a thread computes
    if per > 1 and (numel % 256 or (hd and row % 256)):
        raise ValueError(f"{name}: {numel} values in rows of {row or numel} are not whole blocks of 256")
    blocks, threads = dev.grid.map(numel // per)
    dev.launch(name, blocks, threads, stream, src_u8, dst, numel, row if hd else 0, hd)

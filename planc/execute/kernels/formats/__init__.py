"""The kernel formats of the executor, one registered class each (`planc.base.formats` names them):
what a kernel record of that format launches, the host reference of a host-path part, the kernel
signatures it ships (`planc.execute.kernels.signatures`) and the warm-up of its kernels before the first
launch. The launcher is a lookup: `FORMATS[k.format].launch(runs, r, k)`.

* `float` (`floats.Float`): F32 / F16 / BF16 conversions, in place or from the landing region;
* `transpose` (`transpose.Transpose`): the last two dims swapped (host: converted first);
* `fp8` (`fp8.Fp8`): FP8 blocks times F32 block scales;
* `mxfp4`, `nvfp4` (`fp4.Fp4`): packed FP4 and their block scales (NVFP4: and the per-tensor scale);
* `gguf` (`gguf.Gguf`): GGUF blocks of the part's GGML type.

Adding a format is one module with its class, its kernels' source and shipped PTX, and its name in
`planc.base.formats.FORMATS`.
"""

from __future__ import annotations

from ....base.formats import FORMATS as NAMES
from ....base.formats import kernel_format
from .base import Format
from .floats import Float
from .fp4 import Fp4
from .fp8 import Fp8
from .gguf import Gguf
from .transpose import Transpose

FORMATS: dict[str, Format] = {f.name: f for f in (Float(), Transpose(), Fp8(), Fp4("mxfp4"), Fp4("nvfp4"), Gguf())}
assert tuple(FORMATS) == NAMES, "every format named in planc.base.formats has its class here, in that order"


def of_part(p) -> Format | None:
    """The format of part p's transform (None: a copy, nothing to transform)."""
    if p.op == "copy":
        return None
    return FORMATS[kernel_format(p.op, p.inputs[0].dtype, p.inputs[1].dtype if len(p.inputs) >= 2 else None)]


__all__ = ["FORMATS", "Format", "of_part"]

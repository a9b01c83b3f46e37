"""The formats' own checks of a plan file's parts and kernel records, one class per format (the
plan reader, `planc.plan.check`, looks them up by the format's name, `planc.base.formats`):

* `gguf` (`gguf.GgufCheck`): GGUF blocks of a GGML type, kept or dequantized, and their kernel of
  one or several parts;
* `mxfp4`, `nvfp4` (`fp4.Fp4Check`): packed FP4 weights and their block scales.

The element-wise formats (`float`, `transpose`, `fp8`) share the reader's checks of a part's
shape, bytes and regions. The executor's class of each format (`planc.execute.kernels.formats`)
names its check as `check`: a format is its check, its launch, its host reference and its kernels.
"""

from __future__ import annotations

from .base import FormatCheck
from .fp4 import Fp4Check
from .gguf import GgufCheck

CHECKS: dict[str, FormatCheck] = {c.name: c for c in (GgufCheck(), Fp4Check("mxfp4"), Fp4Check("nvfp4"))}

__all__ = ["CHECKS", "FormatCheck"]

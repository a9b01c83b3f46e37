"""GGML tensor types as GGUF files store them: type id -> name, block of elements, bytes per block.

The table is llama.cpp's (`ggml.h`, and the `gguf` package's `GGML_QUANT_SIZES`, which a test checks
it against); it is kept here so that reading a header imports nothing. Plain types carry the
safetensors spelling the rest of planc uses (`F32`, `F16`, `BF16`, `I8`, ...); block-quantized
types keep GGML's name (`Q8_0`, `Q4_K`, ...). Ids that GGML retired (4, 5: Q4_2, Q4_3; 31-33, 36-38:
the Q4_0_4_4 family, removed repacked layouts) are unknown, as they are to llama.cpp.
"""

from __future__ import annotations

from typing import NamedTuple


class GGMLType(NamedTuple):
    id: int
    name: str  # planc's spelling: safetensors' for plain types, GGML's for block-quantized ones
    block: int  # elements per block (1 for plain types)
    block_bytes: int  # bytes per block

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def nbytes(self, numel: int) -> int | None:
        """Bytes of `numel` elements, or None when they are not whole blocks."""
        if numel % self.block:
            return None
        return numel // self.block * self.block_bytes


_TABLE = [
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98), (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56), (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
]

GGML_TYPES: dict[int, GGMLType] = {i: GGMLType(i, n, b, s) for i, n, b, s in _TABLE}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}
QUANTIZED = frozenset(t.name for t in GGML_TYPES.values() if t.quantized)
# The quantized types planc dequantizes (host and device), bit-exact to the gguf package's numpy.
DEQUANTIZABLE = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                           "IQ4_NL", "IQ4_XS"})


def quant_type(name: str) -> GGMLType | None:
    """The block-quantized GGML type spelled `name`, or None for any other dtype."""
    t = BY_NAME.get(name)
    return t if t is not None and t.quantized else None

"""A `LoadedModel` as torch tensors (`state_dict`): each tensor taken as bytes (a uint8
`__cuda_array_interface__` of its range), then reinterpreted with `.view` in its true dtype
(bfloat16 and FP8 included, which the interface cannot spell) and reshaped: no copy. The torch
tensor holds a reference to the arena, so it stays valid after `free()` drops the model's own.
Under the CUDA simulator there are no device pointers: the bytes are copied to host tensors
instead. torch is optional (the `torch` extra) and imported only inside these functions; the
hand-off into modules (`planc.face.torch`) builds on them.
"""

from __future__ import annotations

from ...base.codes import Code
from ...base.errors import HandoffError

# safetensors dtype -> torch dtype attribute
TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64", "I64": "int64",
    "U64": "uint64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}


def import_torch():
    try:
        import torch
    except ImportError:
        raise HandoffError("this needs PyTorch, which is not installed: pip install 'planc[torch]'",
                           code=Code.TORCH_MISSING) from None
    return torch


def torch_dtype(name: str):
    torch = import_torch()
    attr = TORCH_DTYPES.get(name)
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        raise HandoffError(f"dtype {name} has no torch dtype in torch {torch.__version__}", code=Code.DTYPE_UNSUPPORTED)
    return dt


class _Bytes:
    """A tensor's bytes as a uint8 `__cuda_array_interface__`; holds the DeviceTensor (and so the arena)."""

    __slots__ = ("owner", "__cuda_array_interface__")

    def __init__(self, t):
        iface = t.__cuda_array_interface__
        self.owner = t
        self.__cuda_array_interface__ = {"shape": (t.nbytes,), "typestr": "|u1", "data": iface["data"],
                                         "version": 3, "strides": None, "stream": None}


def to_torch(t, simulated: bool):
    """One DeviceTensor as a torch tensor in its true dtype (no copy on a GPU)."""
    torch = import_torch()
    dt = torch_dtype(t.dtype)
    if t.nbytes == 0:
        return torch.empty(t.shape, dtype=dt, device="cpu" if simulated else f"cuda:{t.device_index}")
    if simulated:
        raw = torch.from_numpy(t.raw.copy_to_host())
    else:
        raw = torch.as_tensor(_Bytes(t), device=f"cuda:{t.device_index}")
    return raw.view(dt).reshape(t.shape)


def state_dict(model) -> dict:
    simulated = model.simulated
    return {name: to_torch(t, simulated) for name, t in sorted(model.items())}

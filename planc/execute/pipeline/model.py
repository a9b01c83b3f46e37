"""`LoadedModel`: name -> `DeviceTensor` (a typed view into one device arena) + the measured report.

Each tensor exposes `__cuda_array_interface__` on a GPU, so CuPy and PyTorch take it without a
copy. Types numpy cannot spell (bfloat16, FP8) are exposed as unsigned integers of the same width;
`DeviceTensor.torch()` reinterprets them without a copy:

    t = model["lm_head.weight"].torch()          # torch.bfloat16, shares the arena's memory
    # same as: torch.as_tensor(model["lm_head.weight"], device="cuda").view(torch.bfloat16)
"""

from __future__ import annotations

import math

import numpy as np

from ...base.dtypes import DTYPES
from ..device import seam
from ...base.codes import Code

_STORAGE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TORCH = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def storage_dtype(name: str) -> np.dtype:
    d = DTYPES[name]
    if d.numpy is not None and d.numpy.kind in "biufc" and d.numpy.type.__module__ == "numpy":
        return d.numpy
    return np.dtype(_STORAGE[d.itemsize])


class State:
    """Shared by a model and its tensors: `torn` is why the bytes cannot be trusted (a reload that
    failed after it began writing), else None."""

    __slots__ = ("torn", "freed")

    def __init__(self):
        self.torn = None
        self.freed = False

    def check(self, what: str) -> None:
        if self.freed:
            from ...base.errors import ModelFreedError

            raise ModelFreedError(f"{what}: the model was freed (LoadedModel.free); its device memory is given "
                                  f"back. Load it again", code=Code.MODEL_FREED)
        if self.torn is not None:
            from ...base.errors import TornModelError

            raise TornModelError(f"{what}: the model is torn ({self.torn}); its bytes mix two checkpoints. "
                                 f"Reload it (LoadedModel.reload) before reading", code=Code.TORN)


class DeviceTensor:
    def __init__(self, name: str, dtype: str, shape: tuple, offset: int, nbytes: int, arena, device_index: int, dev):
        self.name, self.dtype, self.shape, self.offset_bytes, self.nbytes = name, dtype, tuple(shape), offset, nbytes
        self._arena = arena
        self._dev = dev  # the device that holds the arena (`seam.Device`)
        self.device_index = device_index
        self._state = State()

    @property
    def storage(self) -> np.dtype:
        return storage_dtype(self.dtype)

    @property
    def raw(self):
        """The tensor's bytes: a uint8 device array view."""
        self._state.check(self.name)
        return self._arena[self.offset_bytes:self.offset_bytes + self.nbytes]

    @property
    def array(self):
        """A device array of the storage dtype, shaped (bfloat16 and FP8 as unsigned ints)."""
        n = math.prod(self.shape)
        if n == 0 and not self._dev.views_empty:  # the simulator's arrays cannot view zero bytes
            return self._dev.empty(self.shape, self.storage)
        return self.raw.view(self.storage).reshape(self.shape)

    @property
    def __cuda_array_interface__(self) -> dict:
        self._state.check(self.name)
        ptr = self._dev.pointer(self._arena) + self.offset_bytes if self.nbytes else 0
        return {"shape": self.shape, "typestr": self.storage.str, "data": (ptr, False), "version": 3,
                "strides": None, "stream": None}

    def torch(self):
        """A torch tensor sharing this memory, in the true dtype (bfloat16 included)."""
        import torch

        t = torch.as_tensor(self, device=f"cuda:{self.device_index}")
        if self.dtype in _TORCH:
            t = t.view(getattr(torch, _TORCH[self.dtype]))
        return t

    def to_host(self) -> np.ndarray:
        """Copy back to the host in the true dtype (ml_dtypes for bfloat16/FP8)."""
        self._state.check(self.name)
        raw = self.raw.copy_to_host() if self.nbytes else np.zeros(0, np.uint8)
        d = DTYPES[self.dtype].numpy
        return raw.view(d).reshape(self.shape) if d is not None else raw

    def __repr__(self) -> str:
        return f"DeviceTensor({self.name!r}, {self.dtype}, {list(self.shape)})"


class LoadedModel:
    """The loaded tensors (a mapping) and the measured report (`records.Report`, typed and immutable).
    `simulated`: whether the tensors live in the CUDA simulator (host memory standing in for the
    device). `free()` releases the device memory. `reload(target)` writes another checkpoint of the
    same layout into the same memory (docs/reload.md); `torn` says why a failed reload left the
    bytes unusable (None: they are a checkpoint's). `resolve(target, rank)`: how `reload` turns its
    target into a Plan (`planc.load` gives its models the resolver of specs and plan files; without
    one, `reload` takes a `Plan`). `load`: the function that loads a plan (`execute`), which
    `reload` runs into this model's memory."""

    def __init__(self, tensors: dict, report, arena, simulated: bool, load=None):
        self.resolve = None
        self._load = load
        self.tensors = tensors
        self.report = report
        self.simulated = simulated
        self._arena = arena
        self._state = State()
        for t in tensors.values():
            t._state = self._state

    @property
    def torn(self) -> str | None:
        return self._state.torn

    def reload(self, target, *, rank: int | None = None, device: str | None = None, verify=False,
               digest=None, settings=None):
        """Load `target` (a spec, a plan file or a `Plan` of a checkpoint with this model's layout)
        into this model's device memory: every tensor keeps its address. The layout is checked
        first (`ReloadError`, nothing written); a failure after writing began leaves the model
        torn (reads raise `TornModelError`) until a reload succeeds. Returns the load's report
        (also `self.report`). `verify` and `digest` as for `planc.load`: `verify="digest"` hashes every
        byte against a digest file (`planc.manifest.digest`) as it streams."""
        from ...base.verifyarg import verify_arg
        from .reload import reload_model

        verify, digest = verify_arg(verify, digest)
        plan = self.resolve(target, rank) if self.resolve is not None else target
        return reload_model(self, plan, load=self._load, device=device, verify=verify, digest=digest,
                            settings=settings)

    def __getitem__(self, name: str) -> DeviceTensor:
        if self._state.freed:
            self._state.check(name)
        return self.tensors[name]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    def state_dict(self) -> dict:
        """name -> torch.Tensor in the true dtype, sharing the arena (copied to host under the simulator)."""
        self._state.check("state_dict")
        from .torchview import state_dict

        return state_dict(self)

    def free(self) -> None:
        """Give the device memory back now (the load's pinned ring is already on its way back:
        `seam.release_later`; the next load, or the interpreter's exit, waits for it)."""
        self._state.freed = True  # the tensors a caller still holds refuse reads from now on
        self.tensors = {}
        arena, self._arena = self._arena, None
        del arena
        seam.release(settle=False)

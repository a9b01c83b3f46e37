"""A torch module's own tensors as the memory a load writes into (`planc.load_into(..., inplace=True)`):
the module + a plan -> (arena offset, bytes, destination) for `planc.execute.pipeline.reload.ModuleArena`, each
tensor checked against the plan's first (present, same shape and dtype, contiguous, on the device).
"""

from __future__ import annotations

from ..base.codes import Code
from ..base.errors import HandoffError


def module_targets(module, plan, simulated: bool) -> tuple[list, dict]:
    """(targets for `ModuleArena`, name -> the module tensor written) for `plan`'s tensors, each
    checked against the module's parameter or persistent buffer of that name: present, same shape
    and dtype, contiguous, on the plan's device (on the CPU under the simulator)."""
    from .torch import check_keys, torch_dtype

    state = module.state_dict(keep_vars=True)
    names = {t.name: t for t in plan.tensors}
    missing, unexpected, _, shapes = check_keys(module, names)
    if unexpected:
        raise HandoffError(f"the plan loads tensors the module does not have: {', '.join(unexpected[:20])}",
                           code=Code.KEYS_MISMATCH)
    if shapes:
        raise HandoffError(f"{len(shapes)} tensor(s) differ in shape from the module's: {', '.join(shapes[:20])}",
                           code=Code.SHAPE_MISMATCH)
    targets, written = [], {}
    for t in sorted(plan.tensors, key=lambda t: t.offset_bytes):
        p = state[t.name].data
        if p.dtype != torch_dtype(t.dtype):
            raise HandoffError(f"{t.name}: the plan writes {t.dtype}, the module's tensor is {p.dtype}",
                               code=Code.DTYPE_MISMATCH)
        if not p.is_contiguous():
            raise HandoffError(f"{t.name}: the module's tensor is not contiguous; it cannot be written in place",
                               code=Code.NOT_CONTIGUOUS)
        if simulated and p.device.type != "cpu" or not simulated and p.device.type != "cuda":
            raise HandoffError(f"{t.name}: the module's tensor is on {p.device}, not on the device; load_into(inplace=True) "
                               f"writes into tensors on the device", code=Code.NOT_ON_DEVICE)
        if t.nbytes:
            targets.append((t.offset_bytes, t.nbytes, _destination(p, t.nbytes, simulated)))
        written[t.name] = p
    return targets, written



def _destination(p, nbytes: int, simulated: bool):
    if simulated:
        return _HostBytes(p.view(-1).view(__import__("torch").uint8).numpy())
    from ..execute.device import driver

    return driver.DeviceArray(p, p.data_ptr(), (nbytes,), "uint8")


class _HostBytes:
    """A CPU tensor's bytes, written as the simulator writes device memory (`copy_to_device`)."""

    def __init__(self, view):
        self.view = view

    def __getitem__(self, key):
        return _HostBytes(self.view[key])

    def copy_to_device(self, src, stream=None):
        self.view[:] = src

"""Hand-off to PyTorch: `LoadedModel` -> torch tensors -> a module built on the meta device.

torch is optional (the `torch` extra) and imported only inside these functions.

- `state_dict(model)`: name -> `torch.Tensor` sharing the arena's memory, no copy (from
  `planc.execute.pipeline.torchview`, where `LoadedModel.state_dict` takes it too; under the CUDA
  simulator the bytes are copied to host tensors).
- `assign(module, tensors, strict)`: the keys checked as `load_state_dict` checks them (missing,
  unexpected, shapes) *before* anything is assigned; parameters and persistent buffers assigned
  (`load_state_dict(assign=True)`: the module takes the tensors, no copy); tied parameters (one
  `Parameter` under several names, as `lm_head.weight` and `model.embed_tokens.weight`) tied again
  to the one that was loaded; non-persistent buffers left on the meta device (rotary `inv_freq`)
  rebuilt by the module's own initialisation (see `_rebuild`), or named when that is not possible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.errors import HandoffError
from ..base.codes import Code
from ..execute.pipeline.torchview import TORCH_DTYPES, import_torch, state_dict, to_torch, torch_dtype  # noqa: F401

_LISTED = 20


@dataclass
class Assigned:
    """What `assign` did, with the keys reported the way `load_state_dict` reports them."""

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    tied: list[list[str]] = field(default_factory=list)  # names sharing one loaded parameter
    rebuilt_buffers: list[str] = field(default_factory=list)  # non-persistent buffers made by the module's init
    uninitialized_buffers: list[str] = field(default_factory=list)  # left on the meta device


def _listed(names: list[str]) -> str:
    more = f" ... (+{len(names) - _LISTED} more)" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def _tied_groups(module) -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def check_keys(module, tensors: dict) -> tuple[list[str], list[str], list[list[str]], list[str]]:
    """(missing, unexpected, tied groups, shape mismatches) of `tensors` against `module`'s state dict."""
    expected = module.state_dict(keep_vars=True)
    tied = _tied_groups(module)
    covered = set()
    for names in tied:  # one loaded name of a tied group covers the others
        if any(n in tensors for n in names):
            covered.update(names)
    missing = sorted(n for n in expected if n not in tensors and n not in covered)
    unexpected = sorted(n for n in tensors if n not in expected)
    shapes = sorted(f"{n}: loaded {list(tensors[n].shape)}, module {list(expected[n].shape)}"
                    for n in expected if n in tensors and tuple(tensors[n].shape) != tuple(expected[n].shape))
    return missing, unexpected, tied, shapes


def assign(module, tensors: dict, strict: bool = True) -> Assigned:
    missing, unexpected, tied, shapes = check_keys(module, tensors)
    if shapes:
        raise HandoffError(f"{len(shapes)} tensor(s) differ in shape from the module's: {_listed(shapes)}",
                           code=Code.SHAPE_MISMATCH)
    if strict and (missing or unexpected):
        raise HandoffError(f"the load does not fit the module: missing keys ({len(missing)}): "
                           f"{_listed(missing) or 'none'}; unexpected keys ({len(unexpected)}): "
                           f"{_listed(unexpected) or 'none'}; fix the spec's rules (planc explain --json lists "
                           f"the tensors it loads) or pass strict=False", code=Code.KEYS_MISMATCH)
    wanted = {n: t for n, t in tensors.items() if n not in unexpected}
    module.load_state_dict(wanted, strict=False, assign=True)
    out = Assigned(missing, unexpected)
    for names in tied:
        src = next((n for n in names if n in tensors), None)
        if src is None:
            continue
        p = module.get_parameter(src)
        for n in names:
            if n != src:
                owner, _, attr = n.rpartition(".")
                setattr(module.get_submodule(owner), attr, p)
        out.tied.append(sorted(names))
    device = next((t.device for t in tensors.values()), None)
    out.rebuilt_buffers, out.uninitialized_buffers = _materialize(module, device)
    if strict and out.uninitialized_buffers:
        raise HandoffError(f"non-persistent buffers left on the meta device (no rule loads them and their module "
                           f"could not rebuild them): {_listed(out.uninitialized_buffers)}; give their module a "
                           f"`reset_parameters()` or pass strict=False and set them yourself",
                           code=Code.BUFFERS_UNINITIALIZED)
    return out


def _materialize(module, device) -> tuple[list[str], list[str]]:
    """Rebuild the non-persistent buffers still on the meta device, module by module."""
    rebuilt, left = [], []
    for prefix, sub in module.named_modules():
        names = [b for b in getattr(sub, "_non_persistent_buffers_set", ())
                 if sub._buffers.get(b) is not None and sub._buffers[b].is_meta]
        if not names:
            continue
        full = [f"{prefix}.{b}" if prefix else b for b in sorted(names)]
        if device is not None and _rebuild(sub, sorted(names), device):
            rebuilt += full
        else:
            left += full
    return sorted(rebuilt), sorted(left)


def _rebuild(sub, names: list[str], device) -> bool:
    """Re-run the submodule's own initialisation for its meta buffers `names`; True when they are real.

    In order: (0) a 0-d buffer `X` whose module holds its value as the number `scalar_X`
    (transformers' scaled embeddings, Gemma's `embed_scale`) is made from that number; (1) a module
    with a `config` and no parameters of its own (transformers' rotary
    embeddings) is built again from that config on `device`, and its buffers taken; (2) the rope
    recipe `inv_freq, attention_scaling = rope_init_fn(config, device)` (transformers 4.4x);
    (3) a module with no parameters and no persistent buffers of its own gets its buffers
    allocated and calls its `reset_parameters()`. A module with weights of its own is never
    re-initialised: that could overwrite what was loaded.
    """
    torch = import_torch()
    own_params = any(True for _ in sub.parameters(recurse=False))
    persistent = [b for b in sub._buffers if b not in sub._non_persistent_buffers_set]
    scalars = {b: getattr(sub, f"scalar_{b}", None) for b in names}
    if all(type(v) in (int, float) and sub._buffers[b].dim() == 0 for b, v in scalars.items()):
        # A 0-d buffer whose value the module keeps as a number too (transformers' scaled embeddings:
        # `embed_scale` beside `scalar_embed_scale`), in the dtype its init gave it.
        for b, v in scalars.items():
            sub._buffers[b] = torch.tensor(v, dtype=sub._buffers[b].dtype, device=device)
        return True
    if own_params:
        return False
    config = getattr(sub, "config", None)
    if config is not None:
        try:
            # Built on the CPU, then moved, as transformers does when it materialises a model: a
            # rotary `inv_freq` computed on the GPU can differ in its last bits (powers of a large
            # rope_theta), and the logits with it.
            with torch.device("cpu"):
                fresh = type(sub)(config)
            if all(not fresh._buffers[b].is_meta for b in names):
                for b in names:
                    sub._buffers[b] = fresh._buffers[b].to(device)
                for attr, v in vars(fresh).items():  # tensors kept as attributes (original_inv_freq)
                    if isinstance(v, torch.Tensor) and not attr.startswith("_"):
                        setattr(sub, attr, v.to(device))
                return True
        except Exception:  # noqa: BLE001 - an init that takes other arguments: try the next recipe
            pass
    init = getattr(sub, "rope_init_fn", None)
    if config is not None and callable(init) and names == ["inv_freq"]:
        inv_freq, scaling = init(config, device)
        sub._buffers["inv_freq"] = inv_freq.to(device)
        sub.attention_scaling = scaling
        if isinstance(getattr(sub, "original_inv_freq", None), torch.Tensor):
            sub.original_inv_freq = sub._buffers["inv_freq"]
        return True
    reset = getattr(sub, "reset_parameters", None)
    if callable(reset) and not persistent:
        for b in names:
            sub._buffers[b] = torch.empty_like(sub._buffers[b], device=device)
        reset()
        return True
    return False

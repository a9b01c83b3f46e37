"""New weights into live device memory on a real GPU (marked `gpu`; skipped without torch, a GPU,
or with the simulator on):

    python -m pytest -m gpu -p no:cacheprovider tests/test_reload_gpu.py

`LoadedModel.reload` and `load_into(..., inplace=True)` must keep every tensor's device address
(`data_ptr()`, `__cuda_array_interface__`) and leave the second checkpoint's bytes there; a
digest-verified load on the GPU must catch a flipped byte.
"""

import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip("the CUDA simulator is on in this process; run this file alone, without NUMBA_ENABLE_CUDASIM",
                allow_module_level=True)

import numba  # noqa: E402
from numba import cuda  # noqa: E402

if numba.config.ENABLE_CUDASIM or not cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import families  # noqa: E402
import planc  # noqa: E402
from execute_support import bits  # noqa: E402
from planc.base.errors import DigestError  # noqa: E402
from test_layouts import shipped  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]


def _meta_llama():
    nn = torch.nn
    with torch.device("meta"):
        module = nn.Module()
        module.model = nn.Module()
        module.model.embed_tokens = nn.Embedding(families.V, families.H)
        module.model.norm = nn.RMSNorm(families.H)
        module.lm_head = nn.Linear(families.H, families.V, bias=False)
    return module


def _ends(seed):
    return {n: a for n, a in families.llama(seed).items() if not n.startswith("model.layers.")}


def _same_bytes(t, want) -> bool:
    return np.array_equal(t.detach().contiguous().view(torch.uint8).cpu().numpy().reshape(-1), bits(want))


def test_reload_keeps_addresses_and_torch_views_see_new_values(tmp_path):
    a, b = families.llama(0), families.llama(1)
    model = planc.load(shipped(tmp_path / "a", "transformers-llama", a))
    try:
        sd = model.state_dict()
        ptrs = {n: t.data_ptr() for n, t in sd.items()}
        model.reload(shipped(tmp_path / "b", "transformers-llama", b))
        assert model.torn is None
        for n, t in model.state_dict().items():
            assert t.data_ptr() == ptrs[n], n
        for n, t in sd.items():  # the tensors taken before the reload read the new bytes
            assert _same_bytes(t, b[n]), n
    finally:
        model.free()


def test_load_into_inplace_writes_the_modules_own_storage(tmp_path):
    module = _meta_llama()
    res = planc.load_into(module, shipped(tmp_path / "a", "transformers-llama", _ends(0)))
    try:
        ptrs = {n: p.data_ptr() for n, p in module.state_dict().items()}
        b = _ends(1)
        got = planc.load_into(module, shipped(tmp_path / "b", "transformers-llama", b), inplace=True)
        assert got.model is None and got.missing_keys == []
        for n, p in module.state_dict().items():
            assert p.data_ptr() == ptrs[n], n
            assert _same_bytes(p, b[n]), n
    finally:
        res.model.free()


def test_load_into_inplace_into_tensors_torch_allocated(tmp_path):
    """A module whose tensors torch allocated, one per parameter (not a planc arena)."""
    module = _meta_llama().to_empty(device="cuda").to(torch.bfloat16)
    ptrs = {n: p.data_ptr() for n, p in module.state_dict().items()}
    b = _ends(2)
    planc.load_into(module, shipped(tmp_path, "transformers-llama", b), inplace=True)
    for n, p in module.state_dict().items():
        assert p.data_ptr() == ptrs[n]
        assert _same_bytes(p, b[n]), n


def test_digest_catches_a_flipped_byte_on_the_gpu(tmp_path):
    from planc.manifest import digest as dg

    src = families.llama(0)
    spec = shipped(tmp_path, "transformers-llama", src)
    ck = tmp_path / "ckpt"
    d = tmp_path / "d.json"
    d.write_bytes(dg.encode(dg.make_digest(ck, extent_bytes=64 << 10)))
    m = planc.load(spec, verify="digest", digest=d)
    assert m.report["digest"]["ok"]
    m.free()
    f = ck / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 4
    f.write_bytes(bytes(data))
    with pytest.raises(DigestError) as e:
        planc.load(spec, verify="digest", digest=d)
    assert e.value.code == "digest-mismatch" and str(f) in str(e.value)

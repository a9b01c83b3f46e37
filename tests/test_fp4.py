"""MXFP4 and NVFP4: the reference against the formats' definitions, binding and its refusals, and
the shipped specs end to end on the host path (`on: host`) and the device path under the CUDA
simulator, bit-exact to the reference (the kernels alone: tests/test_fp4_device.py)."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import BindError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.kernels import fp4ref  # noqa: E402
from planc.tools.synth_fp4 import TINY, tensors, write_fp4_checkpoint  # noqa: E402


def e2m1_def(n: int) -> float:
    """E2M1 from its definition: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    s, e, m = (n >> 3) & 1, (n >> 1) & 3, n & 1
    v = (m / 2) if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -v if s else v


def test_e2m1_table_is_the_definition():
    assert [e2m1_def(n) for n in range(16)] == list(fp4ref.E2M1)
    assert np.signbit(fp4ref.E2M1[8])


@pytest.mark.parametrize("target", ["BF16", "F16", "F32"])
def test_mxfp4_every_byte_and_exponent_class(target):
    d_np = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}[target]
    classes = [0, 1, 127, 254, 255]
    blocks = np.tile(np.arange(256, dtype=np.uint8).reshape(16, 16), (len(classes), 1, 1))  # [5, 16, 16]
    scales = np.repeat(np.array(classes, np.uint8)[:, None], 16, axis=1)  # [5, 16]: one exponent per row
    got = fp4ref.mxfp4(blocks, scales, target)
    assert got.shape == (5, 16 * 32) and got.dtype == d_np
    for k, s in enumerate(classes):
        for byte in range(256):
            g, i = divmod(byte, 16)
            for half, nib in ((0, byte & 15), (1, byte >> 4)):
                v = got[k, g * 32 + 2 * i + half]
                if s == 255:
                    assert np.isnan(np.float32(v)) and not np.signbit(np.float32(v))
                else:
                    with np.errstate(over="ignore"):
                        want = np.array([np.float64(e2m1_def(nib)) * 2.0 ** (s - 127)]).astype(d_np)[0]
                    assert np.array([v], d_np).tobytes() == np.array([want], d_np).tobytes(), (s, byte, half)


def test_mxfp4_transpose_swaps_the_last_two_dims():
    rng = np.random.default_rng(1)
    b = rng.integers(0, 256, (3, 5, 2, 16), dtype=np.uint8)
    s = rng.integers(120, 130, (3, 5, 2), dtype=np.uint8)
    plain = fp4ref.mxfp4(b, s)
    assert np.array_equal(fp4ref.mxfp4(b, s, transpose=True).view(np.uint16), np.swapaxes(plain, 1, 2).view(np.uint16))


def test_nvfp4_is_e2m1_times_block_scale_times_tensor_scale():
    rng = np.random.default_rng(2)
    w = rng.integers(0, 256, (3, 16), dtype=np.uint8)
    sc = rng.uniform(0.1, 3, (3, 2)).astype(ml_dtypes.float8_e4m3fn)
    s2 = np.float32(0.0123)
    got = fp4ref.nvfp4(w, sc, s2, "F32")
    for r in range(3):
        for c in range(32):
            byte = w[r, c // 2]
            nib = (byte >> 4) if c % 2 else (byte & 15)
            bs = np.float32(np.float32(sc[r, c // 16]) * s2)
            assert got[r, c] == np.float32(np.float32(e2m1_def(int(nib))) * bs)


def _spec(tmp_path, fam, on="host", **rule):
    name = "gpt-oss" if fam == "mxfp4" else "llama-nvfp4"
    doc = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "specs", f"transformers-{name}.yaml")))
    doc["checkpoint"] = str(tmp_path / fam / "model.safetensors")
    doc["rules"][0].pop(True, None)  # PyYAML reads the key `on` as True
    doc["rules"][0]["on"] = on
    doc["rules"][0].update(rule)
    p = tmp_path / f"{fam}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


@pytest.mark.parametrize("on", ["host", "device"])
@pytest.mark.parametrize("fam", ["mxfp4", "nvfp4"])
def test_shipped_specs_load_bit_exact(tmp_path, fam, on):
    write_fp4_checkpoint(tmp_path / fam, fam)
    src = tensors(fam, TINY[fam])
    plan = compile_spec(_spec(tmp_path, fam, on=on))
    assert {p.path for p in plan.parts if p.op.startswith("dequantize")} == {"host" if on == "host" else "direct"}
    assert plan.fits
    m = execute(plan, verify=True)
    try:
        assert m.report["verify"]["ok"]
        names = set(m.keys())
        assert not any(n.endswith(("_scales", "_blocks", "weight_scale", "weight_scale_2", "input_scale")) for n in names)
        if fam == "mxfp4":
            e = "model.layers.1.mlp.experts"
            want = fp4ref.mxfp4(src[f"{e}.gate_up_proj_blocks"], src[f"{e}.gate_up_proj_scales"], transpose=True)
            got = m[f"{e}.gate_up_proj"].to_host()
            assert got.shape == (4, 64, 128)
        else:
            p = "model.layers.0.mlp.down_proj"
            want = fp4ref.nvfp4(src[f"{p}.weight"], src[f"{p}.weight_scale"], src[f"{p}.weight_scale_2"])
            got = m[f"{p}.weight"].to_host()
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    finally:
        m.free()


def test_scale_of_the_wrong_shape_names_both_tensors(tmp_path):
    src = tensors("mxfp4", TINY["mxfp4"])
    e = "model.layers.0.mlp.experts"
    src[f"{e}.down_proj_scales"] = src[f"{e}.down_proj_scales"][:, :, :1].copy()
    (tmp_path / "mxfp4").mkdir()
    from safetensors.numpy import save_file

    save_file(src, str(tmp_path / "mxfp4" / "model.safetensors"))
    with pytest.raises(BindError) as ei:
        compile_spec(_spec(tmp_path, "mxfp4"))
    assert ei.value.code == "scale-shape"
    assert f"{e}.down_proj_scales" in str(ei.value) and f"{e}.down_proj_blocks" in str(ei.value)


def test_missing_tensor_scale_is_refused(tmp_path):
    src = tensors("nvfp4", TINY["nvfp4"])
    del src["model.layers.0.mlp.up_proj.weight_scale_2"]
    (tmp_path / "nvfp4").mkdir()
    from safetensors.numpy import save_file

    save_file(src, str(tmp_path / "nvfp4" / "model.safetensors"))
    with pytest.raises(BindError) as ei:
        compile_spec(_spec(tmp_path, "nvfp4"))
    assert ei.value.code == "scale-missing" and "up_proj.weight_scale_2" in str(ei.value)

"""bench/handoff.py runs on a GPU machine with transformers; here: it imports, parses its
arguments, writes valid specs, and (with torch) rewrites a fused Mixtral checkpoint into the Hub
layout that the shipped spec fuses back to the same names and shapes."""

import importlib.util
import json
from pathlib import Path

import pytest

from planc.compiler.compile import compile_spec
from planc.spec.model import load_spec

BENCH = Path(__file__).resolve().parent.parent / "bench" / "handoff.py"


@pytest.fixture(scope="module")
def handoff():
    spec = importlib.util.spec_from_file_location("bench_handoff", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arguments(handoff, tmp_path):
    a = handoff.parse_args([str(tmp_path)])
    assert (a.out, a.large, a.mixtral, a.repeats, a.dtypes) == (tmp_path, False, True, 3, ["bf16", "fp16"])
    assert handoff.models_of(a) == ["llama-2GB", "mixtral-small"]
    a = handoff.parse_args([str(tmp_path), "--large", "--no-mixtral", "--dtypes", "fp16", "--repeats", "1"])
    assert handoff.models_of(a) == ["llama-2GB", "llama-15GB"] and a.dtypes == ["fp16"]
    for bad in (["--dtypes", "int8"], ["--repeats", "0"], []):
        with pytest.raises(SystemExit):
            handoff.parse_args(([str(tmp_path)] if bad else []) + bad)


@pytest.mark.parametrize("base", ["transformers-llama", "transformers-mixtral"])
def test_specs_it_writes_are_valid(handoff, tmp_path, base):
    for dtype in ("bf16", "fp16"):
        s = load_spec(handoff.write_spec(tmp_path, base, tmp_path / "ckpt", dtype, f"{base}.{dtype}")).spec
        assert s.checkpoint == str(tmp_path / "ckpt")
        assert all(r.dtype == ("float16" if dtype == "fp16" else "keep") for r in s.rules if not r.skip)


def test_hub_layout_round_trip(handoff, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    E, I, H = 4, 6, 8
    g = torch.Generator().manual_seed(0)
    fused = {"model.layers.0.mlp.experts.gate_up_proj": torch.randn(E, 2 * I, H, generator=g).to(torch.bfloat16),
             "model.layers.0.mlp.experts.down_proj": torch.randn(E, H, I, generator=g).to(torch.bfloat16),
             "model.layers.0.mlp.gate.weight": torch.randn(E, H, generator=g).to(torch.bfloat16),
             "model.norm.weight": torch.randn(H, generator=g).to(torch.bfloat16)}
    ck = tmp_path / "mixtral"
    ck.mkdir()
    save_file(fused, str(ck / "model.safetensors"))
    (ck / "config.json").write_text("{}")
    hub = handoff.hub_layout_mixtral(ck)
    assert hub != ck and (hub / "config.json").exists()
    names = handoff.weight_names(hub)
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in names and "model.layers.0.block_sparse_moe.gate.weight" in names
    assert handoff.hub_layout_mixtral(hub) == hub
    plan = compile_spec(handoff.write_spec(tmp_path, "transformers-mixtral", hub, "bf16", "m"))
    got = {t.name: t.shape for t in plan.tensors}
    assert got == {k: tuple(v.shape) for k, v in fused.items()}
    assert json.loads((hub / "model.safetensors.index.json").read_text())["weight_map"]

"""bench/gguf.py runs on a GPU machine (with transformers for its hand-off); here: it imports without
its own name shadowing the `gguf` package, parses its arguments, and writes specs that compile on a
small GGUF: the shipped spec's rules (on the device or the host) and the same file kept as stored."""

import importlib.util
from pathlib import Path

import pytest

from planc.compiler.compile import compile_spec
from planc.tools.synth_gguf import write_gguf

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gguf.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gguf", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arguments(bench, tmp_path):
    a = bench.parse_args([str(tmp_path / "d"), str(tmp_path / "o")])
    assert (a.size, a.repeat, a.quants, a.handoff, a.handoff_repeat) == ("15GiB", 3, "Q8_0,Q4_K_M", "small", 3)
    for bad in (["--repeat", "0"], ["--handoff", "large"], ["--on", "gpu"]):
        with pytest.raises(SystemExit):
            bench.parse_args([str(tmp_path), str(tmp_path)] + bad)


def test_the_gguf_package_is_the_real_one(bench):
    import gguf

    assert hasattr(gguf, "GGUFWriter") and Path(gguf.__file__).resolve() != BENCH


@pytest.mark.parametrize("on", ["device", "host"])
def test_specs_it_writes_compile(bench, tmp_path, on):
    res = write_gguf(tmp_path / "ck", quant="Q8_0", layers=1)
    sp = bench.specs(Path(res.path), on=on)
    deq, copy = compile_spec(sp["dequant"]), compile_spec(sp["copy"])
    assert {t.name for t in deq.tensors} >= {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"}
    assert all(t.dtype == "BF16" for t in deq.tensors)
    want = "host" if on == "host" else "direct"
    assert all(p.path == want and p.op == "gguf" for p in deq.parts if p.ggml) and any(p.ggml for p in deq.parts)
    names = {t.name for t in copy.tensors}
    assert {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "output.weight"} <= names
    assert all(p.op == "copy" for p in copy.parts)
    assert sum(p.out_bytes for p in copy.parts) == res.data_bytes

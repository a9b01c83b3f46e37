"""What planc holds on the host is what the plan counts: host-path transforms, --verify, plan
decoding, and the scatter table on the device.

Peaks are measured with tracemalloc (numpy's buffers are traced) on tensors of a few MiB, each
larger than one transform chunk (`planc.plan.hostcost.CHUNK_VALUES`), and held to the figures the plan
counts: a transform to its part's output and chunk scratch (its read buffers exist before it
starts), --verify to `planc.plan.verifycost`, decoding to `planc.plan.codec.decode_bound`.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import json  # noqa: E402
import tracemalloc

import ml_dtypes
import numpy as np
import orjson
import pytest
import yaml

from planc.compiler.compile import compile_spec
from planc.base.errors import PlanFormatError
from planc.plan.explain import explain_doc
from planc.plan.hostcost import CHUNK_VALUES
from planc.plan.codec import DECODE_RATIO, _no_duplicates, decode, decode_bound, encode_bytes
from planc.tools.synth_fp4 import FP4Dims, tensors as fp4_tensors
from planc.plan.verifycost import verify_chunk, verify_host_bytes

from conftest import write_st

SLACK = 64 << 10  # interpreter objects beside the counted buffers (dicts, tuples, small arrays)


def _peak(fn, *args):
    tracemalloc.start()
    try:
        out = fn(*args)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _spec(tmp_path, ckpt, rules, host="1GiB", name="s.yaml", **extra):
    doc = {"checkpoint": str(ckpt), "budget": {"host": host},
           "io": {"slot": "256KiB", "slots": 2, "run": "4MiB", "merge_gap": 0}, "rules": rules, **extra}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _bufs(root, p):
    out = []
    for inp in p.inputs:
        buf = np.empty(inp.nbytes, np.uint8)
        with open(os.path.join(root, inp.file), "rb") as f:
            for off, n, rel in inp.segments():
                f.seek(off)
                buf[rel:rel + n] = np.frombuffer(f.read(n), np.uint8)
        out.append(buf)
    return out


def _fp8(rows, cols, block):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((rows, cols), dtype=np.float32) * 2).astype(ml_dtypes.float8_e4m3fn)
    s = (rng.random((-(-rows // block), -(-cols // block))) * 0.01 + 0.001).astype(np.float32)
    return {"w.weight": w, "w.weight_scale_inv": s}


BF16 = ml_dtypes.bfloat16
CASES = {
    # name: (tensors, rules): every tensor a host-path part of a few MiB
    "convert": (lambda: {"a": np.ones((1024, 1024), np.float32).astype(BF16)},
                [{"match": "*", "dtype": "float32", "on": "host"}]),
    "transpose-convert": (lambda: {"a": np.ones((512, 1024), np.float32).astype(BF16)},
                          [{"match": "*", "dtype": "float32", "transpose": True, "on": "host"}]),
    "fp8-block": (lambda: _fp8(1024, 4096, 128),
                  [{"match": "*", "source_dtype": ["F8_E4M3"], "dtype": "bfloat16", "on": "host",
                    "dequantize": {"block": 128}}]),
    # one scale for the whole tensor: the case that held 3.67x the counted bytes in float32 temporaries
    "fp8-per-tensor": (lambda: _fp8(1024, 4096, 4096),
                       [{"match": "*", "source_dtype": ["F8_E4M3"], "dtype": "bfloat16", "on": "host",
                         "dequantize": {"block": 4096}}]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_transform_holds_what_the_part_counts(tmp_path, case):
    from planc.execute.pipeline.hostpath import _host_transform

    make, rules = CASES[case]
    write_st(tmp_path / "ck" / "model.safetensors", make())
    plan = compile_spec(_spec(tmp_path, tmp_path / "ck", rules))
    hosts = [p for p in plan.parts if p.path == "host"]
    assert hosts
    for p in hosts:
        assert p.out_bytes // 4 > CHUNK_VALUES  # more than one chunk: the chunking is what is tested
        bufs = _bufs(plan.checkpoint.root, p)
        out, peak = _peak(_host_transform, p, bufs)
        reads = sum(i.nbytes for i in p.inputs)
        assert len(out) == p.out_bytes
        assert peak <= p.host_bytes - reads, (p.label, peak, p.host_bytes - reads)


@pytest.mark.parametrize("fam", ["mxfp4", "nvfp4"])
def test_fp4_host_transform_holds_what_the_part_counts(tmp_path, fam):
    """FP4 on the host, a transposing one (gpt-oss's gate_up_proj) among them: no second copy of the output."""
    from planc.execute.pipeline.hostpath import _host_transform

    dims = FP4Dims(512, 512, 4, 2, 16, 256, 4, 1) if fam == "mxfp4" else FP4Dims(512, 1024, 4, 2, 16, 256, 0, 1)
    write_st(tmp_path / fam / "model.safetensors", fp4_tensors(fam, dims))
    name = "gpt-oss" if fam == "mxfp4" else "llama-nvfp4"
    doc = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "specs", f"transformers-{name}.yaml")))
    doc["checkpoint"] = str(tmp_path / fam / "model.safetensors")
    doc["rules"][0].pop(True, None)  # PyYAML reads the key `on` as True
    doc["rules"][0]["on"] = "host"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = compile_spec(tmp_path / "s.yaml")
    hosts = [p for p in plan.parts if p.path == "host" and p.out_bytes // 2 > CHUNK_VALUES]
    assert hosts and (fam == "nvfp4" or any(p.op == "dequantize_t" for p in hosts))
    for p in hosts:
        bufs = _bufs(plan.checkpoint.root, p)
        out, peak = _peak(_host_transform, p, bufs)
        assert len(out) == p.out_bytes
        assert peak <= p.host_bytes - sum(i.nbytes for i in p.inputs), (p.label, peak)


# -- --verify ---------------------------------------------------------------------------------------

def test_verify_reads_by_the_budget_and_holds_what_it_counts(tmp_path):
    """A 2 MiB copy and a conversion verified under a 1 MiB budget: 128 KiB reads, not 16 MiB ones."""
    from planc.execute import execute
    from planc.execute.pipeline.verify import verify_model

    write_st(tmp_path / "ck" / "model.safetensors",
             {"big": np.arange(1 << 20, dtype=np.float32).astype(BF16), "small": np.ones(4096, np.float32)})
    plan = compile_spec(_spec(tmp_path, tmp_path / "ck", [{"match": "small", "dtype": "bfloat16"}, {"match": "*"}],
                              host="1MiB"))
    assert plan.fits and verify_chunk(plan) == (1 << 20) // 8
    assert explain_doc(plan)["verify"] == {"chunk_bytes": 1 << 17, "host_bytes": verify_host_bytes(plan)}
    m = execute(plan)
    try:
        res, peak = _peak(verify_model, plan, m)
        assert res["ok"] and res["chunk_bytes"] == 1 << 17 and res["predicted_host_bytes"] == verify_host_bytes(plan)
        assert verify_host_bytes(plan) == 3 * (1 << 17)  # a chunk read, its device copy, the comparison's mask
        assert peak <= verify_host_bytes(plan) + SLACK, peak
    finally:
        m.free()


def test_verify_of_fp8_in_pieces_of_a_row(tmp_path):
    """A per-tensor scale (one block as large as the matrix) and rows longer than the verify's chunk:
    compared a piece of a row at a time, each inside one block, bit-exact."""
    from planc.execute import execute

    from planc.execute.pipeline.verify import _verify_part

    write_st(tmp_path / "ck" / "model.safetensors", _fp8(4, 1 << 17, 1 << 17))
    plan = compile_spec(_spec(tmp_path, tmp_path / "ck", [
        {"match": "*", "source_dtype": ["F8_E4M3"], "dtype": "bfloat16", "on": "host", "dequantize": {"block": 1 << 17}}]))
    m = execute(plan)
    try:
        p = plan.parts[0]
        assert _verify_part(plan.checkpoint.root, p, m._arena, 1 << 16) == (True, p.out_bytes)
        assert _verify_part(plan.checkpoint.root, p, m._arena, 1 << 20) == (True, p.out_bytes)
    finally:
        m.free()


# -- plan decoding ----------------------------------------------------------------------------------

HOSTILE = {
    "lists": b"[" + b"[]," * 200_000 + b"[]]",
    "objects": b"[" + b"{}," * 200_000 + b"{}]",
    "small objects": b"[" + b'{"a":0},' * 100_000 + b"{}]",
    "ints": b"[" + b"1000," * 200_000 + b"1]",
    "strings": b"[" + b'"ab",' * 200_000 + b"1]",
    "floats": b"[" + b"1.5," * 200_000 + b"1]",
    "plan-like": b'{"kind":"planc-plan","format":1,"parts":[' + b"[0,1,2,3]," * 100_000 + b"[0]]}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_decode_bound_holds_both_parsers(name):
    raw = HOSTILE[name]
    _, fast = _peak(orjson.loads, raw)
    _, exact = _peak(lambda r: json.loads(r.decode(), object_pairs_hook=_no_duplicates), raw)
    assert max(fast, exact) <= decode_bound(raw), (fast, exact, decode_bound(raw))


@pytest.mark.parametrize("name", ["lists", "objects", "small objects"])
def test_text_of_tiny_values_is_refused_before_it_is_parsed(name):
    raw = HOSTILE[name]
    with pytest.raises(PlanFormatError) as ei:
        _peak(decode, raw)
    assert ei.value.code == "plan-too-large" and "not a planc plan" in str(ei.value)
    tracemalloc.start()
    try:
        with pytest.raises(PlanFormatError):
            decode(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * len(raw) + SLACK  # a copy of the text at most: no document built


def test_a_real_plan_decodes_within_its_bound(tmp_path):
    write_st(tmp_path / "ck" / "model.safetensors",
             {f"model.layers.{i}.w{i % 3}.weight": np.ones((4, 8), np.float32) for i in range(600)})
    plan = compile_spec(_spec(tmp_path, tmp_path / "ck", [{"match": "*", "dtype": "bfloat16"}]))
    raw = encode_bytes(plan)
    assert decode_bound(raw) <= DECODE_RATIO * len(raw)
    got, peak = _peak(decode, raw)
    assert encode_bytes(got) == raw and peak <= decode_bound(raw), (peak, decode_bound(raw))


# -- the scatter table ------------------------------------------------------------------------------

def test_scatter_table_counts_in_the_device_peak(tmp_path):
    """Experts stacked through the scatter kernel (small slots of many experts each)."""
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "moe", "moe")
    stack = {"match": "model.layers.{L}.mlp.experts.{E}.{W}.weight",
             "stack": {"into": "model.layers.{L}.mlp.experts.{W}", "over": "E"}}
    io = {"workers": 4, "slot": "64KiB", "slots": 2, "run": "64KiB", "merge_gap": "64KiB"}

    def spec(name, budget):
        doc = {"checkpoint": str(tmp_path / "moe"), "budget": budget, "io": io, "rules": [stack, {"match": "*"}]}
        p = tmp_path / name
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        return p

    plan = compile_spec(spec("s.yaml", {"host": "1GiB"}))
    lay = plan.layout
    assert lay.scatter_segments > 0 and plan.totals.scatters > 0
    want = lay.arena_bytes + lay.landing_bytes + lay.staging_bytes + 24 * lay.scatter_segments
    assert lay.device_bytes == want and plan.peak.device_bytes == want
    e = explain_doc(plan)
    assert e["layout"]["scatter_table_bytes"] == 24 * lay.scatter_segments
    assert {"what": "scatter table", "memory": "device", "bytes": 24 * lay.scatter_segments} in e["top_contributors"] \
        or len(e["top_contributors"]) >= 10
    tight = compile_spec(spec("t.yaml", {"host": "1GiB", "device": want - 1}))
    assert not tight.fits and tight.refusal.code == "device-budget" and "scatter table" in tight.refusal.message


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_gguf_host_dequantize_holds_its_output_and_one_chunk(qtype):
    """planc.execute.kernels.gguf_dequant in bounded chunks: the output and one chunk's scratch (planc.plan.hostcost)."""
    from planc.execute.kernels.gguf_dequant import dequantize
    from planc.plan.hostcost import SCRATCH_PER_VALUE
    from planc.manifest.ggml_types import BY_NAME

    t = BY_NAME[qtype]
    numel = 1 << 20
    raw = np.random.default_rng(0).integers(0, 256, numel // t.block * t.block_bytes, dtype=np.uint8)
    with np.errstate(all="ignore"):  # random bytes: NaN and infinite scales among them
        out, peak = _peak(dequantize, raw, qtype, (numel,), "F32")
    assert out.shape == (numel,)
    assert peak <= out.nbytes + CHUNK_VALUES * SCRATCH_PER_VALUE, peak


@pytest.mark.parametrize("quant,unpermute", [("Q8_0", False), ("Q4_K_M", False), ("Q8_0", True)])
def test_gguf_host_part_and_its_verify_hold_what_they_count(tmp_path, quant, unpermute):
    """A GGUF file's quantized tensors dequantized `on: host` in a plan: each part's transform holds at
    most its counted bytes beyond its reads; `--verify` of them (whole rows of blocks, a chunk at a
    time under a small budget) at most what `verifycost` predicts. With q / k unpermuted (a model of
    hidden 1024: heads of 64 rows of 1,088 bytes, more than the 64 KiB chunk holds) the host
    reference writes the rows in transformers' order with no second output, and `--verify` reads
    whole heads."""
    from planc.execute import execute
    from planc.execute.pipeline.hostpath import _host_transform
    from planc.execute.pipeline.verify import verify_model
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant=quant, layers=1, hidden=1024 if unpermute else None)
    rules = [{"match": "*", "dtype": "float32", "on": "host"}]
    if unpermute:
        rules = [{"match": f"blk.0.attn_{x}.weight", "dtype": "float32", "on": "host", "unpermute": True}
                 for x in "qk"] + [{"match": "*", "skip": True}]
    plan = compile_spec(_spec(tmp_path, res.path, rules, host="16MiB"))
    hosts = [p for p in plan.parts if p.op == "gguf" and p.out_bytes // 4 > CHUNK_VALUES]
    assert plan.fits and hosts
    assert any(p.unpermute for p in hosts) == unpermute
    for p in hosts:
        out, peak = _peak(_host_transform, p, _bufs(plan.checkpoint.root, p))
        assert len(out) == p.out_bytes
        assert peak <= p.host_bytes - p.inputs[0].nbytes, (p.label, peak)
    # `--verify` under a budget whose chunk (64 KiB) is less than a tensor's blocks. The model is loaded
    # on the host path (the simulator's kernels take minutes on tensors this size); what verify holds
    # depends on the parts and the budget, not on where they were dequantized.
    m = execute(plan)
    small = plan.with_budget(host_bytes=512 << 10)
    assert verify_chunk(small) == 64 << 10
    assert max(p.inputs[0].nbytes for p in small.parts if p.op == "gguf") > 64 << 10
    try:
        got, peak = _peak(verify_model, small, m)
        assert got["ok"] and peak <= verify_host_bytes(small) + SLACK, (peak, verify_host_bytes(small))
    finally:
        m.free()

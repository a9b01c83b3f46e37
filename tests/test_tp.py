"""Tensor-parallel plans: each rank reads only its bytes, and the ranks together rebuild every tensor.

Executed under the CUDA simulator; the reference is built here with numpy from the arrays written.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from planc.face.cli import main  # noqa: E402
from planc.plan.explain import explain_doc
from planc.compiler.compile import compile_all_ranks, compile_spec  # noqa: E402
from planc.base.errors import BindError  # noqa: E402
from planc.execute import execute  # noqa: E402

BF16 = ml_dtypes.bfloat16
H, KV, I, V, E = 16, 8, 32, 24, 8


def _arr(rng, shape, dtype=BF16):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp")
    rng = np.random.default_rng(7)
    t = {
        "embed.weight": _arr(rng, (V, H)),
        "norm.weight": _arr(rng, (H,), np.float32),
        "l.0.attn.q_proj.weight": _arr(rng, (H, H)),
        "l.0.attn.k_proj.weight": _arr(rng, (KV, H)),
        "l.0.attn.v_proj.weight": _arr(rng, (KV, H)),
        "l.0.attn.o_proj.weight": _arr(rng, (H, H)),
        "l.0.mlp.up_proj.weight": _arr(rng, (I, H)),
        "l.0.mlp.down_proj.weight": _arr(rng, (H, I)),
    }
    for e in range(E):
        t[f"l.0.experts.{e}.w1.weight"] = _arr(rng, (8, H))
        t[f"l.0.experts.{e}.w2.weight"] = _arr(rng, (H, 8))
    save_file(t, d / "m.safetensors")
    return d, t


RULES = [
    {"match": "l.{L}.attn.{P}.weight", "split": {"dim": 0},
     "fuse": {"into": "l.{L}.attn.qkv_proj.weight", "over": "P", "order": ["q_proj", "k_proj", "v_proj"]}},
    {"match": "l.*.attn.o_proj.weight", "split": {"dim": 1}},
    {"match": "l.*.mlp.up_proj.weight", "split": {"dim": 0}, "dtype": "float16"},
    {"match": "l.*.mlp.down_proj.weight", "split": {"dim": 1}},
    {"match": "l.{L}.experts.{E}.w1.weight", "split": {"dim": 0},
     "stack": {"into": "l.{L}.experts.w1", "over": "E"}},
    {"match": "l.{L}.experts.{E}.w2.weight", "split": {"dim": 2},
     "stack": {"into": "l.{L}.experts.w2", "over": "E"}},
    {"match": "embed.weight", "split": {"dim": 0}, "on": "host", "dtype": "float32"},
    {"match": "*"},
]


def _spec(d, n, rules=RULES, io=None, name="tp.yaml"):
    doc = {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"}, "tensor_parallel": {"size": n},
           "io": io or {"workers": 4, "slot": "8KiB", "slots": 4, "run": "16KiB", "merge_gap": "1KiB"},
           "rules": rules}
    p = d / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _expected_full(t):
    """The tensors as the spec asks for them, on one rank."""
    qkv = np.concatenate([t["l.0.attn.q_proj.weight"], t["l.0.attn.k_proj.weight"], t["l.0.attn.v_proj.weight"]])
    return {
        "l.0.attn.qkv_proj.weight": qkv,
        "l.0.attn.o_proj.weight": t["l.0.attn.o_proj.weight"],
        "l.0.mlp.up_proj.weight": t["l.0.mlp.up_proj.weight"].astype(np.float32).astype(np.float16),
        "l.0.mlp.down_proj.weight": t["l.0.mlp.down_proj.weight"],
        "l.0.experts.w1": np.stack([t[f"l.0.experts.{e}.w1.weight"] for e in range(E)]),
        "l.0.experts.w2": np.stack([t[f"l.0.experts.{e}.w2.weight"] for e in range(E)]),
        "embed.weight": t["embed.weight"].astype(np.float32),
        "norm.weight": t["norm.weight"],
    }


def _rank_expected(t, n, r):
    """Rank r's tensors, from numpy slicing of the full ones (q, k, v each split before fusing)."""
    def part(a, dim):
        return np.array_split(a, n, axis=dim)[r]
    full = _expected_full(t)
    qkv = np.concatenate([part(t[f"l.0.attn.{p}_proj.weight"], 0) for p in "qkv"])
    return {
        "l.0.attn.qkv_proj.weight": qkv,
        "l.0.attn.o_proj.weight": part(full["l.0.attn.o_proj.weight"], 1),
        "l.0.mlp.up_proj.weight": part(full["l.0.mlp.up_proj.weight"], 0),
        "l.0.mlp.down_proj.weight": part(full["l.0.mlp.down_proj.weight"], 1),
        "l.0.experts.w1": part(full["l.0.experts.w1"], 0),
        "l.0.experts.w2": part(full["l.0.experts.w2"], 2),
        "embed.weight": part(full["embed.weight"], 0),
        "norm.weight": full["norm.weight"],
    }


def _load(plan):
    m = execute(plan, verify=True)
    try:
        assert m.report["verify"]["ok"], m.report["verify"]
        for k in ("requests", "copies", "kernels"):
            assert m.report[k]["issued"] == m.report[k]["predicted"], k
        return {name: m[name].to_host().copy() for name in m}
    finally:
        m.free()


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_ranks_rebuild_every_tensor(ckpt, n):
    d, t = ckpt
    plans = compile_all_ranks(_spec(d, n, name=f"tp{n}.yaml"))
    assert [p.tensor_parallel for p in plans] == [(r, n) for r in range(n)]
    got = [_load(p) for p in plans]
    for r in range(n):
        want = _rank_expected(t, n, r)
        assert sorted(got[r]) == sorted(want)
        for name, a in want.items():
            assert got[r][name].shape == a.shape, (name, r)
            assert np.array_equal(_bits(got[r][name]), _bits(a)), (name, r)
    # the ranks together rebuild the full tensors (fused qkv: per part)
    full = _expected_full(t)
    for name, dim in [("l.0.attn.o_proj.weight", 1), ("l.0.mlp.up_proj.weight", 0), ("l.0.mlp.down_proj.weight", 1),
                      ("l.0.experts.w1", 0), ("l.0.experts.w2", 2), ("embed.weight", 0)]:
        assert np.array_equal(_bits(np.concatenate([g[name] for g in got], axis=dim)), _bits(full[name])), name


@pytest.mark.parametrize("n", [2, 4, 8])
def test_each_rank_reads_only_its_bytes(ckpt, n):
    d, t = ckpt
    plans = compile_all_ranks(_spec(d, n, name=f"tpb{n}.yaml"))
    replicated = t["norm.weight"].nbytes
    split_total = sum(a.nbytes for k, a in t.items() if k != "norm.weight")
    for p in plans:
        assert p.totals.payload_bytes == replicated + split_total // n
    # the row-parallel inputs are strided: one record (base, stride, length, count) per input, shown by explain
    o = [i for part in plans[0].parts if part.tensor == "l.0.attn.o_proj.weight" for i in part.inputs]
    assert o[0].count == H and o[0].seg == H // n * 2 and o[0].stride == H * 2
    assert {r["method"] for r in explain_doc(plans[0])["strided_reads"]} <= {"mapped", "rows"}


@pytest.mark.parametrize("how", ["mapped", "rows"])
def test_row_parallel_slices_by_mapped_reads_or_whole_rows(ckpt, how):
    d, t = ckpt
    rules = [{"match": "l.*.mlp.down_proj.weight", "split": {"dim": 1}}, {"match": "*", "skip": True}]
    plans = compile_all_ranks(_spec(d, 2, rules, {"slot": "64KiB", "strided": how}, f"s-{how}.yaml"))
    for p in plans:
        assert p.totals.payload_bytes == H * I and p.totals.scatters == 0
        reqs = [q for r in p.runs for q in r.requests]
        if how == "mapped":  # one strided record carries every row: only the rank's bytes are read
            assert p.totals.read_bytes == H * I and all(q.stride == I * 2 and q.count == H for q in reqs)
            assert len(reqs) == 1 and p.layout.map_bytes > 0
        else:  # whole rows read, one 2-D copy per request sends the slice
            assert p.totals.read_bytes >= H * I * 2 and not any(q.stride for q in reqs)
            assert any(c.rows > 1 and c.pitch == I * 2 for q in reqs for c in q.copies)
            assert p.layout.map_bytes == 0
    got = [_load(p)["l.0.mlp.down_proj.weight"] for p in plans]
    assert np.array_equal(_bits(np.concatenate(got, axis=1)), _bits(t["l.0.mlp.down_proj.weight"]))
    assert [r["method"] for r in explain_doc(plans[0])["strided_reads"]] == [how]


@pytest.mark.parametrize("window", [None, 4096, 100_000])
def test_mapped_windows_are_what_the_plan_counts(ckpt, monkeypatch, window):
    """`layout.map_bytes` is the largest windows of as many strided requests as may read at once, each
    what `costmodel.window_bytes` says its request maps at the plan's `io.map_window_bytes`; every
    mapping the reader makes during the load is within its request's window (a small slice is not
    counted as a full window)."""
    import mmap as mmap_mod

    from planc.plan import costs as costmodel
    from planc.execute.io import reader as reader_mod

    d, t = ckpt
    rules = [{"match": "l.*.mlp.down_proj.weight", "split": {"dim": 1}},
             {"match": "l.*.attn.o_proj.weight", "split": {"dim": 1}}, {"match": "*", "skip": True}]
    io = {"slot": "8KiB", "strided": "mapped", "workers": 1, **({"map_window": window} if window else {})}
    plan = compile_spec(_spec(d, 2, rules, io, f"w{window}.yaml"), 0)
    assert plan.io.map_window_bytes == (window or costmodel.MAP_WINDOW)
    reqs = [q for r in plan.runs for q in r.requests if q.stride]
    wins = {(q.offset, q.count): costmodel.window_bytes(q.length, q.stride, q.count, plan.io.map_window_bytes)
            for q in reqs}
    assert len(reqs) >= 2
    assert plan.layout.map_bytes == max(wins.values())  # one reader: one window at a time
    assert plan.layout.map_bytes < 2 * (plan.io.map_window_bytes + costmodel.PAGE) or window == 4096
    maps = []
    real = mmap_mod.mmap

    class Watched(real):
        def __new__(cls, fd, length, *a, **k):
            maps.append(-(-length // costmodel.PAGE) * costmodel.PAGE)
            return real.__new__(cls, fd, length, *a, **k)

    monkeypatch.setattr(reader_mod.mmap, "mmap", Watched)
    by_request = {}

    class Recording(reader_mod.Reader):  # the windows each strided read mapped
        def read_strided(self, rel, offset, length, stride, count, buf):
            before = len(maps)
            n = super().read_strided(rel, offset, length, stride, count, buf)
            by_request[(offset, count)] = maps[before:]
            return n

    from execute_support import reader_of, use_parts

    use_parts(monkeypatch, reader=reader_of(Recording))
    _load(plan)
    monkeypatch.undo()
    assert set(by_request) == set(wins)
    for key, got in by_request.items():
        assert got and max(got) <= wins[key], (key, got, wins[key])
    # the bound is tight: at most the page that a window's first byte may start into
    assert max(max(g) for g in by_request.values()) >= max(wins.values()) - costmodel.PAGE


def test_a_plan_claiming_full_windows_still_loads_and_one_claiming_less_is_refused(ckpt):
    """Plans written when every strided request counted a full window are admitted as they are (they
    claim more, never less); a plan claiming less than its windows is refused, naming the field."""
    from planc.base.errors import PlanFormatError
    from planc.plan.codec import decode, encode

    d, t = ckpt
    rules = [{"match": "l.*.mlp.down_proj.weight", "split": {"dim": 1}}, {"match": "*", "skip": True}]
    plan = compile_spec(_spec(d, 2, rules, {"slot": "8KiB", "strided": "mapped"}, "claim.yaml"), 0)
    doc = json.loads(encode(plan))
    exact = doc["layout"]["map_bytes"]
    n = sum(1 for r in plan.runs for q in r.requests if q.stride)
    full = min(4, plan.io.workers, n) * (plan.io.map_window_bytes + 4096)
    doc["layout"]["map_bytes"] = full
    doc["peak"]["host_bytes"] += full - exact  # the recorded peak is the replay's, with what the plan claims
    old = decode(json.dumps(doc))
    assert old.layout.map_bytes == full > exact and old.peak.host_bytes > plan.peak.host_bytes
    for bad in (exact - 1, full + 1):
        doc["layout"]["map_bytes"] = bad
        doc["peak"]["host_bytes"] = plan.peak.host_bytes + bad - exact
        with pytest.raises(PlanFormatError, match="layout.map_bytes"):
            decode(json.dumps(doc))


def test_uneven_split_names_the_tensor_and_padding_zero_fills(ckpt):
    d, t = ckpt
    rules = [{"match": "embed.weight", "split": {"dim": 0}}, {"match": "*", "skip": True}]
    with pytest.raises(BindError) as ei:
        compile_spec(_spec(d, 5, rules, name="u.yaml"), 0)
    assert ei.value.code == "split-uneven" and "embed.weight" in ei.value.message and "pad" in ei.value.message
    rules[0]["split"]["pad"] = True
    plans = compile_all_ranks(_spec(d, 5, rules, name="p.yaml"))
    got = [_load(p)["embed.weight"] for p in plans]
    per = -(-V // 5)
    assert all(g.shape == (per, H) for g in got)
    rebuilt = np.concatenate(got)
    assert np.array_equal(_bits(rebuilt[:V]), _bits(t["embed.weight"]))
    assert not _bits(rebuilt[V:]).any()


def test_fp8_dequantize_split_follows_blocks(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    s = (rng.random((2, 2)) + 0.5).astype(np.float32)
    save_file({"w": w, "w_scale_inv": s}, tmp_path / "m.safetensors")
    rules = [{"match": "w", "dequantize": {"block": 4}, "split": {"dim": 1}}]
    full = (w.astype(np.float32) * np.repeat(np.repeat(s, 4, 0), 4, 1)).astype(BF16)
    got = [_load(p)["w"] for p in compile_all_ranks(_spec(tmp_path, 2, rules))]
    assert np.array_equal(_bits(np.concatenate(got, axis=1)), _bits(full))
    with pytest.raises(BindError) as ei:
        compile_spec(_spec(tmp_path, 4, rules, name="bad.yaml"), 0)
    assert ei.value.code == "split-blocks" and "w" in ei.value.message


def test_cli_rank_all_and_env(ckpt, tmp_path, capsys, monkeypatch):
    d, _ = ckpt
    spec = _spec(d, 4, name="cli.yaml")
    assert main(["compile", str(spec), "--rank", "all", "-o", str(tmp_path / "plans")]) == 0
    files = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert files == [f"rank-{r}.json" for r in range(4)]
    capsys.readouterr()
    assert main(["explain", str(spec), "--rank", "all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["totals"]["read_bytes"] > 0 for r in doc["ranks"]] == [True] * 4
    capsys.readouterr()
    assert main(["compile", str(spec), "--rank", "all"]) == 0  # no -o: every rank compiled, nothing written
    assert "ranks" in capsys.readouterr().out and sorted(p.name for p in (tmp_path / "plans").iterdir()) == files
    tight = _spec(d, 4, name="tight.yaml")
    tight.write_text(tight.read_text().replace("host: 64MiB", "host: 4KiB"))
    assert main(["compile", str(tight), "--rank", "all"]) == 3
    o, e = capsys.readouterr()
    # the rank table is output (stdout); stderr holds the refusal's one line alone
    assert "ranks" in o and "REFUSED" in o and len(e.strip().splitlines()) == 1 and "refused" in e
    assert main(["compile", str(spec)]) == 2  # no rank, no $RANK
    assert "tensor_parallel.size is 4" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert main(["run", str(tmp_path / "plans" / "rank-2.json"), "--json", "--verify"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tensor_parallel"] == {"rank": 2, "size": 4} and rep["verify"]["ok"]
    assert main(["run", str(tmp_path / "plans" / "rank-1.json")]) == 2  # RANK=2 but the plan is rank 1
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["compile", str(spec)]) == 2
    # a saved plan is held to the launcher's variables as its spec is
    plan = str(tmp_path / "plans" / "rank-2.json")
    capsys.readouterr()
    assert main(["explain", plan]) == 2 and "WORLD_SIZE=3 but" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")
    for bad in ("\u0662", "-1", "2.0", " "):  # an Arabic-Indic two, a negative, a float, blank
        monkeypatch.setenv("RANK", bad)
        assert main(["explain", plan]) == 2 and "RANK=" in capsys.readouterr().err
    monkeypatch.delenv("RANK")
    assert main(["explain", plan, "--rank", "02"]) == 0  # the rank as an integer, as for a spec
    capsys.readouterr()
    assert main(["explain", plan, "--rank", "-1"]) == 2 and "outside tensor_parallel.size 4" in capsys.readouterr().err


def test_a_json_spec_with_a_plan_like_key_is_reported_as_the_spec_it_is(ckpt, tmp_path, capsys):
    d, _ = ckpt
    js = d / "typo.json"
    js.write_text(json.dumps({"checkpoint": "m.safetensors", "budget": {"host": "64MiB"}, "format": 1,
                              "rules": [{"match": "*"}]}))
    for cmd in ("explain", "run"):
        assert main([cmd, str(js)]) == 2
        assert "format: unknown key [spec-invalid]" in capsys.readouterr().err
    js.write_text(json.dumps({"kind": "nope", "runs": []}))  # a damaged plan stays a plan error
    assert main(["explain", str(js)]) == 2 and "[plan-kind]" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["mapped", "rows"])
def test_row_slices_unaligned_straddling_slots_one_element_per_row_and_padding(tmp_path, how):
    """Rows of 2,000 bytes at an offset that is no multiple of 4 KiB, slots of 4 KiB (rows cut by
    slot boundaries, as rows; 8 segments a request, mapped), a slice of one element per row, a
    padded dim-0 split beside them and a converted slice: every rank bit-exact, copies as planned."""
    rng = np.random.default_rng(3)
    t = {"a.head": _arr(rng, (7,), np.float32),
         "b.wide": rng.standard_normal((37, 1000)).astype(np.float16),
         "c.narrow": rng.standard_normal((50, 4)).astype(np.float16),
         "d.padded": _arr(rng, (10, 3), np.float32),
         "e.conv": _arr(rng, (9, 64))}
    save_file(t, str(tmp_path / "m.safetensors"))
    rules = [{"match": "b.wide", "split": {"dim": 1}}, {"match": "c.narrow", "split": {"dim": 1}},
             {"match": "d.padded", "split": {"dim": 0, "pad": True}},
             {"match": "e.conv", "split": {"dim": 1}, "dtype": "float16"}, {"match": "*"}]
    io = {"workers": 3, "slot": "4KiB", "slots": 3, "run": "16KiB", "strided": how}
    plans = compile_all_ranks(_spec(tmp_path, 4, rules, io, f"u-{how}.yaml"))
    got = [_load(p) for p in plans]
    assert plans[0].totals.scatters == 0
    if how == "rows":
        assert any(c.rows > 1 for p in plans for r in p.runs for q in r.requests for c in q.copies)
    else:
        assert all(any(q.stride for r in p.runs for q in r.requests) for p in plans)
    for name in ("b.wide", "c.narrow"):
        assert np.array_equal(_bits(np.concatenate([g[name] for g in got], axis=1)), _bits(t[name])), name
    e = np.concatenate([g["e.conv"] for g in got], axis=1)
    assert np.array_equal(e, t["e.conv"].astype(np.float32).astype(np.float16))
    d = np.concatenate([g["d.padded"] for g in got])
    assert np.array_equal(_bits(d[:10]), _bits(t["d.padded"])) and not d[10:].any()


def test_padding_a_later_dim_is_refused_on_every_rank(tmp_path):
    """Rank 0 of 3 needs no padding of a 1,000-wide dim-1 split (334, 334, 332): it is refused all the
    same, so that every rank's compile gives the same answer."""
    save_file({"w": np.zeros((4, 1000), np.float16)}, str(tmp_path / "m.safetensors"))
    spec = _spec(tmp_path, 3, [{"match": "w", "split": {"dim": 1, "pad": True}}], name="pad1.yaml")
    for rank in range(3):
        with pytest.raises(BindError) as ei:
            compile_spec(spec, rank)
        assert ei.value.code == "split-pad" and "dim 1" in ei.value.message


def test_a_plan_without_its_mapping_settings_is_read_as_it_was_run(ckpt):
    """A format-3 plan written before `io` carried `map_window_bytes` and `map_lanes` was run with 8 MiB
    windows on 4 lanes, and counted its windows so: it is read with those, and its reader maps no more.
    One of the two alone, or a value out of range, is refused naming the field."""
    from planc.plan import costs as costmodel
    from planc.base.errors import PlanFormatError
    from planc.plan.codec import decode, encode

    d, t = ckpt
    rules = [{"match": "l.*.mlp.down_proj.weight", "split": {"dim": 1}}, {"match": "*", "skip": True}]
    plan = compile_spec(_spec(d, 2, rules, {"slot": "8KiB", "strided": "mapped", "map_window": "8MiB"}, "old.yaml"), 0)
    doc = json.loads(encode(plan))
    assert doc["io"]["map_window_bytes"] == 8 << 20 and doc["io"]["map_lanes"] == costmodel.MAP_LANES
    old = {**doc, "io": {k: v for k, v in doc["io"].items() if k not in ("map_window_bytes", "map_lanes")}}
    got = decode(json.dumps(old))
    assert (got.io.map_window_bytes, got.io.map_lanes) == (8 << 20, 4) and got.layout == plan.layout
    lone = {**doc, "io": {k: v for k, v in doc["io"].items() if k != "map_lanes"}}
    with pytest.raises(PlanFormatError, match="io: missing map_lanes"):
        decode(json.dumps(lone))
    for key, bad in (("map_window_bytes", 0), ("map_window_bytes", 1 << 31), ("map_lanes", 0), ("map_lanes", 65),
                     ("map_lanes", 2.0)):
        with pytest.raises(PlanFormatError, match=f"io.{key}"):
            decode(json.dumps({**doc, "io": {**doc["io"], key: bad}}))
    # map_bytes beyond what the plan's lanes can map at once is refused
    over = {**doc, "io": {**doc["io"], "map_lanes": 1},
            "layout": {**doc["layout"], "map_bytes": (8 << 20) + costmodel.MAP_PAGE + 1}}
    with pytest.raises(PlanFormatError, match="layout.map_bytes"):
        decode(json.dumps(over))


def test_a_budget_too_small_for_the_windows_names_the_window_and_lanes(tmp_path):
    """A host budget the ring fits but not the ring with its mapped windows is refused at compile,
    naming io.map_window and the lesser of io.map_lanes and io.workers with their values; a smaller
    window then fits."""
    from safetensors.numpy import save_file

    from planc.plan import costs as costmodel

    save_file({"w.weight": np.arange(64 * 2048, dtype=np.float32).reshape(64, 2048)}, str(tmp_path / "m.safetensors"))
    rules = [{"match": "w.weight", "split": {"dim": 1}}]  # 64 segments of 4 KiB, 8 KiB apart
    io = {"workers": 4, "slot": "256KiB", "slots": 1, "run": "1MiB", "strided": "mapped", "map_window": "1MiB"}
    fits = compile_spec(_spec(tmp_path, 2, rules, io, "room.yaml"), 0)
    assert fits.fits and fits.layout.map_bytes > 64 * 4096
    doc = yaml.safe_load((tmp_path / "room.yaml").read_text())
    doc["budget"]["host"] = fits.peak.host_bytes - 1
    (tmp_path / "tight.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = compile_spec(tmp_path / "tight.yaml", 0)
    assert not plan.fits and plan.refusal.code == "host-budget"
    assert f"io.map_window, now {1 << 20:,} bytes" in plan.refusal.message
    assert "io.workers, now 4" in plan.refusal.message  # 4 workers, 4 lanes: the workers are what count
    lanes = {**doc, "io": {**doc["io"], "workers": 8, "map_lanes": 2}}
    (tmp_path / "lanes.yaml").write_text(yaml.safe_dump(lanes))
    assert "io.map_lanes, now 2" in compile_spec(tmp_path / "lanes.yaml", 0).refusal.message
    doc["io"]["map_window"] = "4KiB"
    (tmp_path / "tight.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    small = compile_spec(tmp_path / "tight.yaml", 0)
    assert small.fits and small.layout.map_bytes == 2 * costmodel.MAP_PAGE


@pytest.mark.parametrize("how", ["mapped", "rows"])
def test_a_rank_s_digest_verified_load_hashes_the_leaves_its_rows_lie_in(ckpt, tmp_path, how):
    """A rank reads strided slices (mapped or as whole rows) and a host-path part: every leaf it
    touches is hashed whole by one owner (the other ranks' bytes read from the file), the model is
    exact, and a flipped byte in a row-parallel weight's bytes is caught."""
    import shutil

    from planc.base.errors import DigestError
    from planc.manifest import digest as dg
    from planc.manifest import digestcheck as dgc

    d, t = ckpt
    root = tmp_path / "ck"
    root.mkdir()
    shutil.copy(d / "m.safetensors", root / "m.safetensors")
    io = {"workers": 4, "slot": "8KiB", "slots": 4, "run": "16KiB", "merge_gap": "1KiB", "strided": how}
    spec = _spec(root, 2, io=io, name=f"dg-{how}.yaml")
    plan = compile_spec(spec, 1)
    digest = tmp_path / "m.digest.json"
    digest.write_bytes(dg.encode(dg.make_digest(root, extent_bytes=64 << 10)))
    keys = {k[0] for k in dgc.assign(plan, 64 << 10, 64 << 10)[0]}
    assert "p" in keys and ("s" in keys) == (how == "mapped")  # host-path reads; strided requests when mapped
    m = execute(plan, digest=str(digest))
    try:
        rep = m.report["digest"]
        assert rep["ok"] and rep["fill_bytes"] == dgc.coverage(plan, 64 << 10)["fill_bytes"] > 0
        got = {name: m[name].to_host().copy() for name in m}
    finally:
        m.free()
    for name, a in _rank_expected(t, 2, 1).items():
        assert np.array_equal(_bits(got[name]), _bits(a)), name
    from planc.manifest import read_manifest

    w = next(x for x in read_manifest(root / "m.safetensors").tensors if x.name == "l.0.mlp.down_proj.weight")
    data = bytearray((root / "m.safetensors").read_bytes())
    data[w.start + 3] ^= 0x08
    (root / "m.safetensors").write_bytes(bytes(data))
    with pytest.raises(DigestError) as e:
        execute(compile_spec(spec, 1), digest=str(digest))
    assert e.value.code == "digest-mismatch"

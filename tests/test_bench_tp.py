"""bench/tp_compile.py and bench/tp.py: the compile bench end to end on its quick models, the GPU
bench's pure parts (diskstats, targets, summary) on synthetic records, and one tiny load of each of
its kinds (a single process, a group at a barrier) under the CUDA simulator."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def _module(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tpc():
    return _module("tp_compile")


@pytest.fixture(scope="module")
def tp():
    return _module("tp")


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


# --------------------------------------------------------------------------- tp_compile.py


def test_hub_names_and_shapes(tpc):
    m = tpc.MODELS
    llama = dict((n, s) for n, _, s in tpc.tensors(tpc.quick(m["llama3-70b"])))
    assert llama["model.layers.1.self_attn.k_proj.weight"] == (1024, 8192)
    assert llama["model.layers.0.mlp.down_proj.weight"] == (8192, 28672)
    mix = dict((n, s) for n, _, s in tpc.tensors(tpc.quick(m["mixtral-8x7b"])))
    assert mix["model.layers.0.block_sparse_moe.experts.3.w2.weight"] == (4096, 14336)
    assert mix["model.layers.0.block_sparse_moe.gate.weight"] == (4, 4096)
    qwen = dict((n, s) for n, _, s in tpc.tensors(tpc.quick(m["qwen3-30b-a3b"])))
    assert qwen["model.layers.1.self_attn.q_proj.weight"] == (4096, 2048)
    assert qwen["model.layers.1.self_attn.k_norm.weight"] == (128,)
    assert qwen["model.layers.0.mlp.experts.0.down_proj.weight"] == (2048, 768)
    assert qwen["lm_head.weight"] == (151936, 2048)
    full = tpc.tensors(m["qwen3-30b-a3b"])
    assert len(full) == 3 + 48 * (8 + 1 + 3 * 128)  # 18,867 tensors, as the Hub index lists


def test_targets_from_rows(tpc):
    base = {"read_bytes": 100, "payload_bytes": 100, "plan_bytes": 1000, "compile_s": 1.0}
    rows = [{"model": "m", "tp": 1, "rank": 0, **base},
            {"model": "m", "tp": 2, "rank": 0, **base, "read_bytes": 60, "payload_bytes": 50, "plan_bytes": 1400},
            {"model": "m", "tp": 2, "rank": 1, **base, "read_bytes": 150, "payload_bytes": 50, "compile_s": 1.2},
            {"model": "m", "tp": 4, "rank": 0, "error": "boom"}]
    got = {(c["tp"], c["target"]): c for c in tpc.evaluate(rows)}
    assert got[(2, "read / payload")]["worst"] == 3.0 and not got[(2, "read / payload")]["ok"]
    assert got[(2, "plan size / TP 1")]["ok"] and got[(2, "compile s / TP 1")]["ok"]
    assert not got[(4, "compiles")]["ok"]
    assert tpc.ranks_of(8, "ends") == [0, 7] and tpc.ranks_of(2, "ends") == [0, 1]


def test_quick_run(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH / "tp_compile.py"), str(tmp_path), "--quick",
                        "--models", "llama3-70b,qwen3-30b-a3b"],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "| llama3-70b-quick | 2 | 1 |" in p.stdout and "targets:" in p.stdout
    lines = [json.loads(x) for x in (tmp_path / "tp_compile.jsonl").read_text().splitlines()]
    runs = [x for x in lines if "summary" not in x]
    assert len(runs) == 2 * 3  # two models, TP 1 (one rank) and TP 2 (two ranks), one repeat
    for r in runs:
        assert r["fits"] and r["read_bytes"] >= r["payload_bytes"] > 0 and r["plan_bytes"] > 0
    tp1 = [r for r in runs if r["tp"] == 1 and r["model"] == "llama3-70b-quick"][0]
    assert tp1["read_bytes"] < 1.001 * tp1["payload_bytes"]  # one rank reads the checkpoint (requests aligned)
    halves = [r["payload_bytes"] for r in runs if r["tp"] == 2 and r["model"] == "llama3-70b-quick"]
    assert halves[0] == halves[1] < tp1["payload_bytes"]
    assert {c["target"] for c in lines[-1]["summary"]} == {"read / payload", "plan size / TP 1", "compile s / TP 1"}
    assert not list((tmp_path / "plans").iterdir())  # plans removed once measured
    spec = (tmp_path / "qwen3-30b-a3b-quick.tp2.yaml").read_text()
    assert "tensor_parallel: {size: 2}" in spec and "experts.*.down_proj.weight" in spec


# --------------------------------------------------------------------------- tp.py, pure parts

DISKSTATS = """\
 253       0 vda 5000 10 800000 100 0 0 0 0 0 0 0
 253       1 vda1 4000 10 700000 90 0 0 0 0 0 0 0
   7       0 loop0 10 0 80 0 0 0 0 0 0 0 0
 259       0 nvme0n1 100 0 2000 1 0 0 0 0 0 0 0
"""


def test_diskstats(tp, tmp_path):
    before = tp.parse_diskstats(DISKSTATS)
    assert before == {"vda": 800000, "vda1": 700000, "loop0": 80, "nvme0n1": 2000}
    sys_block = tmp_path / "block"
    for n in ("vda", "loop0", "nvme0n1"):
        (sys_block / n).mkdir(parents=True)
    disks = tp.whole_disks(list(before), sys_block)
    assert disks == ["nvme0n1", "vda"]  # not the partition, not the loop device
    after = dict(before, vda=before["vda"] + 2048, vda1=before["vda1"] + 2048, nvme0n1=2002)
    assert tp.disk_read_bytes(before, after, disks) == (2048 + 2) * 512
    assert tp.parse_diskstats("garbage\n\n") == {}


def _load(case, tp_, rank, mode, *, verify=False, gbs=20.0, growth=1.0, issued=10):
    payload = 15 << 30 if case == "whole" else (15 << 30) // tp_
    return {"case": case, "tp": tp_, "rank": rank, "mode": mode, "verify": verify, "gb_per_s": gbs,
            "payload_bytes": payload, "bytes_read": {"measured": payload, "predicted": payload},
            "requests": {"issued": issued, "predicted": 10}, "copies": {"issued": 12, "predicted": 12},
            "plan_requests": 10, "plan_copies": 12, "host_growth_bytes": int(growth * 2**28),
            "host_predicted_bytes": 2**28, **({"verify_ok": True} if verify else {})}


def _group(case, tp_, mode, wall, *, rep=0, disk=None, verify=False):
    payload = 15 << 30 if case != "alone" else (15 << 30) // tp_
    return {"case": case, "tp": tp_, "mode": mode, "rep": rep, "verify": verify, "load_wall_s": wall,
            "process_wall_s": wall + 3, "gb_per_s": payload / wall / 1e9, "payload_bytes": payload,
            "disk_bytes": disk}


def test_targets_from_records(tp):
    ck = 15 << 30
    groups = [_group("whole", 1, "warm", w, rep=k) for k, w in enumerate((0.70, 0.69, 0.75))]
    groups += [_group("whole", 1, "warm", 9.0, verify=True)]  # a --verify run is not timed
    groups += [_group("alone", 8, "warm", w, rep=k) for k, w in enumerate((0.20, 0.21, 0.19))]
    groups += [_group("all", 8, "warm", w, rep=k) for k, w in enumerate((1.20, 1.00, 1.10))]
    groups += [_group("all", 8, "cold", 20.0, disk=int(3.1 * ck))]
    groups += [_group("whole", 1, "cold", 9.0, disk=ck + (1 << 20))]
    med = tp.medians(groups)
    assert med[("whole", 1, "warm")]["load_wall_s"] == 0.70 and med[("whole", 1, "warm")]["n"] == 3
    loads = [_load("whole", 1, 0, "warm"), _load("all", 8, 3, "warm", growth=1.08),
             _load("alone", 8, 0, "warm", verify=True)]
    checks = {c["target"]: c for c in tp.evaluate(groups, loads, ck)}
    alone = checks["alone tp8 warm GB/s / whole"]
    assert alone["ok"] is False and alone["value"] == pytest.approx((0.70 / 0.20) / 8)  # 0.44 of the whole's pace
    assert checks["all tp8 warm load wall / whole"]["value"] == pytest.approx(1.10 / 0.70)
    assert not checks["all tp8 warm load wall / whole"]["ok"]
    assert not checks["all tp8 cold disk bytes / checkpoint"]["ok"]
    assert checks["whole tp1 cold disk bytes / checkpoint"]["ok"]
    host = checks["host growth / predicted (worst load)"]
    assert not host["ok"] and host["what"] == "all tp8 rank 3 warm"
    assert checks["requests and copies issued = plan's"]["ok"] and checks["--verify bit-exact"]["ok"]
    loads.append(_load("alone", 8, 0, "cold", issued=11))
    checks = {c["target"]: c for c in tp.evaluate(groups, loads, ck)}
    assert not checks["requests and copies issued = plan's"]["ok"]
    text = "\n".join(tp.summary_lines(groups, loads, tp.evaluate(groups, loads, ck), ["a note"]))
    assert "| whole | 1 | warm | 0.700 |" in text and "FAIL" in text and "note: a note" in text
    assert text.index("| whole | 1 | warm") < text.index("| alone | 8 | warm") < text.index("| all | 8 | warm")


def test_nothing_measured_fails(tp):
    assert tp.evaluate([], [], 1) == []
    assert "targets: 0 of 0 met: FAIL" in "\n".join(tp.summary_lines([], [], [], []))
    failed = [dict(_group("all", 8, "warm", 1.0), error="rank 3: rc 1")]
    assert [c["ok"] for c in tp.evaluate(failed, [], 1)] == [False]


def test_arguments_and_schedule(tp, tmp_path):
    a = tp.parse_args([str(tmp_path), str(tmp_path / "out")])
    assert (a.cases, a.tp, a.group_tp, a.modes, a.repeat) == (["whole", "alone", "all"], [2, 4, 8], 8,
                                                              ["warm", "cold"], 3)
    assert tp.plan_sets(a) == [("whole", 1, [0]), ("alone", 2, [0]), ("alone", 4, [0]), ("alone", 8, [0]),
                               ("all", 8, list(range(8)))]
    runs = tp.schedule(a)
    assert runs[0] == ("warm", 0, True) and runs[1:4] == [("warm", k, False) for k in range(3)]
    assert runs[-1] == ("cold", 2, False) and len(runs) == 7
    a = tp.parse_args([str(tmp_path), str(tmp_path), "--cases", "all", "--modes", "cold", "--no-verify",
                       "--io", "merge_gap=64KiB,slots=8"])
    assert tp.schedule(a) == [("cold", k, False) for k in range(3)] and a.io == {"merge_gap": "64KiB", "slots": 8}
    for bad in (["--cases", "most"], ["--modes", "hot"], ["--repeat", "0"]):
        with pytest.raises(SystemExit):
            tp.parse_args([str(tmp_path), str(tmp_path), *bad])


def test_spec_is_the_docs_llama_spec(tp, tmp_path):
    from planc.spec.model import load_spec

    s = load_spec(tp.write_tp_spec(tmp_path / "ckpt", tmp_path, 4, {"merge_gap": "64KiB"})).spec
    assert s.tensor_parallel.size == 4 and s.io.slots == 16 and s.io.workers == 16
    docs = (ROOT / "docs" / "tp.md").read_text()
    for r in tp.RULES:
        assert f'"{r["match"]}"' in docs


def test_tiny_loads_under_the_simulator(tmp_path):
    """A whole load and a group of two at a barrier, end to end, on a tiny checkpoint."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(BENCH / "tp.py"), str(tmp_path / "data"), str(out), "--size", "2MiB",
                        "--cases", "whole,all", "--group-tp", "2", "--repeat", "1", "--modes", "warm", "--no-verify"],
                       capture_output=True, text=True, env=_env(NUMBA_ENABLE_CUDASIM="1"), timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    recs = [json.loads(x) for x in (out / "tp.jsonl").read_text().splitlines()]
    groups = [r for r in recs if r["kind"] == "group"]
    loads = [r for r in recs if r["kind"] == "load"]
    assert [(g["case"], g["ranks"]) for g in groups] == [("whole", [0]), ("all", [0, 1])]
    assert all("error" not in g and g["load_wall_s"] > 0 and g["process_wall_s"] > g["load_wall_s"] for g in groups)
    assert sorted(x["rank"] for x in loads if x["case"] == "all") == [0, 1]
    assert all(x["requests"]["issued"] == x["plan_requests"] for x in loads)
    summary = json.loads((out / "tp_summary.json").read_text())
    assert "all/2/warm" in summary["medians"] and "targets:" in p.stdout


# --------------------------------------------------------------------------- tp.py, the pre-sharded case


def _tensors(folder: Path) -> dict:
    """name -> (dtype, shape, raw bytes as uint16) of every tensor of a sharded checkpoint's files."""
    import numpy as np
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        start = 8 + int.from_bytes(f.read_bytes()[:8], "little")
        raw = np.frombuffer(f.read_bytes(), np.uint8)
        with safe_open(str(f), "np") as h:  # the safetensors package parses the header: a real file
            names = list(h.keys())
        head = json.loads(f.read_bytes()[8:start])
        for n in names:
            lo, hi = head[n]["data_offsets"]
            out[n] = (head[n]["dtype"], tuple(head[n]["shape"]), raw[start + lo:start + hi].view(np.uint16))
    return out


def test_presharded_checkpoint_is_rank_slices(tp, tmp_path):
    """Each tensor of the written checkpoint is numpy's slice of the original for the rank, in the
    same shard; replicated tensors whole; the index lists every tensor; written once."""
    from planc.tools.synth import INDEX_NAME, write_checkpoint

    ckpt = tmp_path / "ck"
    write_checkpoint(ckpt, "dense", layers=2, shards=2)
    orig = _tensors(ckpt)
    own = tp.write_presharded(ckpt, tmp_path, 4, rank=1)
    got = _tensors(own)
    assert set(got) == set(orig)
    split = 0
    for name, (dt, shape, raw) in orig.items():
        full = raw.reshape(shape)
        dim = tp.split_dim(name)
        if dim is None:
            want = full
        else:
            k = shape[dim] // 4
            want = full[k:2 * k] if dim == 0 else full[:, k:2 * k]
            split += 1
        assert got[name][0] == dt and got[name][1] == want.shape, name
        assert (got[name][2] == want.reshape(-1)).all(), name
    assert split >= 2 * 7  # q, k, v, o, gate, up, down of each layer at least
    index = json.loads((own / INDEX_NAME).read_text())
    assert index["weight_map"] == json.loads((ckpt / INDEX_NAME).read_text())["weight_map"]
    assert index["metadata"]["total_size"] == sum(v[2].nbytes for v in got.values())
    # the bytes are those of the rank's plan under the docs' Llama spec (RULES), not only of SPLIT_DIM
    from planc.compiler.compile import compile_spec

    plan = compile_spec(tp.write_tp_spec(ckpt, tmp_path, 4, {}), 1)
    assert plan.totals.payload_bytes == index["metadata"]["total_size"]
    stamp = (own / INDEX_NAME).stat().st_mtime_ns
    assert tp.write_presharded(ckpt, tmp_path, 4, rank=1) == own and (own / INDEX_NAME).stat().st_mtime_ns == stamp
    assert tp.split_dim("model.layers.0.self_attn.q_proj.bias") is None and tp.split_dim("lm_head.weight") == 0
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # the source changed
    tp.write_presharded(ckpt, tmp_path, 4, rank=1)
    assert (own / INDEX_NAME).stat().st_mtime_ns != stamp  # written again, not reused
    import numpy as np
    with pytest.raises(ValueError, match="does not split evenly"):
        tp.rank_slice(np.zeros((6, 4)), 0, 4, 0)


def test_presharded_case_and_ceiling(tp, tmp_path):
    a = tp.parse_args([str(tmp_path), str(tmp_path), "--cases", "whole,alone,sharded", "--tp", "2,8"])
    assert tp.plan_sets(a) == [("whole", 1, [0]), ("alone", 2, [0]), ("alone", 8, [0]),
                               ("sharded", 2, [0]), ("sharded", 8, [0])]
    groups = [_group("whole", 1, "warm", 0.6), _group("alone", 8, "warm", 0.2), _group("alone", 2, "warm", 0.5)]
    groups += [dict(_group("alone", 8, "warm", 0.1), case="sharded")]  # the same bytes, twice as fast
    lines = tp.ceiling_lines(tp.medians(groups))
    assert len(lines) == 4  # TP 2 has no pre-sharded load: no row
    row = lines[-1].split("|")
    assert row[1].strip() == "8" and row[-2].strip() == "0.50"  # alone / pre-sharded
    assert tp.ceiling_lines(tp.medians(groups[1:])) == []  # no whole load: no table
    spec = tp.write_tp_spec(tmp_path / "own", tmp_path, 1, {}, "sharded-tp8")
    from planc.spec.model import load_spec

    s = load_spec(spec).spec
    assert spec.name == "sharded-tp8.yaml" and s.tensor_parallel.size == 1 and len(s.rules) == 1

"""Tensor-parallel property: over all ranks, each split tensor's bytes are read exactly once; a
replicated tensor is read whole by every rank. Checked on the compiled plans (no execution)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from planc.compiler.compile import compile_all_ranks
from planc.manifest import read_manifest


@st.composite
def _case(draw):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    tensors, rules = {}, []
    for k in range(draw(st.integers(1, 4))):
        ndim = draw(st.integers(1, 3))
        shape = [draw(st.integers(1, 3)) * (n if d == 0 else 1) for d in range(ndim)]
        dim = draw(st.integers(0, ndim - 1))
        shape[dim] = draw(st.integers(1, 3)) * n
        dtype = draw(st.sampled_from([np.float32, np.float16, np.uint8]))
        name = f"t{k}"
        tensors[name] = np.zeros(shape, dtype=dtype)
        split = draw(st.sampled_from(["replicate", {"dim": dim}]))
        rules.append({"match": name, "split": split})
    merge_gap = draw(st.sampled_from([0, 64, 1 << 20]))
    strided = draw(st.sampled_from(["auto", "mapped", "rows"]))
    return n, tensors, rules, merge_gap, strided


@settings(max_examples=40, deadline=None)
@given(_case())
def test_ranks_partition_split_tensors(case):
    n, tensors, rules, merge_gap, strided = case
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        save_file(tensors, d / "m.safetensors")
        spec = {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"}, "tensor_parallel": {"size": n},
                "io": {"slot": "4KiB", "slots": 2, "merge_gap": merge_gap, "strided": strided}, "rules": rules}
        (d / "s.yaml").write_text(yaml.safe_dump(spec))
        man = read_manifest(d / "m.safetensors")
        plans = compile_all_ranks(d / "s.yaml")
    split = {r["match"]: r["split"] != "replicate" for r in rules}
    counts = {t.name: np.zeros(t.nbytes, dtype=np.int64) for t in man.tensors}
    for p in plans:
        per_rank = {t.name: np.zeros(t.nbytes, dtype=np.int64) for t in man.tensors}
        for part in p.to_dict()["parts"]:
            for i in part["inputs"]:
                t = man.tensor(i["tensor"])
                count = i.get("count", 1)
                seg = i["seg"] if count > 1 else i["nbytes"]
                for k in range(count):
                    a = i["start"] + k * i.get("stride", 0) - t.start
                    per_rank[t.name][a:a + seg] += 1
        for name, c in per_rank.items():
            if not split[name]:
                assert (c == 1).all(), name  # replicated: every rank reads it whole, once
            counts[name] += c
        # the copies of each rank land every payload byte exactly once in its arena
        arena = np.zeros(p.layout.arena_bytes, dtype=np.int64)
        for r in p.to_dict()["runs"]:
            for q in r["requests"]:
                for _slot_off, space, dst, nb, rows, _pitch in q["copies"]:
                    assert space == "arena"
                    arena[dst:dst + nb * rows] += 1
        assert arena.max(initial=0) <= 1
        assert arena.sum() == p.totals.payload_bytes
    for name, c in counts.items():
        assert (c == (1 if split[name] else n)).all(), name

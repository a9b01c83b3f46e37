"""The node: ranks that share a host admitted together against `budget.node_host`, at their peaks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_spec, write_st
from planc.face.cli import main
from planc.compiler.compile import compile_all_ranks
from planc.plan.node import check_nodes, first_refused, node_ranks


@given(st.integers(1, 64), st.integers(1, 64), st.data())
@settings(max_examples=200, deadline=None)
def test_admitted_nodes_hold_their_ranks_within_the_budget(size, per_node, data):
    peaks = {r: data.draw(st.integers(0, 1 << 40), label=f"peak {r}") for r in range(size)}
    groups = node_ranks(size, per_node)
    assert sorted(r for g in groups for r in g) == list(range(size))  # every rank on exactly one node
    assert all(len(g) <= per_node for g in groups)
    sums = [sum(peaks[r] for r in g) for g in groups]
    budget = data.draw(st.sampled_from([max(sums), max(sums) - 1, data.draw(st.integers(0, 1 << 46))]))
    checks = check_nodes(peaks, size, per_node, budget)
    assert [c.total_bytes for c in checks] == sums
    for c in checks:
        assert c.fits == (c.total_bytes <= budget)  # admitted => the sum of its ranks' peaks is within the budget
    refused = first_refused(checks)
    assert (refused is None) == (max(sums) <= budget)  # admitted at the boundary, refused one byte below
    if refused is not None:
        assert refused == next(c for c in checks if c.total_bytes > budget)
    assert first_refused(check_nodes(peaks, size, per_node, None)) is None  # unset: stated, not checked


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    d = tmp_path_factory.mktemp("node")
    write_st(d / "m.safetensors", {"a.w": np.ones((16, 64), np.float32), "b.w": np.ones((64, 16), np.float32)})
    return d


def tp_spec(folder, size=4, per_node=None, node_host=None, name="tp.yaml"):
    budget = {"host": "1MiB"} if node_host is None else {"host": "1MiB", "node_host": node_host}
    tpd = {"size": size} if per_node is None else {"size": size, "ranks_per_node": per_node}
    return write_spec(folder, {"checkpoint": "m.safetensors", "budget": budget, "tensor_parallel": tpd,
                               "io": {"slot": 4096, "slots": 2, "run": 4096},
                               "rules": [{"match": "a.w", "split": {"dim": 0}}, {"match": "*", "split": {"dim": 1}}]},
                      name)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    o, e = capsys.readouterr()
    return rc, o, e


def _peaks(path):
    return [p.peak.host_bytes for p in compile_all_ranks(path)]


def test_node_total_stated_when_unset(capsys, tp):
    path = tp_spec(tp)
    peaks = _peaks(path)
    rc, o, _ = run(capsys, "compile", path, "--rank", "all", "--json")
    d = json.loads(o)
    assert d["nodes"][0].pop("predicted_wall")["warm_seconds"] > 0  # the ranks at once (tests/test_predict.py)
    assert rc == 0 and d["nodes"] == [{"node": 0, "ranks": [0, 1, 2, 3], "host_peak_bytes": peaks,
                                       "total_bytes": sum(peaks), "budget_bytes": None, "checked": False, "fits": True}]
    assert d["ranks"][2]["checks"]["node"]["total_bytes"] == sum(peaks)


@pytest.mark.parametrize("per_node", [None, 2, 3])
def test_node_budget_admitted_at_the_boundary_refused_below(capsys, tp, per_node):
    peaks = _peaks(tp_spec(tp))
    k = per_node or 4
    sums = [sum(peaks[s:s + k]) for s in range(0, 4, k)]
    rc, o, e = run(capsys, "compile", tp_spec(tp, per_node=per_node, node_host=max(sums)), "--rank", "all")
    assert rc == 0 and "nodes" in o, e
    rc, o, e = run(capsys, "compile", tp_spec(tp, per_node=per_node, node_host=max(sums) - 1), "--rank", "all")
    lines = e.strip().splitlines()
    last = lines[-1]
    bad = sums.index(max(sums))
    ranks = list(range(bad * k, min(bad * k + k, 4)))
    # the tables are output (stdout); stderr holds the refusal's one line alone
    assert rc == 3 and len(lines) == 1 and "nodes" in o and last.endswith("[node-budget]")
    assert f"node {bad} (ranks {ranks[0]}..{ranks[-1]}) needs {max(sums):,} bytes" in last
    assert f"budget.node_host allows {max(sums) - 1:,} bytes" in last
    assert all(f"rank {r} {peaks[r]:,}" in last for r in ranks)


def test_explain_of_one_rank_states_its_node(capsys, tp):
    peaks = _peaks(tp_spec(tp))
    rc, o, _ = run(capsys, "explain", tp_spec(tp, per_node=2, node_host=peaks[2] + peaks[3] - 1), "--rank", "3",
                   "--json")
    d = json.loads(o)
    n = d["checks"]["node"]
    assert rc == 0 and (n["node"], n["ranks"], n["total_bytes"]) == (1, [2, 3], peaks[2] + peaks[3])
    assert d["fits"] is False and d["refusal"]["code"] == "node-budget" and d["refusal"]["run"] is None
    rc, o, _ = run(capsys, "explain", tp_spec(tp, per_node=2, node_host=peaks[2] + peaks[3]), "--rank", "3")
    flat = " ".join(o.split())
    assert rc == 0 and "FITS" in flat and "node 1 (ranks 2..3) checked" in flat


def test_explain_all_ranks_has_the_node_table(capsys, tp):
    rc, o, _ = run(capsys, "explain", tp_spec(tp, per_node=2), "--rank", "all")
    assert rc == 0 and "nodes: the ranks' host peaks together" in o and "not checked" in o

"""The plan's predicted wall time: present, positive, monotone in bytes, with where its figures came from."""

from __future__ import annotations

import json
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import write_spec, write_st  # noqa: E402
from planc.face.cli import main  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.plan.predict import predict  # noqa: E402


def _spec(folder, rules=None, name="spec.yaml"):
    return write_spec(folder, {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                               "io": {"slot": 4096, "slots": 4, "run": 16384},
                               "rules": rules or [{"match": "*"}]}, name)


def _plan(folder, rows: int, rules=None):
    write_st(folder / "m.safetensors", {"w": np.ones((rows, 64), np.float32), "b": np.ones(64, np.float32)})
    return compile_spec(_spec(folder, rules))


def test_predicted_time_present_and_positive(tmp_path):
    p = predict(_plan(tmp_path, 32))
    assert p["warm_seconds"] > 0 and p["cold_seconds"] > p["warm_seconds"]
    t = p["terms"]
    assert t["fixed_seconds"] > 0 and t["read_warm_seconds"] > 0 and t["link_seconds"] > 0
    assert p["default_costs"] is True and "compiled with default costs" in p["note"]  # PLANC_PROBE=off here
    assert p["figures"]["read"] == "default"


@given(st.integers(1, 200), st.integers(1, 200), st.sampled_from(["keep", "float16"]), st.sampled_from(["device", "host"]))
@settings(max_examples=15, deadline=None)
def test_predicted_time_is_monotone_in_bytes(tmp_path_factory, a, b, dtype, on):
    small, large = sorted((a, b))
    rules = [{"match": "w", "dtype": dtype, "on": on}, {"match": "*"}]
    ps = predict(_plan(tmp_path_factory.mktemp("s"), small, rules))
    pl = predict(_plan(tmp_path_factory.mktemp("l"), large, rules))
    for k in ("warm_seconds", "cold_seconds"):
        assert ps[k] <= pl[k], (k, small, large)
    if large > small:
        assert ps["cold_seconds"] < pl["cold_seconds"]


def test_probe_figures_are_named(tmp_path, monkeypatch):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-10, "request_s": 1e-4}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    p = predict(_plan(tmp_path, 32))
    assert p["default_costs"] is False and p["figures"]["read"] == str(probe) and str(probe) in p["note"]
    monkeypatch.setenv("PLANC_PROBE", "off")
    assert predict(_plan(tmp_path, 32))["warm_seconds"] < p["warm_seconds"]  # the probe's figures were used


def test_explain_states_the_predicted_time(capsys, tmp_path):
    write_st(tmp_path / "m.safetensors", {"w": np.ones((32, 64), np.float32)})
    path = _spec(tmp_path)
    assert main(["explain", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["predicted_time"]["warm_seconds"] > 0 and d["predicted_time"]["default_costs"] is True
    assert main(["explain", str(path)]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "predicted wall:" in flat and "compiled with default costs" in flat


def test_run_report_puts_the_prediction_beside_the_wall(capsys, tmp_path):
    write_st(tmp_path / "m.safetensors", {"w": np.ones((8, 32), np.float32)})
    path = _spec(tmp_path)
    assert main(["run", str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    pr = rep["predicted"]
    assert pr["wall_warm_seconds"] > 0 and pr["default_costs"] is True
    assert pr["measured_over_warm"] == pytest.approx(rep["wall_seconds"] / pr["wall_warm_seconds"])


def _tp_plans(folder, size):
    from planc.compiler.compile import compile_all_ranks

    write_st(folder / "m.safetensors", {"a.w": np.ones((64, 256), np.float32), "b.w": np.ones((256, 64), np.float32)})
    spec = write_spec(folder, {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"},
                               "tensor_parallel": {"size": size}, "io": {"slot": 16384, "slots": 2, "run": 16384},
                               "rules": [{"match": "a.w", "split": {"dim": 0}}, {"match": "*", "split": {"dim": 1}}]},
                      "tp.yaml")
    return spec, compile_all_ranks(spec)


def test_a_node_of_one_plan_is_predicted_as_the_plan(tmp_path):
    from planc.plan.predict import predict_node

    _, plans = _tp_plans(tmp_path, 2)
    for p in plans:
        one, node = predict(p), predict_node([p])
        assert node["warm_seconds"] == pytest.approx(one["warm_seconds"])
        assert node["cold_seconds"] == pytest.approx(one["cold_seconds"])


def test_mapped_reads_are_priced_by_their_span(tmp_path):
    from planc.plan.predict import predict_node

    _, plans = _tp_plans(tmp_path, 4)
    p = plans[0]
    t = predict(p)["terms"]
    strided = [q for r in p.runs for q in r.requests if q.strided]
    assert strided, "b.w's dim-1 slice is read as strided requests"
    assert t["mapped_span_bytes"] == sum((q.count - 1) * q.stride + q.length for q in strided)
    assert t["mapped_pages"] >= t["mapped_span_bytes"] // 4096
    # all ranks at once read the shared spans from disk once: cold is less than the ranks one after another
    node = predict_node(plans)
    assert node["cold_seconds"] < sum(predict(q)["cold_seconds"] for q in plans)
    # one device for every rank: its link carries them all, never faster than a device each
    assert predict_node(plans, ["cuda:0"] * len(plans))["warm_seconds"] >= node["warm_seconds"]


def test_explain_of_every_rank_states_the_nodes_predicted_wall(capsys, tmp_path):
    spec, _ = _tp_plans(tmp_path, 2)
    assert main(["explain", str(spec), "--rank", "all", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    pw = d["nodes"][0]["predicted_wall"]
    assert pw["warm_seconds"] > 0 and pw["cold_seconds"] > 0
    assert main(["explain", str(spec), "--rank", "all"]) == 0
    assert "all at once" in capsys.readouterr().out


def test_mapped_pages_cost_in_proportion_to_the_probed_page_figure(tmp_path, monkeypatch):
    from planc.plan.costs import DEFAULTS

    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": DEFAULTS.page_s * 3, "copy_byte_s": DEFAULTS.copy_byte_s,
                                 "read_byte_s": DEFAULTS.read_byte_s, "request_s": DEFAULTS.request_s}))
    _, plans = _tp_plans(tmp_path / "d", 4)
    base = predict(plans[0])["terms"]["read_warm_seconds"]
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    _, plans = _tp_plans(tmp_path / "p", 4)
    assert plans[0].costs.page_s == DEFAULTS.page_s * 3
    assert predict(plans[0])["terms"]["read_warm_seconds"] > base


def test_the_cold_wall_follows_the_probed_disk(tmp_path, monkeypatch):
    """A probe's disk figure prices a cold load's reads (whole requests and mapped spans); the warm
    wall does not change, and the figures say where the disk figure came from."""
    from planc.plan.costs import DEFAULTS

    base = predict(_plan(tmp_path / "d", 2048))
    assert base["figures"]["disk"] == "default"
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({**{k: getattr(DEFAULTS, k) for k in ("page_s", "copy_byte_s", "read_byte_s",
                                                                       "request_s")},
                                 "disk_byte_s": DEFAULTS.disk_byte_s / 2}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    fast = predict(_plan(tmp_path / "f", 2048))
    assert fast["figures"]["disk"] == str(probe)
    assert fast["warm_seconds"] == pytest.approx(base["warm_seconds"])
    assert fast["terms"]["read_cold_seconds"] < base["terms"]["read_cold_seconds"]


@pytest.mark.parametrize("figure", ["disk_byte_s", "link_byte_s"])
def test_a_plan_saved_before_a_later_figure_loads_with_the_built_in_one(tmp_path, figure):
    """`disk_byte_s` and `link_byte_s` came after plans were saved without them: absent, the built-in
    figure; present, seconds per byte above 0 and below 1 (0 would leave the term out of the wall);
    an unknown key in their place is refused."""
    from planc.plan import codec
    from planc.plan.costs import DEFAULTS

    plan = _plan(tmp_path, 32)
    path = tmp_path / "p.plan.json"
    codec.save_plan(plan, path)
    doc = json.loads(path.read_text())
    del doc["costs"][figure]
    path.write_text(json.dumps(doc))
    assert getattr(codec.load_plan(path).costs, figure) == getattr(DEFAULTS, figure)
    for bad in (2.0, 0, -0.0, True, "5e-10"):
        doc["costs"][figure] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(Exception, match=f"costs.{figure}"):
            codec.load_plan(path)
    doc["costs"][figure.split("_")[0]] = 1e-9
    del doc["costs"][figure]
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="costs"):
        codec.load_plan(path)


def test_ranks_at_once_copy_their_mapped_segments_on_more_lanes(tmp_path):
    """A node's ranks copy their mapped segments on all their lanes: node_copy_speedup times one
    rank's rate (at most as many lanes as the host has cores allow), so the node's warm read is the
    ranks' reads with their copy terms divided by it; a rank alone keeps its own."""
    from planc.plan import predict as pr

    _, plans = _tp_plans(tmp_path, 8)
    copies = sum(pr._reads(p)._asdict()["mapped_copy_s"] for p in plans)
    assert copies > 0
    one = pr.predict_node(plans, fixed=pr.FIXED._replace(node_copy_speedup=1.0))["terms"]["read_warm_seconds"]
    two = pr.predict_node(plans)["terms"]["read_warm_seconds"]
    assert two == pytest.approx(one - copies * (1 - 1 / pr.FIXED.node_copy_speedup))
    few = pr.predict_node(plans, fixed=pr.FIXED._replace(cores=4))["terms"]["read_warm_seconds"]
    assert few > two  # four cores: the lanes of one rank, no faster copies
    alone = pr.predict_node(plans[:1])["terms"]["read_warm_seconds"]
    assert alone == pytest.approx(pr.predict(plans[0])["terms"]["read_warm_seconds"])


# -- limits: the GB/s beside the host's and the link's rates -------------------------------------


def _limits_are_typed(lim: dict, measured: bool) -> None:
    keys = {"predicted_gb_per_s", "link_gb_per_s", "link_from", "host_gb_per_s", "host_from", "probe_file",
            "ceiling", "ceiling_gb_per_s", "predicted_over_ceiling"}
    if measured:
        keys |= {"measured_gb_per_s", "measured_over_link", "measured_over_host", "measured_over_ceiling"}
    assert set(lim) == keys
    for k in keys - {"link_from", "host_from", "probe_file", "ceiling"}:
        assert type(lim[k]) is float, (k, lim[k])
    assert lim["link_from"] == "built-in" and lim["ceiling"] in ("host", "link")


def test_explain_states_the_predicted_gbps_beside_the_default_limits(capsys, tmp_path):
    from planc.plan.costs import DEFAULTS
    from planc.plan.predict import FIXED, limits

    plan = _plan(tmp_path, 256)
    lim = limits(plan)
    _limits_are_typed(lim, measured=False)
    assert lim["host_from"] == "default" and lim["probe_file"] is None  # PLANC_PROBE=off here
    assert lim["host_gb_per_s"] == pytest.approx(1e-9 / DEFAULTS.read_byte_s)  # whole requests only
    assert lim["link_gb_per_s"] == pytest.approx(1e-9 / FIXED.link_byte_s)
    assert lim["ceiling"] == "host" and lim["ceiling_gb_per_s"] == lim["host_gb_per_s"]  # 43.5 < 55.4 GB/s
    assert lim["predicted_gb_per_s"] == pytest.approx(plan.totals.payload_bytes / predict(plan)["warm_seconds"] / 1e9)
    assert lim["predicted_over_ceiling"] == pytest.approx(lim["predicted_gb_per_s"] / lim["ceiling_gb_per_s"])
    assert 0 < lim["predicted_over_ceiling"] < 1

    spec = tmp_path / "spec.yaml"
    assert main(["explain", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["limits"] == pytest.approx(lim)
    assert main(["explain", str(spec)]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert (f"limits: predicted {lim['predicted_gb_per_s']:.2f} GB/s: {lim['predicted_over_ceiling']:.2f} of the "
            f"host's 43.48 GB/s (default costs), ") in flat and "of the link's 55.40 GB/s (built in)" in flat


def test_a_probe_file_gives_the_host_rate_and_says_so(tmp_path, monkeypatch):
    """A probed host whose reads outrun the link: the link is the ceiling, the host's rate is the probe's."""
    from planc.plan.predict import limits

    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-11, "request_s": 1e-6}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    lim = limits(_plan(tmp_path, 256))
    _limits_are_typed(lim, measured=False)
    assert lim["host_from"] == "probe" and lim["probe_file"] == str(probe)
    assert lim["host_gb_per_s"] == pytest.approx(100.0)  # 1 / read_byte_s
    assert lim["ceiling"] == "link" and lim["ceiling_gb_per_s"] == lim["link_gb_per_s"] == pytest.approx(55.4)


def test_the_host_rate_weighs_whole_and_mapped_reads_by_their_bytes(tmp_path, monkeypatch):
    from planc.plan.predict import limits

    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 2.5e-11, "request_s": 1e-6}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    _, plans = _tp_plans(tmp_path, 4)
    p = plans[0]
    reqs = [q for r in p.runs for q in r.requests]
    whole = sum(q.length for q in reqs if not q.strided)
    mapped = sum(q.read_bytes for q in reqs if q.strided)
    assert whole and mapped, "rank 0 reads a.w whole and b.w's slice through a mapping"
    host = limits(p)["host_gb_per_s"]
    assert host == pytest.approx((whole + mapped) / (whole * 2.5e-11 + mapped * 1e-10) / 1e9)
    assert 10.0 < host < 40.0  # between the copy's and the read's rates


def test_a_zero_or_absent_rate_is_null_not_a_division_by_zero(tmp_path):
    import dataclasses

    from planc.plan.predict import FIXED, limits

    plan = _plan(tmp_path, 32)
    lim = limits(dataclasses.replace(plan, costs=plan.costs._replace(read_byte_s=0.0)), wall=0.5,
                 fixed=FIXED._replace(link_byte_s=0.0))
    assert lim["host_gb_per_s"] is None and lim["link_gb_per_s"] is None
    assert lim["ceiling"] is None and lim["ceiling_gb_per_s"] is None
    assert lim["predicted_over_ceiling"] is None
    assert lim["measured_over_link"] is None and lim["measured_over_host"] is None and lim["measured_over_ceiling"] is None
    assert lim["measured_gb_per_s"] == pytest.approx(plan.totals.payload_bytes / 0.5 / 1e9)
    no_wall = limits(plan, wall=0.0)
    assert no_wall["measured_gb_per_s"] is None and no_wall["measured_over_ceiling"] is None
    assert no_wall["host_gb_per_s"] is not None and no_wall["ceiling"] == "host"


def _run_json(capsys, spec) -> dict:
    assert main(["run", str(spec), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_run_report_states_the_fraction_of_the_limit(capsys, tmp_path, monkeypatch):
    write_st(tmp_path / "m.safetensors", {"w": np.ones((8, 32), np.float32)})
    spec = _spec(tmp_path)
    rep = _run_json(capsys, spec)
    lim = rep["limits"]
    _limits_are_typed(lim, measured=True)
    assert lim["host_from"] == "default" and lim["probe_file"] is None
    assert lim["measured_gb_per_s"] == rep["gb_per_s"]
    assert lim["measured_over_link"] == pytest.approx(lim["measured_gb_per_s"] / lim["link_gb_per_s"])
    assert lim["measured_over_host"] == pytest.approx(lim["measured_gb_per_s"] / lim["host_gb_per_s"])
    assert lim["ceiling"] == "host"
    assert lim["measured_over_ceiling"] == lim["measured_over_host"]
    assert lim["predicted_gb_per_s"] == pytest.approx(rep["payload_bytes"] / rep["predicted"]["wall_warm_seconds"] / 1e9)
    assert main(["explain", str(spec), "--json"]) == 0  # the same figures as explain's
    ex = json.loads(capsys.readouterr().out)["limits"]
    assert {k: lim[k] for k in ex} == pytest.approx(ex)

    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-11, "request_s": 1e-6}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    lim = _run_json(capsys, spec)["limits"]
    assert lim["host_from"] == "probe" and lim["probe_file"] == str(probe)
    assert lim["host_gb_per_s"] == pytest.approx(100.0) and lim["ceiling"] == "link"
    assert lim["measured_over_ceiling"] == lim["measured_over_link"]
    assert main(["run", str(spec)]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "limits: measured " in flat and "of the link's 55.40 GB/s (built in), " in flat
    assert "of the host's 100.00 GB/s (probe); predicted " in flat


def test_a_probed_link_prices_the_link_and_the_limit_says_so(tmp_path, monkeypatch):
    """A probe that copied to a GPU: the plan carries its link, the predicted wall's link term and the
    limits follow it, and both say it came from the probe; the read figures are unchanged."""
    from planc.plan.costs import DEFAULTS
    from planc.plan.predict import limits

    base = _plan(tmp_path / "b", 256)
    probe = tmp_path / "probe.json"
    figures = {k: getattr(DEFAULTS, k) for k in ("page_s", "copy_byte_s", "read_byte_s", "request_s")}
    probe.write_text(json.dumps({**figures, "link_byte_s": 1 / 20e9}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    slow = _plan(tmp_path / "s", 256)
    assert slow.costs.link_byte_s == 1 / 20e9
    p, q = predict(base), predict(slow)
    assert q["terms"]["link_seconds"] == pytest.approx(p["terms"]["link_seconds"] * 55.4 / 20)
    assert q["terms"]["read_warm_seconds"] == pytest.approx(p["terms"]["read_warm_seconds"])
    assert p["figures"]["link"] == "default" and q["figures"]["link"] == str(probe)
    lim = limits(slow)
    assert lim["link_from"] == "probe" and lim["link_gb_per_s"] == pytest.approx(20.0)
    assert lim["ceiling"] == "link" and limits(base)["link_from"] == "built-in"
    from planc.plan.explain import limits_text

    assert "of the link's 20.00 GB/s (probe)" in limits_text(lim)


def test_a_link_figure_too_small_to_give_a_rate_gives_none(tmp_path, monkeypatch):
    """A probe's link of 5e-324 seconds per byte (a positive float, accepted) would be an infinite
    rate: the limits say null, never Infinity, which JSON cannot carry."""
    from planc.plan.costs import DEFAULTS
    from planc.plan.predict import limits

    probe = tmp_path / "probe.json"
    figures = {k: getattr(DEFAULTS, k) for k in ("page_s", "copy_byte_s", "read_byte_s", "request_s")}
    probe.write_text(json.dumps({**figures, "link_byte_s": 5e-324}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    lim = limits(_plan(tmp_path / "t", 32), wall=0.5)
    assert lim["link_gb_per_s"] is None and lim["measured_over_link"] is None
    json.dumps(lim, allow_nan=False)


def test_a_plans_reads_are_counted_once_and_forgotten_with_it(tmp_path, monkeypatch):
    """A report's prediction asks for the plan's reads three times (`beside`, `limits` and its
    `predict`): they are counted once per Plan (a frozen value), the same as counted afresh, and the
    count goes when the plan does."""
    import gc

    from planc.execute.pipeline.records import Prediction
    from planc.plan import predict as P

    counted = []
    real = P._count_reads
    monkeypatch.setattr(P, "_count_reads", lambda plan, c: counted.append(plan) or real(plan, c))
    plan = _plan(tmp_path, 64)
    first = Prediction.of(plan, 0.5)
    assert Prediction.of(plan, 0.5) == first and len(counted) == 1
    assert P._reads(plan) == real(plan, plan.costs or P.DEFAULTS)
    (tmp_path / "o").mkdir()
    other = _plan(tmp_path / "o", 64)
    Prediction.of(other, 0.5)
    assert len(counted) == 2  # another Plan, counted for itself
    n = len(P._READS)
    del plan, other, first
    counted.clear()
    gc.collect()
    assert len(P._READS) == n - 2

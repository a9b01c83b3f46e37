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

"""What explain's verdict rests on: the device budget checked or not (and why), `budget.device: auto`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_spec, write_st
from planc.face.cli import main
from planc.compiler.compile import compile_loaded
from planc.base.errors import SpecError
from planc.plan.explain import explain_doc, verdict_text
from planc.manifest import read_manifest
from planc.spec.model import load_spec


@pytest.fixture
def ckpt(tmp_path):
    write_st(tmp_path / "m.safetensors", {"a": np.ones((16, 64), np.float32), "b": np.ones(64, np.float32)})
    return tmp_path


def spec(folder, device=None, name="spec.yaml"):
    budget = {"host": "1MiB"} if device is None else {"host": "1MiB", "device": device}
    return write_spec(folder, {"checkpoint": "m.safetensors", "budget": budget,
                               "io": {"slot": 4096, "slots": 2, "run": 4096}, "rules": [{"match": "*"}]}, name)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    o, e = capsys.readouterr()
    return rc, o, e


def test_unset_device_budget_is_not_checked_in_json(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt), "--json")
    d = json.loads(o)
    assert rc == 0 and d["fits"] is True
    dev = d["checks"]["device"]
    assert dev == {"checked": False, "peak_bytes": d["peak"]["device_bytes"], "budget_bytes": None, "fits": None,
                   "budget_from": "unset"}
    assert dev["peak_bytes"] >= 16 * 64 * 4 + 64 * 4
    assert d["checks"]["host"]["checked"] is True and d["checks"]["host"]["fits"] is True


def test_unset_device_budget_is_not_checked_in_text(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt))
    flat = " ".join(o.split())
    assert rc == 0 and "FITS (host checked; device NOT CHECKED: peak" in flat and "no budget.device" in flat
    assert "not checked" in flat  # the budget table's device row


def test_device_budget_given_is_checked(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt, device="1MiB"), "--json")
    dev = json.loads(o)["checks"]["device"]
    assert dev["checked"] is True and dev["fits"] is True and dev["budget_from"] == "spec"


def _compile(path, capacity):
    loaded = load_spec(path)
    return compile_loaded(loaded, read_manifest(loaded.checkpoint_path), 0, capacity=capacity)


def test_auto_takes_the_capacity_of_the_named_device(ckpt):
    asked = []

    def capacity(device):
        asked.append(device)
        return 1000, f"auto: {device} capacity from the CUDA driver"

    plan = _compile(spec(ckpt, device="auto"), capacity)
    assert asked == ["cuda:0"] and plan.budget.device_bytes == 1000
    assert not plan.fits and plan.refusal.code == "device-budget" and plan.refusal.allowed_bytes == 1000
    e = explain_doc(plan)
    assert e["checks"]["device"]["checked"] and e["checks"]["device"]["budget_from"].startswith("auto")
    assert verdict_text(e).startswith("REFUSED (host checked; device checked (budget.device auto)")
    roomy = _compile(spec(ckpt, device="AUTO"), lambda d: (1 << 40, "auto: ok"))
    assert roomy.fits and roomy.budget.device_bytes == 1 << 40


def test_auto_without_the_device_is_not_checked_and_says_why(capsys, ckpt):
    # This host is the simulator or has no driver: auto cannot be resolved; the verdict says so.
    rc, o, _ = run(capsys, "explain", spec(ckpt, device="auto"), "--json")
    d = json.loads(o)
    dev = d["checks"]["device"]
    assert rc == 0 and d["budget"]["device_bytes"] is None and dev["checked"] is False
    assert dev["budget_from"].startswith("auto: ")
    plan = _compile(spec(ckpt, device="auto"), lambda dv: (None, f"auto: this host has no {dv} (0 CUDA device(s))"))
    assert "device NOT CHECKED" in verdict_text(explain_doc(plan)) and "this host has no cuda:0" in verdict_text(explain_doc(plan))


@pytest.mark.parametrize("bad", ["autox", "-1", "lots"])
def test_device_budget_must_be_a_size_or_auto(ckpt, bad):
    with pytest.raises(SpecError, match="budget.device"):
        load_spec(spec(ckpt, device=bad))

"""Hostile reloads: a plan (or `device=`) of another device index than the live model's is refused
before anything is written, and the model is left as it was."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import planc  # noqa: E402
from conftest import write_spec, write_st  # noqa: E402
from planc.base.errors import ReloadError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402


@pytest.fixture
def loaded(tmp_path):
    write_st(tmp_path / "m.safetensors", {"a": np.arange(64 * 64, dtype=np.float32).reshape(64, 64),
                                          "b": np.ones(64, np.float32)})
    spec = write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                                 "io": {"slot": "64KiB", "slots": 4}, "rules": [{"match": "*"}]})
    model = planc.load(spec)
    yield model, compile_spec(spec)
    model.free()


@pytest.mark.parametrize("how", ["plan", "argument"])
def test_a_reload_onto_another_device_index_is_refused(loaded, how):
    model, plan = loaded
    want = model["a"].to_host().copy()
    report = model.report
    with pytest.raises(ReloadError) as e:
        if how == "plan":
            model.reload(dataclasses.replace(plan, device="cuda:1"))
        else:
            model.reload(plan, device="cuda:1")
    assert e.value.code == "reload-layout" and e.value.exit_code == 2
    assert "cuda:1" in str(e.value) and "cuda:0" in str(e.value) and "nothing was written" in str(e.value)
    assert model.torn is None and model.report is report
    np.testing.assert_array_equal(model["a"].to_host(), want)


def test_a_reload_onto_the_same_device_named_either_way_is_taken(loaded):
    model, plan = loaded
    model.reload(plan, device="cuda:0")
    model.reload(dataclasses.replace(plan, device="cuda"))
    assert model.torn is None

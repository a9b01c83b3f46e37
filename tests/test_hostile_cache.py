"""Hostile plan cache entries and folders: an entry is used only when it is the plan of this spec, of
this checkpoint, for this device and budget, in a folder only its owner can write; anything else is a
miss (a compile), never an error and never another checkpoint's load."""

from __future__ import annotations

import dataclasses
import os
import shutil

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import planc  # noqa: E402
from conftest import write_spec, write_st  # noqa: E402
from planc.compiler.plancache import cached_compile  # noqa: E402

SPEC = {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"}, "io": {"slot": 4096, "slots": 2, "run": 4096},
        "rules": [{"match": "*"}]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PLANC_PLAN_CACHE", str(d))
    return d


def _two(tmp_path):
    """Two folders, each a spec of the same text beside a checkpoint of its own (b has a third tensor)."""
    for name, extra in (("a", {}), ("b", {"c": np.full(8, 7, np.float32)})):
        write_st(tmp_path / name / "m.safetensors", {"a": np.arange(64, dtype=np.float32), **extra})
        write_spec(tmp_path / name, SPEC)
    return tmp_path / "a" / "spec.yaml", tmp_path / "b" / "spec.yaml"


def test_an_entry_of_another_spec_is_a_miss(tmp_path, cache):
    sa, sb = _two(tmp_path)
    ea = cached_compile(sa).note("cache_entry")
    eb = cached_compile(sb).note("cache_entry")
    assert ea != eb
    shutil.copyfile(ea, eb)  # b's entry is now a's plan: the same spec text, another checkpoint
    plan = cached_compile(sb)
    assert plan.note("source") == "compiled"
    assert plan.checkpoint.root == str(tmp_path / "b") and any(t.name == "c" for t in plan.tensors)
    model = planc.load(sb)
    try:
        assert "c" in model.keys()
    finally:
        model.free()


def test_an_entry_of_another_device_is_a_miss(tmp_path, cache):
    sa, _ = _two(tmp_path)
    plan = cached_compile(sa)
    from planc.plan.codec import encode_bytes

    with open(plan.note("cache_entry"), "wb") as f:
        f.write(encode_bytes(dataclasses.replace(plan, device="cuda:1")))
    again = cached_compile(sa)
    assert again.note("source") == "compiled" and again.device == "cuda:0"


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_folder_others_can_write_is_not_trusted(tmp_path, cache, mode):
    sa, sb = _two(tmp_path)
    cache.mkdir(mode=0o700)
    cached_compile(sa)
    os.chmod(cache, mode)
    assert cached_compile(sa).note("source") == "compiled"  # an entry anyone could have put there
    os.chmod(cache, 0o700)
    assert cached_compile(sa).note("source") == "cache"

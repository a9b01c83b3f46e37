"""Helpers shared by the compiler tests: tiny safetensors files and spec files."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

# Plans choose read methods by measured I/O costs: the tests use the built-in figures, whatever a
# `planc probe` on this machine measured.
os.environ.setdefault("PLANC_PROBE", "off")
# Compiled plans go to a folder of the test session (and of each test: `_plan_cache`), never to the
# user's cache; module-scoped fixtures that compile run before any test's fixture.
if "PLANC_PLAN_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _SESSION_CACHE = tempfile.mkdtemp(prefix="planc-plan-cache-")
    os.environ["PLANC_PLAN_CACHE"] = _SESSION_CACHE
    atexit.register(shutil.rmtree, _SESSION_CACHE, True)


@pytest.fixture(autouse=True)
def _plan_cache(tmp_path_factory, monkeypatch):
    """Every test keeps compiled plans in a folder of its own (PLANC_PLAN_CACHE), never in the user's
    cache; processes a test starts inherit it."""
    if os.environ.get("PLANC_PLAN_CACHE") != "off":
        monkeypatch.setenv("PLANC_PLAN_CACHE", str(tmp_path_factory.mktemp("plan-cache")))


def write_st(path, tensors: dict[str, np.ndarray]) -> Path:
    """Write `tensors` with safetensors.numpy.save_file; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def st_header(path) -> tuple[int, dict[str, tuple[int, int]]]:
    """(data_start, {name: (absolute start, nbytes)}) read from a safetensors file's header."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    ds = 8 + n
    return ds, {k: (ds + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0]) for k, v in header.items()}


def write_spec(folder, doc: dict, name: str = "spec.yaml") -> Path:
    """Write a spec mapping as YAML (or JSON when `name` ends in .json) into `folder`."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".json"):
        path.write_text(json.dumps(doc, indent=2))
    else:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path

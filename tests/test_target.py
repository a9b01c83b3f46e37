"""One target resolver for both faces: the same bad spec, plan, rank or launcher variable gives the
same error class, code and message from `planc explain` as from `planc.load` (planc.face.target)."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import write_spec, write_st  # noqa: E402

import planc  # noqa: E402
from planc.face.cli import main  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import PlancError  # noqa: E402
from planc.plan.codec import save_plan  # noqa: E402
from planc.face.target import Launch, is_plan, resolve  # noqa: E402


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    write_st(tmp_path / "m.safetensors", {"a": np.ones((4, 4), np.float32), "b": np.ones(8, np.float32)})
    spec = write_spec(tmp_path, {"checkpoint": str(tmp_path / "m.safetensors"), "device": "cuda:0",
                                 "budget": {"host": "64MiB"}, "rules": [{"match": "*"}]})
    save_plan(compile_spec(spec), tmp_path / "plan.json")
    tp = write_spec(tmp_path, {"checkpoint": str(tmp_path / "m.safetensors"), "device": "cuda:0",
                               "budget": {"host": "64MiB"}, "tensor_parallel": {"size": 2},
                               "rules": [{"match": "*"}]}, name="tp.yaml")
    assert tp.exists()
    return tmp_path


def _truncated(d):
    raw = (d / "plan.json").read_bytes()
    (d / "cut.json").write_bytes(raw[: len(raw) // 2])
    return "cut.json"


def _write(name, data):
    def make(d):
        (d / name).write_bytes(data)
        return name
    return make


def _bad_field(d):
    text = (d / "spec.yaml").read_text().replace("host: 64MiB", "host: lots")
    (d / "bad.yaml").write_text(text)
    return "bad.yaml"


# (case, the target made in the folder, rank, launcher variables, the code both faces give)
CASES = [
    ("truncated-plan", _truncated, None, {}, "plan-syntax"),
    ("empty-json", _write("empty.json", b""), None, {}, None),
    ("empty-yaml", _write("empty.yaml", b""), None, {}, None),
    ("binary-json", _write("bin.json", bytes(range(256)) * 4), None, {}, None),
    ("binary-yaml", _write("bin.yaml", b"\x00\xff\xfe" * 100), None, {}, None),
    ("missing-plan", lambda d: "missing.json", None, {}, "plan-missing"),
    ("missing-spec", lambda d: "missing.yaml", None, {}, "spec-missing"),
    ("spec-bad-field", _bad_field, None, {}, "spec-invalid"),
    ("rank-outside-spec", lambda d: "spec.yaml", 3, {}, "bad-rank"),
    ("rank-outside-plan", lambda d: "plan.json", 1, {}, "bad-rank"),
    ("tp-spec-no-rank", lambda d: "tp.yaml", None, {}, "bad-rank"),
    ("rank-env-not-int", lambda d: "tp.yaml", None, {"RANK": "abc"}, "bad-rank"),
    ("world-size-other", lambda d: "tp.yaml", None, {"RANK": "1", "WORLD_SIZE": "4"}, "bad-rank"),
]


@pytest.mark.parametrize("case, make, rank, env, code", CASES, ids=[c[0] for c in CASES])
def test_both_faces_give_one_error(folder, capsys, monkeypatch, case, make, rank, env, code):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    target = folder / make(folder)
    with pytest.raises(PlancError) as info:
        planc.load(target, rank=rank)
    e = info.value
    if code is not None:
        assert e.code == code, e
    with pytest.raises(PlancError) as again:  # the resolver itself, as both faces call it
        resolve(target, rank, launch=Launch.from_env(), flag="rank=")
    assert type(again.value) is type(e) and again.value.code == e.code
    capsys.readouterr()
    rc = main(["explain", str(target), *(["--rank", str(rank)] if rank is not None else [])])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == e.exit_code, err
    assert err.endswith(f"[{e.code}]"), (err, e)
    if e.code != "bad-rank":  # the same words too (a rank's message names the face's own spelling of it)
        assert err == f"planc: {e}", (err, e)
    else:
        assert err.replace("--rank R", "rank=").replace("--rank", "rank=") == f"planc: {e}", (err, e)


def test_a_json_spec_is_a_spec_and_a_cut_plan_a_plan(folder):
    spec = write_spec(folder, {"checkpoint": str(folder / "m.safetensors"), "device": "cuda:0",
                               "budget": {"host": "64MiB"}, "rules": [{"match": "*"}]}, name="spec.json")
    assert not is_plan(spec) and is_plan(folder / "plan.json") and is_plan(folder / _truncated(folder))
    assert is_plan(folder / "missing.json") and not is_plan(folder / "spec.yaml")
    assert resolve(spec).fits and resolve(folder / "plan.json").fits


def test_launcher_variables_are_read_once_into_a_value():
    assert Launch.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}) == Launch(1, 2, 0)
    assert Launch.from_env({}) == Launch()
    for bad in ("x", "-1", "\u00b2", ""):
        with pytest.raises(PlancError, match="LOCAL_RANK=") as info:
            Launch.from_env({"LOCAL_RANK": bad})
        assert info.value.code == "bad-rank" and info.value.exit_code == 2

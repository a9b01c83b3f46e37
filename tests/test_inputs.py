"""Every documented form works as written; every bad input exits 2 with one line naming the flag.

The hostile command lines are tests/hostile/cli.py; the hostile spec files are in
tests/hostile/corpus.py (run by tests/test_hostile.py). Here: those command lines, the forms the
docs show (YAML 1.2 booleans, numeric stack order, a JSON byte-order mark), launcher variables
for a data-parallel launch, hints that are accepted when followed, and file modes.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import write_st  # noqa: E402
from execute_support import cli_run, one_line  # noqa: E402
from hostile.cli import FLAGS, Flag  # noqa: E402
from hostile.corpus import GOOD, MODEL, RULES, VALID  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import BindError, SpecError, shorten, shorten_words  # noqa: E402
from planc.plan.codec import encode, save_plan  # noqa: E402
from planc.spec.model import load_spec  # noqa: E402
from planc.tools.synth import write_checkpoint  # noqa: E402

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for v in LAUNCHER:
        monkeypatch.delenv(v, raising=False)
    (tmp_path / MODEL).write_bytes(VALID)
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD + RULES)
    plan = compile_spec(spec)
    save_plan(plan, tmp_path / "plan.json")
    (tmp_path / "trunc.json").write_text(encode(plan)[:200])
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("case", FLAGS, ids=[f.name for f in FLAGS])
def test_hostile_flag(folder, capsys, monkeypatch, case: Flag):
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    rc, out, err = cli_run(capsys, *[a.replace("{d}", str(folder)) for a in case.args])
    line = one_line(err)
    assert rc == case.rc and out == "", (rc, out, line)
    assert line.endswith(f"[{case.code}]"), line
    assert all(w in line for w in case.words), (case.words, line)


def test_unreadable_spec_is_one_line(folder, capsys, monkeypatch):
    """A spec the user may not read (as a non-root user: chmod 000) is `[spec-unreadable]`, not the
    argument parser's usage box. Simulated, since the tests may run as root."""
    spec = str(folder / "spec.yaml")
    real_open, real_access = os.open, os.access

    def deny_open(path, *a, **k):
        if os.fspath(path) == spec:
            raise PermissionError(13, "Permission denied", spec)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", deny_open)
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if os.fspath(p) == spec else real_access(p, m, **k))
    for cmd in ("compile", "explain", "run"):
        rc, out, err = cli_run(capsys, cmd, spec)
        line = one_line(err)
        assert rc == 2 and out == "" and "spec.yaml" in line and "Permission denied" in line, line
        assert line.endswith("[spec-unreadable]"), line


def test_report_checked_before_the_load(folder, capsys, monkeypatch):
    import planc.execute as ex

    called = []
    monkeypatch.setattr(ex, "execute", lambda *a, **k: called.append(1))
    rc, _, err = cli_run(capsys, "run", folder / "plan.json", "--report", folder / "nope" / "r.json")
    assert rc == 2 and "--report" in one_line(err) and called == []


# ------------------------------------------------------------------------------------------
# documented forms


def test_yaml_12_booleans_on_off_yes_no_are_strings(folder):
    spec = folder / "s.yaml"
    spec.write_text("checkpoint: model.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2, direct: off}\n"
                    "rules:\n  - match: w\n    on: host\n    dtype: keep\n  - match: '*'\n    skip: true\n")
    s = load_spec(spec).spec
    assert s.io.direct == "off" and s.rules[0].on == "host" and s.rules[1].skip is True
    spec.write_text(spec.read_text().replace("direct: off", "direct: on"))
    assert load_spec(spec).spec.io.direct == "on"
    for word in ("yes", "no", "y", "n", "On", "OFF", "on", "off"):  # strings, as values and as keys
        spec.write_text(GOOD + f"rules: [{{match: {word}}}, {{match: '*', {word}: 1}}]\n")
        with pytest.raises(SpecError, match=f"rules\\[1\\].{word}: "):
            load_spec(spec)
        spec.write_text(GOOD + f"rules: [{{match: {word}}}, {{match: '*'}}]\n")
        assert load_spec(spec).spec.rules[0].match == word
    for word, value in (("true", True), ("True", True), ("FALSE", False)):
        spec.write_text(GOOD + f"rules: [{{match: '*', skip: {word}}}]\n")
        assert load_spec(spec).spec.rules[0].skip is value


def test_yaml_keeps_merge_keys_and_anchors(folder):
    spec = folder / "s.yaml"
    spec.write_text("checkpoint: model.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2}\n"
                    "rules:\n  - &r {match: w, dtype: keep}\n  - {<<: *r, match: '*'}\n")
    s = load_spec(spec).spec
    assert [r.match for r in s.rules] == ["w", "*"]


def test_numeric_stack_order(tmp_path):
    t = {f"l.0.e.{e}.w": np.full((2, 4), e, np.float32) for e in range(4)}
    write_st(tmp_path / "m.safetensors", t)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: m.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2}\nrules:\n"
                    "  - match: 'l.{L}.e.{E}.w'\n    stack: {into: 'l.{L}.experts', over: E, order: [3, 2, 1, 0]}\n")
    assert load_spec(spec).spec.rules[0].stack.order == ["3", "2", "1", "0"]
    plan = compile_spec(spec)
    parts = [p for p in plan.parts if p.tensor == "l.0.experts"]
    assert [p.inputs[0].tensor for p in sorted(parts, key=lambda p: p.dst_offset)] == [f"l.0.e.{e}.w" for e in (3, 2, 1, 0)]


def test_json_spec_with_byte_order_mark(folder):
    spec = folder / "s.json"
    spec.write_bytes(b"\xef\xbb\xbf" + json.dumps({"checkpoint": MODEL, "budget": {"host": "64MiB"},
                                                  "io": {"slot": 4096, "slots": 2}, "rules": [{"match": "*"}]}).encode())
    assert load_spec(spec).spec.checkpoint == MODEL
    assert compile_spec(spec).fits


def test_duplicate_key_in_a_nested_json_object_names_its_lines(folder):
    spec = folder / "s.json"
    spec.write_text('{"checkpoint": "model.safetensors",\n "budget": {"host": 1,\n  "host": 2},\n'
                    ' "rules": [{"match": "*"}]}\n')
    with pytest.raises(SpecError, match=r"s.json:3: duplicate key 'host': first at line 2, again at line 3") as e:
        load_spec(spec)
    assert e.value.code == "spec-duplicate-key"


def test_device_forms(folder):
    spec = folder / "s.yaml"
    for dev in ("cuda", "cuda:0", "cuda:7"):
        spec.write_text(GOOD + RULES + f"device: '{dev}'\n")
        assert load_spec(spec).spec.device == dev
    for dev in ("cuda:banana", "cpu", "cuda:-1", "cuda:"):
        spec.write_text(GOOD + RULES + f"device: '{dev}'\n")
        with pytest.raises(SpecError, match="device"):
            load_spec(spec)


# ------------------------------------------------------------------------------------------
# launcher variables


def test_data_parallel_replicas_each_load_the_whole_plan(folder, capsys, monkeypatch):
    """Without tensor_parallel, RANK/WORLD_SIZE are a data-parallel launch (torchrun, SLURM): every
    replica compiles and explains the whole plan; `{rank}` in --report is the replica's RANK."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for target in ("spec.yaml", "plan.json"):
        rc, out, _ = cli_run(capsys, "explain", folder / target, "--json")
        assert rc == 0 and json.loads(out)["totals"]["tensors"] == 2
    rc, out, _ = cli_run(capsys, "compile", folder / "spec.yaml")
    assert rc == 0 and out.startswith("admitted: 2 tensors")


def test_data_parallel_run(folder):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    p = subprocess.run([sys.executable, "-m", "planc", "run", str(folder / "spec.yaml"), "--json", "--verify",
                        "--report", str(folder / "rep-{rank}.json")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    rep = json.loads((folder / "rep-1.json").read_text())
    assert rep["verify"]["ok"] and rep["tensor_parallel"] == {"rank": 0, "size": 1}


# ------------------------------------------------------------------------------------------
# hints, names, modes


def _tp_spec(tmp_path, rule: str, size: int = 3) -> Path:
    spec = tmp_path / "tp.yaml"
    spec.write_text("checkpoint: m.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2}\n"
                    f"tensor_parallel: {{size: {size}}}\nrules:\n{rule}  - match: '*'\n")
    return spec


def test_uneven_split_hint_is_accepted(tmp_path):
    write_st(tmp_path / "m.safetensors", {"w": np.ones((4, 6), np.float32), "b": np.ones(2, np.float32),
                                          "a.q": np.ones((4, 6), np.float32), "a.k": np.ones((4, 6), np.float32)})
    spec = _tp_spec(tmp_path, "  - match: w\n    split: {dim: 0}\n")
    with pytest.raises(BindError, match=r"split: \{dim: 0, pad: true\}") as e:
        compile_spec(spec, 0)
    hint = str(e.value).split("with ")[-1].split(" [")[0]
    spec = _tp_spec(tmp_path, f"  - match: w\n    {hint}\n")
    assert all(compile_spec(spec, r).fits for r in range(3))
    # where padding is not accepted (a later dim, a fused group) the hint does not offer it
    for rule in ("  - match: w\n    split: {dim: 1, pad: false}\n",
                 "  - match: 'a.{P}'\n    split: {dim: 0}\n    fuse: {into: a.qk, over: P, order: [q, k]}\n"):
        with pytest.raises(BindError, match="not divisible") as e:
            compile_spec(_tp_spec(tmp_path, rule, size=4 if "dim: 1" in rule else 3), 0)
        assert "pad" not in str(e.value) and "split: replicate" in str(e.value)


def test_long_names_are_shortened_in_error_lines(tmp_path, capsys):
    name = "x" * 5000
    write_st(tmp_path / "m.safetensors", {name: np.ones(4, np.float32)})
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: m.safetensors\nbudget: {host: 64MiB}\nrules: [{match: y}]\n")
    rc, _, err = cli_run(capsys, "compile", spec)
    line = one_line(err)
    assert rc == 2 and len(line) < 400 and "(5,000 characters);" in line and line.endswith("[unmatched]")
    assert shorten("short") == "short" and len(shorten("a" * 1000)) < 130
    assert shorten_words("a b c") == "a b c"


def test_synth_data_shards_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        for sparse in (False, True):
            res = write_checkpoint(tmp_path / f"s{sparse}", "dense", shards=2, sparse=sparse)
            assert {oct(Path(f).stat().st_mode & 0o777) for f in res.files} == {"0o644"}, sparse
    finally:
        os.umask(old)


def test_uneven_split_of_a_dequantized_weight_offers_no_padding(tmp_path):
    write_checkpoint(tmp_path / "ckpt", "fp8")
    spec = tmp_path / "tp.yaml"
    spec.write_text("checkpoint: ckpt\nbudget: {host: 64MiB}\ntensor_parallel: {size: 3}\nrules:\n"
                    "  - match: '*'\n    source_dtype: [F8_E4M3]\n    dequantize: {block: 128}\n    split: {dim: 0}\n"
                    "  - match: '*'\n")
    with pytest.raises(BindError, match="not divisible") as e:
        compile_spec(spec, 0)
    assert "pad" not in str(e.value), e.value

"""The command line: exit codes, one-line errors, JSON outputs (the explain --json contract)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pathlib import Path

import numpy as np
import pytest

from conftest import write_spec, write_st
from planc import __version__
from planc.face.cli import main
from planc.plan.codec import load_plan

RULES = [{"match": "*.w", "dtype": "float16"}, {"match": "*"}]


@pytest.fixture
def ckpt(tmp_path):
    write_st(tmp_path / "m.safetensors", {"l.0.w": np.ones((8, 64), np.float32), "l.0.b": np.ones(64, np.float32),
                                          "emb": np.ones((16, 16), np.float16)})
    return tmp_path


def spec(folder, *, host="1MiB", device=None, name="spec.yaml", rules=RULES):
    budget = {"host": host} if device is None else {"host": host, "device": device}
    return write_spec(folder, {"checkpoint": "m.safetensors", "budget": budget,
                               "io": {"slot": 4096, "slots": 2, "run": 2048, "merge_gap": 0}, "rules": rules}, name)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    o, e = capsys.readouterr()
    return rc, o, e


def one_line_error(e: str) -> str:
    lines = e.strip().splitlines()
    assert len(lines) == 1, e
    assert "Traceback" not in e
    assert lines[0].startswith("planc: ")
    return lines[0]


def test_version(capsys):
    assert run(capsys, "--version")[:2] == (0, f"planc {__version__}\n")


def test_schema(capsys):
    rc, o, _ = run(capsys, "schema")
    assert rc == 0
    s = json.loads(o)
    assert {"checkpoint", "budget", "io", "rules"} <= set(s["properties"])


def test_the_schema_takes_every_shipped_spec_and_refuses_what_the_spec_refuses(capsys):
    """`planc schema` is a JSON Schema a script can check specs with: the shipped specs (byte sizes
    as text, yes/no words) validate against it; what the spec itself refuses, it refuses too."""
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    rc, o, _ = run(capsys, "schema")
    schema = json.loads(o)
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    specs = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.yaml"))
    assert len(specs) >= 8
    for f in specs:
        doc = yaml.safe_load(f.read_text())
        assert not list(v.iter_errors(doc)), (f.name, [e.message for e in v.iter_errors(doc)][:3])
    base = {"checkpoint": "ckpt", "budget": {"host": "64MiB"}, "rules": [{"match": "*"}]}
    assert v.is_valid(dict(base, io={"slot": "4KiB", "merge_gap": 0}))
    assert v.is_valid(dict(base, rules=[{"match": "a", "skip": "yes"}, {"match": "*", "transpose": 1}]))
    assert v.is_valid(dict(base, rules=[{"match": "a", "skip": "Yes"}, {"match": "*", "transpose": "tRUE"}]))
    for bad in ({"host": -5}, {"host": "5 parsecs"}, {"host": 2**62 + 1}, {"host": True}):
        assert not v.is_valid(dict(base, budget=bad)), bad
    assert not v.is_valid(dict(base, rules=[{"match": "*", "skip": "maybe"}]))


def test_inspect_json(capsys, ckpt):
    rc, o, _ = run(capsys, "inspect", ckpt / "m.safetensors", "--json")
    assert rc == 0
    d = json.loads(o)
    assert d["tensors"] == 3 and d["total_bytes"] == 2048 + 256 + 512
    assert d["by_dtype"] == {"F16": {"tensors": 1, "bytes": 512}, "F32": {"tensors": 2, "bytes": 2304}}
    assert [x["name"] for x in d["largest"]] == ["l.0.w", "emb", "l.0.b"]
    assert [s["path"] for s in d["shards"]] == ["m.safetensors"] and d["shards"][0]["tensors"] == 3


def test_inspect_text(capsys, ckpt):
    rc, o, _ = run(capsys, "inspect", ckpt)
    assert rc == 0 and "3 tensors" in o


def test_compile_writes_plan(capsys, ckpt):
    rc, o, e = run(capsys, "compile", spec(ckpt), "-o", ckpt / "plan.json")
    assert rc == 0 and e == ""
    assert o.startswith("admitted: 3 tensors") and "plan.json" in o
    plan = load_plan(ckpt / "plan.json")
    assert plan.fits and plan.totals.tensors == 3


def test_refused_compile_exits_3_with_reason(capsys, ckpt):
    rc, o, e = run(capsys, "compile", spec(ckpt, host=4096), "-o", ckpt / "plan.json")
    assert rc == 3
    last = one_line_error(e)  # stderr holds the error line alone, as for every error
    assert last.startswith("planc: refused: run 0 needs 8,192 bytes") and last.endswith("[host-budget]")
    assert "io.slots (now 2)" in last
    assert "[host-budget] run 0, step alloc:ring" in " ".join(o.split())  # the explanation, on stdout, names code, run and step
    assert not load_plan(ckpt / "plan.json").fits  # the plan is written all the same


def test_refused_compile_json(capsys, ckpt):
    rc, o, e = run(capsys, "compile", spec(ckpt, host=4096), "--json")
    assert rc == 3
    assert json.loads(o)["refusal"]["code"] == "host-budget"
    assert one_line_error(e).endswith("[host-budget]")


def test_invalid_spec_exits_2_with_one_line(capsys, ckpt):
    p = ckpt / "bad.yaml"
    p.write_text("checkpoint: m.safetensors\nbudget:\n  host: 1GiB\nrules:\n  - match: '*'\n    dtype: float8\n")
    rc, o, e = run(capsys, "compile", p)
    assert rc == 2 and o == ""
    line = one_line_error(e)
    assert f"{p}:6: rules[0].dtype:" in line and line.endswith("[spec-invalid]")


def test_missing_spec_exits_2(capsys, tmp_path):
    rc, _, e = run(capsys, "explain", tmp_path / "none.yaml")
    assert rc == 2 and one_line_error(e).endswith("[spec-missing]")


def test_bind_error_exits_2(capsys, ckpt):
    rc, _, e = run(capsys, "compile", spec(ckpt, rules=[{"match": "l.*"}]))
    assert rc == 2
    assert "1 tensor(s) match no rule: emb;" in one_line_error(e)


def test_malformed_checkpoint_exits_2(capsys, tmp_path):
    (tmp_path / "m.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    rc, _, e = run(capsys, "compile", spec(tmp_path))
    assert rc == 2
    assert "m.safetensors" in one_line_error(e)
    rc, _, e = run(capsys, "inspect", tmp_path / "m.safetensors")
    assert rc == 2 and one_line_error(e)


def test_unknown_command_exits_2(capsys):
    assert run(capsys, "nosuch")[0] == 2


def test_explain_plan_equals_explain_spec(capsys, ckpt):
    p = spec(ckpt, device="1MiB")
    assert run(capsys, "compile", p, "-o", ckpt / "plan.json")[0] == 0
    rc1, from_spec, _ = run(capsys, "explain", p, "--json")
    rc2, from_plan, _ = run(capsys, "explain", ckpt / "plan.json", "--json")
    assert rc1 == rc2 == 0
    a, b = json.loads(from_spec), json.loads(from_plan)
    # Identical but for where each plan came from (compiled and stored in the plan cache / a plan file).
    assert (a.pop("source"), b.pop("source"), b.pop("cache_entry")) == ("compiled", "plan file", None)
    assert a.pop("cache_entry") and a == b
    rc, text_spec, _ = run(capsys, "explain", p)
    rc, text_plan, _ = run(capsys, "explain", ckpt / "plan.json")
    assert "FITS" in text_spec and "plan: from the plan cache" in text_spec  # the second explain of the spec
    assert "plan cache" not in text_plan
    # From the budget table on, the two explanations are the same text.
    assert text_spec[text_spec.index("predicted peak"):] == text_plan[text_plan.index("predicted peak"):]


def test_explain_json_spec_is_compiled(capsys, ckpt):
    p = spec(ckpt, name="spec.json")
    rc, o, _ = run(capsys, "explain", p, "--json")
    assert rc == 0 and json.loads(o)["fits"] is True


RUN_KEYS = {"index", "tensors", "read_bytes", "host_peak_bytes", "device_peak_bytes"}
REFUSAL_KEYS = {"code", "run", "step", "needed_bytes", "allowed_bytes", "message"}


def check_contract(d: dict):
    assert isinstance(d["fits"], bool)
    assert set(d["budget"]) >= {"host_bytes", "device_bytes"}
    assert set(d["peak"]) >= {"host_bytes", "device_bytes"}
    for k in ("tensors", "read_bytes", "requests", "requests_uncoalesced", "copies", "copies_uncoalesced"):
        assert isinstance(d["totals"][k], int), k
    for i, r in enumerate(d["runs"]):
        assert RUN_KEYS <= set(r) and r["index"] == i
        assert all(isinstance(r[k], int) for k in RUN_KEYS)
    if d["refusal"] is not None:
        assert REFUSAL_KEYS <= set(d["refusal"])
    assert [t["name"] for t in d["tensors"]] == sorted(t["name"] for t in d["tensors"])
    assert len(d["tensors"]) == d["totals"]["tensors"]
    for t in d["tensors"]:
        assert set(t) == {"name", "shape", "dtype", "bytes"}
        assert all(isinstance(x, int) for x in t["shape"]) and isinstance(t["bytes"], int)


def test_explain_json_contract(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt), "--json")
    d = json.loads(o)
    check_contract(d)
    assert d["fits"] is True and d["refusal"] is None
    assert d["budget"] == {"host_bytes": 2**20, "device_bytes": None}
    assert d["peak"]["host_bytes"] == 8192
    assert d["totals"]["tensors"] == 3 and len(d["runs"]) >= 2
    assert max(r["host_peak_bytes"] for r in d["runs"]) == d["peak"]["host_bytes"]
    assert sum(r["read_bytes"] for r in d["runs"]) == d["totals"]["read_bytes"]
    assert d["tensors"] == [{"name": "emb", "shape": [16, 16], "dtype": "F16", "bytes": 512},
                            {"name": "l.0.b", "shape": [64], "dtype": "F32", "bytes": 256},
                            {"name": "l.0.w", "shape": [8, 64], "dtype": "F16", "bytes": 1024}]


def test_explain_json_contract_refused(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt, host="1MiB", device=100), "--json")
    assert rc == 0  # explaining a refusal is not an error
    d = json.loads(o)
    check_contract(d)
    assert d["fits"] is False and d["budget"]["device_bytes"] == 100
    r = d["refusal"]
    assert (r["code"], r["run"], r["allowed_bytes"]) == ("device-budget", 0, 100)
    assert r["needed_bytes"] == d["peak"]["device_bytes"]


def test_explain_text_refused_shows_code(capsys, ckpt):
    rc, o, _ = run(capsys, "explain", spec(ckpt, host=100))
    assert rc == 0 and "REFUSED" in o and "[host-budget] run 0, step alloc:ring" in " ".join(o.split())


def test_python_dash_m_exit_codes(ckpt):
    p = spec(ckpt, host=100)
    r = subprocess.run([sys.executable, "-m", "planc", "compile", str(p)], capture_output=True, text=True)
    assert r.returncode == 3
    assert r.stderr.strip().splitlines()[-1].endswith("[host-budget]")
    r = subprocess.run([sys.executable, "-m", "planc", "--version"], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, f"planc {__version__}\n")


@pytest.mark.parametrize("extra", [("--shards", "0"), ("--shards", "100000"), ("--seed", "-1"), ("--size", "0"),
                                   ("--size", "0KiB")], ids=["zero", "too-many", "seed", "size", "size-unit"])
def test_synth_bad_shards_exits_2_with_one_line(capsys, tmp_path, extra):
    """Each bad value is named by its flag; nothing is written."""
    rc, o, e = run(capsys, "synth", tmp_path / "ck", *extra)
    assert rc == 2 and o == ""
    assert extra[0].lstrip("-") in one_line_error(e) and e.strip().endswith("[usage]")
    assert extra[0] in e or extra[0] == "--shards"
    assert not (tmp_path / "ck").exists()


def test_synth_into_folder_with_other_checkpoint_exits_2(capsys, tmp_path):
    assert run(capsys, "synth", tmp_path)[0] == 0
    rc, o, e = run(capsys, "synth", tmp_path, "--shards", "2")
    assert rc == 2 and o == ""
    line = one_line_error(e)
    assert "model.safetensors" in line and "use an empty folder" in line and line.endswith("[usage]")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_run_reads_the_device_hint_of_a_saved_plan_only(tmp_path):
    """`planc run PLAN` starts the named device's context while the plan is read: the hint comes from
    a saved plan's own `device` key, never from a spec or anything else."""
    from planc.face.prestart import plan_device_hint as _plan_device_hint
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\ndevice: cuda:1\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 2}\n"
                    "rules:\n  - match: '*'\n")
    plan = tmp_path / "p.json"
    assert main(["compile", str(spec), "-o", str(plan)]) in (0, None)
    assert _plan_device_hint(plan) == "cuda:1"
    assert _plan_device_hint(spec) is None
    assert _plan_device_hint(tmp_path / "missing.json") is None
    fake = tmp_path / "fake.json"
    fake.write_text('{"rules": [], "device":"cuda:3"}')
    assert _plan_device_hint(fake) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert _plan_device_hint(fifo) is None  # not opened for a blocking read: a FIFO is no plan


def test_what_compile_admits_the_plan_reader_reads(capsys, ckpt):
    """Byte sizes stop at 2**62, the most a plan's figures may be: a budget at the limit compiles to a
    plan file that `run`/`explain` read; one byte more is the spec's error, not an unreadable plan."""
    s = spec(ckpt, host=str(2**62), device=str(2**62))
    rc, out, err = run(capsys, "compile", s, "-o", ckpt / "p.json")
    assert rc == 0, err
    assert run(capsys, "explain", ckpt / "p.json")[0] == 0
    for host in (str(2**62 + 1), "5000000TiB", str(2**63 - 1)):
        rc, out, err = run(capsys, "compile", spec(ckpt, host=host, name="big.yaml"))
        assert rc == 2 and "budget.host" in one_line_error(err) and "at most 2**62" in err, err


def test_demo_again_keeps_the_checkpoints_a_plan_was_compiled_against(capsys, tmp_path, monkeypatch):
    """`planc demo` writes the same bytes each time, so it leaves them in place: a plan compiled
    after the first demo still matches its checkpoint; a spec it cannot read is refused first."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    shipped = __import__("planc").__file__.rsplit("/", 1)[0] + "/specs/demo.yaml"
    (tmp_path / "specs" / "demo.yaml").write_text(open(shipped).read())
    assert main(["demo", "--no-run"]) == 0
    ck = tmp_path / "demo" / "dense" / "model.safetensors"
    before = ck.stat().st_mtime_ns
    assert main(["compile", "specs/demo.yaml", "-o", "plan.json"]) == 0
    assert main(["demo", "--no-run"]) == 0
    assert ck.stat().st_mtime_ns == before
    from planc.execute.pipeline.run import check_fingerprints

    check_fingerprints(load_plan("plan.json"))  # what `planc run` checks first: the files did not change
    capsys.readouterr()
    ck.write_bytes(ck.read_bytes()[:-1] + b"\x00")  # damaged: the demo puts the right bytes back
    assert main(["demo", "--spec", "nope.yaml", "--no-run"]) == 2
    assert "spec file not found" in capsys.readouterr().err and ck.read_bytes()[-1:] == b"\x00"
    assert main(["demo", "--no-run"]) == 0 and ck.read_bytes()[-1:] != b"\x00"
    (tmp_path / "demo" / "moe" / "model-00001-of-00002.safetensors").write_bytes(b"junk")  # another checkpoint's
    capsys.readouterr()
    assert main(["demo", "--no-run"]) == 2 and "already holds other checkpoint files" in capsys.readouterr().err


def test_text_output_to_a_pipe_is_not_cut_to_80_columns(capsys, ckpt, monkeypatch):
    """Into a file or a pipe (no terminal, no COLUMNS), tables keep their words: no cell ends in '…'."""
    monkeypatch.delenv("COLUMNS", raising=False)
    from planc.face import cli

    monkeypatch.setattr(cli, "out", cli._Console(emoji=False))
    monkeypatch.setattr(cli, "err", cli._Console(stderr=True, emoji=False))
    rc, o, e = run(capsys, "explain", spec(ckpt, host="4KiB"))
    assert rc == 0 and "REFUSED" in o and "alloc:ring" in o and "…" not in o, o

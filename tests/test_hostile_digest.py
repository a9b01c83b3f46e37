"""Hostile and careless digest files and `planc digest` outputs: each is one typed error line (exit 2),
nothing written over a file planc did not make, no traceback."""

from __future__ import annotations

import json
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import planc  # noqa: E402
from conftest import write_spec, write_st  # noqa: E402
from execute_support import cli_run, one_line  # noqa: E402
from planc.base.errors import DigestError  # noqa: E402
from planc.manifest import digest as dg  # noqa: E402

EXTENT = 64 << 10


@pytest.fixture
def one(tmp_path):
    """A folder holding one checkpoint file (about 200 KiB), a spec naming the file, and its digest."""
    ck = tmp_path / "ck"
    write_st(ck / "model.safetensors", {"a": np.arange(200 * 256, dtype=np.float32).reshape(200, 256),
                                        "b": np.ones(64, np.float32)})
    spec = write_spec(tmp_path, {"checkpoint": "ck/model.safetensors", "budget": {"host": "64MiB"},
                                 "io": {"slot": "64KiB", "slots": 4}, "rules": [{"match": "*"}]})
    d = tmp_path / "d.json"
    d.write_bytes(dg.encode(dg.make_digest(ck, extent_bytes=EXTENT)))
    return tmp_path, spec, d


def _resign(doc):
    doc["check"] = dg._check(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("case", ["array", "object"])
def test_deeply_nested_digest_is_a_format_error(one, capsys, case):
    folder, spec, d = one
    bad = folder / "deep.json"
    bad.write_bytes(b"[" * 100_000 + b"]" * 100_000 if case == "array" else b'{"a":' * 50_000 + b"1" + b"}" * 50_000)
    with pytest.raises(DigestError) as e:
        dg.read_digest(bad)
    assert e.value.code == "digest-format" and "nested" in str(e.value)
    for cmd in ("run", "explain"):
        rc, out, err = cli_run(capsys, cmd, spec, "--verify-digest", bad)
        assert rc == 2 and "[digest-format]" in one_line(err) and "deep.json" in err


@pytest.mark.parametrize("field,value", [("version", float(dg.VERSION)), ("extent_bytes", float(EXTENT)),
                                         ("leaf_bytes", float(EXTENT))])
def test_numbers_of_another_type_are_refused(one, field, value):
    _, _, d = one
    doc = json.loads(d.read_bytes())
    doc[field] = value
    d.write_text(_resign(doc))
    with pytest.raises(DigestError) as e:
        dg.read_digest(d)
    assert e.value.code == "digest-format" and e.value.exit_code == 2


@pytest.mark.parametrize("value", [123, {"a": 1}, ["d.json"], 1.5])
def test_digest_argument_of_another_type_is_a_typed_error(one, value):
    _, spec, _ = one
    with pytest.raises(DigestError) as e:
        planc.load(spec, verify="digest", digest=value)
    assert e.value.code == "digest" and e.value.exit_code == 2 and type(value).__name__ in str(e.value)


def test_digest_never_writes_over_the_index(tmp_path, capsys):
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "sh", "dense", shards=2)
    index = tmp_path / "sh" / "model.safetensors.index.json"
    before = index.read_bytes()
    for ckpt in (tmp_path / "sh", index):
        rc, out, err = cli_run(capsys, "digest", ckpt, "-o", index)
        assert rc == 2 and "[output-is-input]" in one_line(err) and "index.json" in err
    assert index.read_bytes() == before


def test_digest_never_writes_over_a_file_it_did_not_make(one, capsys):
    folder, spec, d = one
    notes = folder / "notes.txt"
    notes.write_text("my notes\n")
    rc, out, err = cli_run(capsys, "digest", folder / "ck", "-o", notes)
    assert rc == 2 and "[output-not-ours]" in one_line(err) and "notes.txt" in err
    assert notes.read_text() == "my notes\n"
    rc, out, err = cli_run(capsys, "digest", folder / "ck", "-o", spec)
    assert rc == 2 and "[output-not-ours]" in one_line(err)
    # a digest file is written over: planc made it
    rc, out, err = cli_run(capsys, "digest", folder / "ck", "-o", d)
    assert rc == 0, err
    assert dg.read_digest(d).extent_bytes == dg.EXTENT_BYTES
    # a file that is not a digest, at the default path, is not replaced either
    default = folder / "ck" / "planc-digest.json"
    default.write_text('{"mine": true}')
    rc, out, err = cli_run(capsys, "digest", folder / "ck")
    assert rc == 2 and "[output-not-ours]" in one_line(err)
    assert default.read_text() == '{"mine": true}'


@pytest.mark.parametrize("named", ["folder", "file"])
def test_default_digest_found_however_the_checkpoint_is_named(one, capsys, named):
    """`planc digest ck` writes ck/planc-digest.json; `planc digest ck/model.safetensors` writes
    ck/model.safetensors.planc-digest.json; `--verify-digest` finds either, whichever the spec names."""
    folder, spec, _ = one
    ck = folder / "ck"
    rc, out, err = cli_run(capsys, "digest", ck if named == "folder" else ck / "model.safetensors",
                           "--extent", "64KiB")
    assert rc == 0, err
    spec_dir = write_spec(folder, {"checkpoint": "ck", "budget": {"host": "64MiB"},
                                   "io": {"slot": "64KiB", "slots": 4}, "rules": [{"match": "*"}]}, "dir.yaml")
    for s in (spec, spec_dir):
        rc, out, err = cli_run(capsys, "run", s, "--json", "--verify-digest")
        assert rc == 0, err
        assert json.loads(out)["digest"]["ok"]
        model = planc.load(s, verify="digest")
        assert model.report["digest"]["ok"]
        model.free()

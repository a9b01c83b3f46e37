"""Every file planc writes could be someone's only copy: outputs onto devices, FIFOs, symlinks,
inputs and files planc did not make are refused, and nothing is replaced."""

from __future__ import annotations

import json
import os
import stat
import threading

import numpy as np
import pytest

from conftest import write_st
from planc.base import outputs
from planc.plan.costs import DEFAULTS, load_costs
from planc.plan.codec import load_plan, save_plan
from planc.tools.probe import read_doc
from planc.tools.synth import synth_made, write_checkpoint
from test_cli import ckpt, one_line_error, run, spec  # noqa: F401  (the fixture and helpers)


def _is_char_device(path) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/full"])
def test_an_output_on_a_device_node_is_refused_and_the_node_kept(dev, tmp_path):
    assert _is_char_device(dev)
    with pytest.raises(outputs.OutputError) as e:
        outputs.write(dev, b"x", "probe output")
    assert e.value.code == "output-not-file" and dev in str(e.value)
    assert _is_char_device(dev)


def test_probe_output_on_dev_null_is_refused_before_measuring(capsys, tmp_path):
    rc, o, e = run(capsys, "probe", tmp_path, "-o", "/dev/null")
    assert rc == 2 and "/dev/null" in one_line_error(e) and "[output-not-file]" in e
    assert _is_char_device("/dev/null")
    assert not list(tmp_path.iterdir())  # nothing measured, no scratch file left


def test_an_output_on_a_fifo_is_refused_and_never_opened(capsys, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, _, e = run(capsys, "probe", tmp_path, "-o", fifo)
    assert rc == 2 and "FIFO" in one_line_error(e)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_is_written_through_not_replaced(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"kind": "planc-probe"}))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    outputs.write(link, json.dumps({"kind": "planc-probe", "v": 2}), "probe output",
                  ours=lambda p: read_doc(p) is not None)
    assert link.is_symlink() and json.loads(real.read_text())["v"] == 2


def test_a_file_planc_did_not_write_is_not_replaced(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text('{"mine": true}')
    from planc.tools.probe import is_probe_file, save

    assert not is_probe_file(other)
    with pytest.raises(outputs.OutputError) as e:
        save({"kind": "planc-probe"}, other)
    assert e.value.code == "output-not-ours"
    assert other.read_text() == '{"mine": true}'


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
def test_a_probe_file_that_is_not_a_small_regular_file_is_not_read(kind, tmp_path):
    if kind == "fifo":
        p = tmp_path / "fifo"
        os.mkfifo(p)
    elif kind == "zero":
        p = "/dev/zero"
    else:
        p = tmp_path / "huge.json"
        p.write_text(" " * (2 << 20) + "{}")
    done = []
    t = threading.Thread(target=lambda: done.append(load_costs(p)), daemon=True)
    t.start()
    t.join(10)
    assert done == [DEFAULTS]  # returned at once, with the built-in figures


@pytest.mark.parametrize("onto", ["the spec", "a checkpoint file"])
def test_compile_onto_its_own_input_is_refused(capsys, ckpt, onto):  # noqa: F811
    s = spec(ckpt)
    target = s if onto == "the spec" else ckpt / "m.safetensors"
    before = target.read_bytes()
    rc, _, e = run(capsys, "compile", s, "-o", target)
    assert rc == 2 and "[output-is-input]" in one_line_error(e)
    assert target.read_bytes() == before


def test_compile_onto_a_hard_link_of_the_spec_is_refused(capsys, ckpt):  # noqa: F811
    s = spec(ckpt)
    os.link(s, ckpt / "alias.json")
    rc, _, e = run(capsys, "compile", s, "-o", ckpt / "alias.json")
    assert rc == 2 and "[output-is-input]" in one_line_error(e)


def test_run_report_onto_its_plan_is_refused(capsys, ckpt):  # noqa: F811
    s = spec(ckpt)
    plan = ckpt / "p.json"
    assert run(capsys, "compile", s, "-o", plan)[0] == 0
    before = plan.read_bytes()
    rc, _, e = run(capsys, "run", plan, "--report", plan)
    assert rc == 2 and "[output-is-input]" in one_line_error(e)
    assert plan.read_bytes() == before and load_plan(plan) is not None


def test_save_plan_onto_a_device_is_refused(ckpt):  # noqa: F811
    from planc.compiler.compile import compile_spec

    plan = compile_spec(spec(ckpt))
    with pytest.raises(outputs.OutputError):
        save_plan(plan, "/dev/null")
    assert _is_char_device("/dev/null")
    with pytest.raises(outputs.OutputError):
        save_plan(plan, ckpt / "m.safetensors")


def test_synth_never_replaces_a_checkpoint_it_did_not_write(capsys, tmp_path):
    theirs = tmp_path / "model.safetensors"
    write_st(theirs, {"w": np.arange(4, dtype=np.float32)})
    before = theirs.read_bytes()
    assert not synth_made(theirs)
    rc, _, e = run(capsys, "synth", tmp_path)
    assert rc == 2 and "not written by planc synth" in one_line_error(e)
    assert theirs.read_bytes() == before
    # Its own files it replaces (a second synth into the same folder), and --force replaces theirs.
    assert run(capsys, "synth", tmp_path, "--force")[0] == 0
    assert synth_made(theirs)
    assert run(capsys, "synth", tmp_path, "--seed", "1")[0] == 0


def test_synth_shards_and_index_are_marked_as_its_own(tmp_path):
    res = write_checkpoint(tmp_path, "dense", shards=2)
    assert all(synth_made(tmp_path / os.path.basename(f)) for f in res.files)
    assert synth_made(tmp_path / "model.safetensors.index.json")
    write_checkpoint(tmp_path, "dense", shards=2, seed=3)  # over its own files: allowed



def test_a_partial_file_goes_with_the_error_that_stopped_it(tmp_path):
    """`outputs.partial`: renamed onto its file when the block ends; an error in the block, or a
    rename that fails (a folder where the file goes), removes the partial file."""
    final = tmp_path / "x.bin"
    with outputs.partial(final) as tmp:
        tmp.write_bytes(b"ok")
    assert final.read_bytes() == b"ok" and sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
    with pytest.raises(OSError):
        with outputs.partial(tmp_path / "y.bin") as tmp:
            tmp.write_bytes(b"half")
            raise OSError(28, "No space left on device")
    (tmp_path / "z.bin").mkdir()
    with pytest.raises(OSError):
        with outputs.partial(tmp_path / "z.bin") as tmp:
            tmp.write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin", "z.bin"]


def test_synth_that_cannot_place_its_file_leaves_no_partial_file(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "model.safetensors").mkdir(parents=True)  # not a file, where the checkpoint goes
    rc, _, err = run(capsys, "synth", str(out), "--force")
    assert rc == 2 and "cannot write the checkpoint" in err
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_a_gguf_synth_stopped_by_a_full_disk_leaves_no_partial_file(tmp_path):
    """A real EFBIG (a file-size limit of 256 KiB) while the GGUF file is written."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "g"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

    r = subprocess.run([sys.executable, "-m", "planc", "synth", str(out), "--family", "gguf", "--size", "4MiB"],
                       preexec_fn=limit, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert list(out.iterdir()) == []


@pytest.fixture
def packaged_demo(monkeypatch):
    """`planc demo` as from a wheel: the spec shipped inside the package, written into --workdir."""
    from pathlib import Path

    from planc.face import demo

    shipped = Path(demo.__file__).resolve().parent.parent / "specs" / "demo.yaml"
    monkeypatch.setattr(demo, "_find_spec", lambda spec: (shipped, True))


def test_packaged_demo_never_replaces_a_demo_yaml_it_did_not_write(tmp_path, capsys, packaged_demo):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "demo.yaml").write_text("my own notes\n")
    rc, _, err = run(capsys, "demo", "--workdir", wd, "--no-run")
    assert rc == 2 and "demo.yaml" in one_line_error(err) and "did not write" in err
    assert (wd / "demo.yaml").read_text() == "my own notes\n"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "wd2").mkdir()
    os.symlink(tmp_path / "fifo", tmp_path / "wd2" / "demo.yaml")
    rc, _, err = run(capsys, "demo", "--workdir", tmp_path / "wd2", "--no-run")  # never opened: no hang
    assert rc == 2 and "not a regular file" in err


def test_packaged_demo_runs_again_on_its_own_spec(tmp_path, capsys, packaged_demo):
    wd = tmp_path / "wd"
    assert run(capsys, "demo", "--workdir", wd, "--no-run")[0] == 0
    first = (wd / "demo.yaml").stat().st_mtime_ns
    assert run(capsys, "demo", "--workdir", wd, "--no-run")[0] == 0
    assert (wd / "demo.yaml").stat().st_mtime_ns == first  # its own, unchanged: left as it was
    own = (wd / "demo.yaml").read_bytes()
    (wd / "demo.yaml").write_bytes(own.replace(b"rules:", b"# an older version's spec\nrules:", 1))
    assert run(capsys, "demo", "--workdir", wd, "--no-run")[0] == 0  # its own copy of another version
    assert (wd / "demo.yaml").read_bytes() == own


def test_packaged_demo_names_a_demo_yaml_that_is_not_text(tmp_path, capsys, packaged_demo):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "demo.yaml").write_bytes(b"\xff\xfe caf\xe9\n")
    rc, _, err = run(capsys, "demo", "--workdir", wd, "--no-run")
    assert rc == 2 and "demo.yaml" in err and "did not write" in err
    assert (wd / "demo.yaml").read_bytes() == b"\xff\xfe caf\xe9\n"


def _tp_spec(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert run(capsys, "synth", ck)[0] == 0
    spec = tmp_path / "tp.yaml"
    spec.write_text(f"checkpoint: {ck}\nbudget: {{host: 64MiB}}\nio: {{slot: 64KiB, slots: 4}}\n"
                    "tensor_parallel: {size: 2}\nrules:\n  - match: \"*\"\n")
    return spec


def test_compile_of_every_rank_replaces_only_its_own_rank_files(tmp_path, capsys):
    spec, out = _tp_spec(tmp_path, capsys), tmp_path / "out"
    assert run(capsys, "compile", spec, "--rank", "all", "-o", out)[0] == 0
    assert run(capsys, "compile", spec, "--rank", "all", "-o", out)[0] == 0  # its own plans: replaced
    assert load_plan(out / "rank-1.json").tensor_parallel.rank == 1
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (out / "rank-1.json").unlink()
    os.symlink(notes, out / "rank-1.json")
    rc, _, err = run(capsys, "compile", spec, "--rank", "all", "-o", out)
    assert rc == 2 and "symbolic link" in one_line_error(err) and notes.read_text() == "my notes\n"
    (out / "rank-1.json").unlink()
    (out / "rank-1.json").write_text("hand-written\n")
    before = (out / "rank-0.json").read_bytes()
    rc, _, err = run(capsys, "compile", spec, "--rank", "all", "-o", out)
    assert rc == 2 and "rank-1.json" in err and "did not write" in err
    assert (out / "rank-1.json").read_text() == "hand-written\n"
    assert (out / "rank-0.json").read_bytes() == before  # refused before any rank file was written


def test_a_yaml_spec_that_mentions_the_plan_marker_is_still_a_spec(tmp_path):
    from planc.face.filekind import is_plan_file, is_written_plan

    spec = tmp_path / "s.yaml"
    spec.write_text('# compile -o writes {"kind": "planc-plan", ...}\ncheckpoint: x.safetensors\n')
    assert not is_plan_file(spec) and not is_written_plan(spec)
    plan = tmp_path / "p.txt"
    plan.write_text('\n {"kind":"planc-plan","format":6}')
    assert is_plan_file(plan) and is_written_plan(plan)

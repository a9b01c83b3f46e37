"""Outputs onto every kind of path: planc writes a new file or over a regular file, never over a
device node, a FIFO, a symlink (it writes through it), an input of the command, a file it did not
make (the probe), and a failed write leaves the old file as it was."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from planc.plan import costs as costmodel
from planc.base import outputs
from planc.face.cli import main
from planc.compiler.compile import compile_spec
from planc.plan.codec import load_plan, save_plan
from planc.tools.probe import read_doc, save

PROBE_DOC = {"kind": "planc-probe", "page_s": 1e-7, "copy_byte_s": 1e-11, "read_byte_s": 1e-11, "request_s": 1e-5}


def _node(tmp_path):
    """A harmless character device of our own (the same numbers as /dev/null), in a tmp folder."""
    dev = tmp_path / "nulldev"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("mknod needs root")
    return dev


def _fifo(tmp_path):
    f = tmp_path / "fifo"
    os.mkfifo(f)
    return f


def _spec(tmp_path):
    save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(tmp_path / "m.safetensors"))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                                    "rules": [{"match": "w"}]}))
    return spec


@pytest.mark.parametrize("kind", ["device", "fifo", "folder"])
def test_special_files_are_refused_never_replaced(tmp_path, kind):
    path = {"device": _node, "fifo": _fifo, "folder": lambda t: (t / "d").mkdir() or t / "d"}[kind](tmp_path)
    mode = os.lstat(path).st_mode
    for ours in (None, lambda p: True):
        with pytest.raises(outputs.OutputError) as e:
            outputs.write(path, b"x", "probe output", ours=ours)
        assert str(path) in e.value.message and e.value.exit_code == 2
    assert os.lstat(path).st_mode == mode  # still the device / FIFO / folder
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_dev_null_and_dev_full_are_refused_and_untouched():
    for dev in ("/dev/null", "/dev/full"):
        before = os.stat(dev)
        with pytest.raises(outputs.OutputError, match="character device"):
            save(dict(PROBE_DOC), __import__("pathlib").Path(dev))
        after = os.stat(dev)
        assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_symlink_is_written_through(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(PROBE_DOC))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    save(dict(PROBE_DOC, page_s=2e-7), link)
    assert link.is_symlink() and json.loads(real.read_text())["page_s"] == 2e-7
    dev_link = tmp_path / "devlink"
    dev_link.symlink_to("/dev/null")
    with pytest.raises(outputs.OutputError, match="character device"):
        save(dict(PROBE_DOC), dev_link)
    assert dev_link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_probe_writes_only_over_its_own_file(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("my only copy\n")
    with pytest.raises(outputs.OutputError, match="did not write"):
        save(dict(PROBE_DOC), other)
    assert other.read_text() == "my only copy\n"
    assert main(["probe", str(tmp_path), "-o", str(other)]) == 2  # refused before measuring
    assert other.read_text() == "my only copy\n"
    ours = tmp_path / "probe.json"
    save(dict(PROBE_DOC), ours)
    save(dict(PROBE_DOC, page_s=3e-7), ours)
    assert json.loads(ours.read_text())["page_s"] == 3e-7


def test_probe_read_never_blocks_nor_reads_unbounded(tmp_path, monkeypatch):
    fifo = _fifo(tmp_path)
    done = []
    t = threading.Thread(target=lambda: done.append(read_doc(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert done == [None]
    assert read_doc(__import__("pathlib").Path("/dev/zero")) is None
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20) + "{}")
    assert read_doc(big) is None
    for p in (fifo, "/dev/zero", big):
        monkeypatch.setenv("PLANC_PROBE", str(p))
        assert costmodel.load_costs() is costmodel.DEFAULTS


def test_compile_output_onto_an_input_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path)
    text = spec.read_text()
    ckpt = (tmp_path / "m.safetensors").read_bytes()
    hard = tmp_path / "hard.yaml"
    os.link(spec, hard)
    for out in (spec, hard, tmp_path / "." / "s.yaml", tmp_path / "m.safetensors"):
        assert main(["compile", str(spec), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert "is an input" in err and err.count("\n") == 1
    assert spec.read_text() == text and (tmp_path / "m.safetensors").read_bytes() == ckpt
    plan = compile_spec(spec, 0)
    with pytest.raises(outputs.OutputError, match="is an input"):
        save_plan(plan, tmp_path / "m.safetensors")


def test_run_report_onto_the_plan_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    spec = _spec(tmp_path)
    plan_file = tmp_path / "p.json"
    assert main(["compile", str(spec), "-o", str(plan_file)]) == 0
    before = plan_file.read_bytes()
    capsys.readouterr()
    assert main(["run", str(plan_file), "--report", str(plan_file)]) == 2
    assert "is an input" in capsys.readouterr().err
    assert plan_file.read_bytes() == before
    load_plan(plan_file)


def test_read_only_folder_and_failed_write_keep_the_old_file(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "p.json").write_text("old")
    os.chmod(ro, 0o555)
    try:
        if os.geteuid() != 0:
            with pytest.raises(outputs.OutputError, match="not writable"):
                outputs.write(ro / "p.json", b"new", "plan output")
            assert (ro / "p.json").read_text() == "old"
    finally:
        os.chmod(ro, 0o755)
    # a write that fails half way (a full disk; here a file size limit) leaves the old file whole
    target = tmp_path / "out.json"
    target.write_text("old")
    code = ("import resource, signal, sys; from planc.base import outputs; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096));"
            f"\ntry:\n    outputs.write({str(target)!r}, b'x' * 100000, 'plan output')\n"
            "except outputs.OutputError as e:\n    print(e.code); sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2 and "output-unwritable" in r.stdout, r.stderr
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []

"""The `planc` process with its standard streams closed, full, or a pipe nobody reads (real processes).

The convention (docs/cli.md, "Output streams"; planc/face/stdio.py): stdout closed or full is one line
`cannot write output to stdout ... [output-failed]` and exit 2; a pipe whose reader has gone is
exit 141 and nothing on stderr; stderr closed keeps the exit code; no traceback, ever, and no
"Exception ignored" at the exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_spec, write_st
from planc.plan.codec import load_plan

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("streams")
    write_st(d / "m.safetensors", {"a": np.ones((8, 64), np.float32), "b": np.ones(64, np.float16)})
    spec = write_spec(d, {"checkpoint": "m.safetensors", "budget": {"host": "64MiB"}, "rules": [{"match": "*"}]})
    write_spec(d, {"checkpoint": "m.safetensors", "budget": {"host": 4096},
                   "io": {"slot": 4096, "slots": 2, "run": 2048, "merge_gap": 0}, "rules": [{"match": "*"}]},
               "tight.yaml")
    rc = subprocess.run(_cmd("compile", spec, "-o", d / "plan.json"), env=_env(), capture_output=True).returncode
    assert rc == 0
    return d


def _env() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PLANC_PROBE="off", PLANC_PLAN_CACHE="off")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("PLANC_DEBUG", None)
    return env


def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "planc", *map(str, args)]


def _planc(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close=()):
    """Run planc with the fds in `close` closed in the child; (rc, stdout bytes, stderr bytes)."""
    def pre():
        for fd in close:
            os.close(fd)
    p = subprocess.run(_cmd(*args), stdout=stdout, stderr=stderr, env=_env(), preexec_fn=pre if close else None,
                       timeout=120)
    return p.returncode, p.stdout or b"", p.stderr or b""


def _one_line(err: bytes) -> str:
    text = err.decode()
    lines = text.strip("\n").splitlines()
    assert len(lines) == 1 and "Traceback" not in text and "Exception ignored" not in text, text
    assert lines[0].startswith("planc: ")
    return lines[0]


COMMANDS = [("inspect", "{d}/m.safetensors"), ("explain", "{d}/plan.json", "--json"), ("schema",), ("--version",),
            ("compile", "{d}/spec.yaml"), ("compile", "--help")]


def _args(cmd, d):
    return [a.replace("{d}", str(d)) for a in cmd]


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_stdout_closed_is_one_line_and_exit_2(folder, cmd):
    rc, _, err = _planc(*_args(cmd, folder), stdout=None, close=(1,))
    line = _one_line(err)
    assert rc == 2 and "cannot write output to stdout" in line and line.endswith("[output-failed]")


def test_stdout_closed_leaves_a_written_plan_whole(folder, tmp_path):
    """With fd 1 closed the plan file is not given fd 1: what is printed never lands in it."""
    out = tmp_path / "p.json"
    rc, _, err = _planc("compile", folder / "spec.yaml", "-o", out, stdout=None, close=(1,))
    assert rc == 2 and "[output-failed]" in _one_line(err)
    assert load_plan(out).fits


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("cmd", COMMANDS[:4], ids=[" ".join(c) for c in COMMANDS[:4]])
def test_stdout_on_dev_full_is_one_line_and_exit_2(folder, cmd):
    with open("/dev/full", "w") as full:
        rc, _, err = _planc(*_args(cmd, folder), stdout=full)
    line = _one_line(err)
    assert rc == 2 and "No space left on device" in line and line.endswith("[output-failed]")


@pytest.mark.parametrize("cmd", COMMANDS[:4], ids=[" ".join(c) for c in COMMANDS[:4]])
def test_a_pipe_whose_reader_has_gone_is_exit_141_and_quiet(folder, cmd):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written: the first write gets EPIPE
    try:
        rc, _, err = _planc(*_args(cmd, folder), stdout=w)
    finally:
        os.close(w)
    assert rc == 141 and err == b"", err


def test_a_refused_compile_into_a_closed_pipe_ends_quietly_too(folder):
    """A pipe whose reader has gone ends the command as SIGPIPE would, whatever it was saying."""
    r, w = os.pipe()
    os.close(r)
    try:
        rc, _, err = _planc("compile", folder / "tight.yaml", stdout=w)
    finally:
        os.close(w)
    assert rc == 141 and err == b""


@pytest.mark.parametrize("args,want", [(("inspect", "{d}/nope.safetensors"), 2), (("explain", "{d}/m.safetensors"), 2),
                                       (("compile", "{d}/tight.yaml"), 3), (("inspect", "{d}/m.safetensors"), 0)])
def test_stderr_closed_keeps_the_exit_code(folder, args, want):
    rc, out, _ = _planc(*_args(args, folder), stderr=None, close=(2,))
    assert rc == want


def test_both_closed_keeps_the_exit_code(folder):
    rc, _, _ = _planc("inspect", folder / "nope.safetensors", stdout=None, stderr=None, close=(1, 2))
    assert rc == 2


def test_a_refused_compile_writes_one_line_on_stderr_and_its_explanation_on_stdout(folder):
    rc, out, err = _planc("compile", folder / "tight.yaml")
    line = _one_line(err)
    assert rc == 3 and line.endswith("[host-budget]")
    assert "host-budget" in out.decode() and "alloc:ring" in " ".join(out.decode().split())
    rc, out, err = _planc("compile", folder / "tight.yaml", "--json")
    assert rc == 3 and json.loads(out)["refusal"]["code"] == "host-budget" and _one_line(err)

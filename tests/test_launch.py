"""One process per rank, started by a launcher: each reads RANK / WORLD_SIZE / LOCAL_RANK.

The launcher here is a plain one (subprocesses with the variables torchrun sets); when torch is
installed, `torchrun --nproc-per-node 2 -m planc run` is run too. Ranks run under the CUDA
simulator (all ranks on the same simulated GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file


def _setup(tmp_path, n=2):
    rng = np.random.default_rng(1)
    t = {"a.weight": rng.standard_normal((8, 6)).astype(np.float32),
         "b.weight": rng.standard_normal((6, 8)).astype(np.float32),
         "norm": rng.standard_normal(6).astype(np.float32)}
    save_file(t, tmp_path / "m.safetensors")
    spec = {"checkpoint": "m.safetensors", "budget": {"host": "16MiB"}, "tensor_parallel": {"size": n},
            "io": {"slot": "4KiB", "slots": 2, "workers": 2},
            "rules": [{"match": "a.weight", "split": {"dim": 0}}, {"match": "b.weight", "split": {"dim": 1}},
                      {"match": "*"}]}
    (tmp_path / "tp.yaml").write_text(yaml.safe_dump(spec))
    return t


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(NUMBA_ENABLE_CUDASIM="1", **{k: str(v) for k, v in kw.items()})
    return env


def _check_reports(tmp_path, t, n):
    got = {}
    for r in range(n):
        rep = json.loads((tmp_path / f"rank-{r}.json").read_text())
        assert rep["tensor_parallel"] == {"rank": r, "size": n}
        assert rep["verify"]["ok"]
        got[r] = rep
    split = t["a.weight"].nbytes + t["b.weight"].nbytes
    assert all(g["payload_bytes"] == split // n + t["norm"].nbytes for g in got.values())


def test_one_process_per_rank(tmp_path):
    t = _setup(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "planc", "run", str(tmp_path / "tp.yaml"), "--verify", "--json",
                               "--report", str(tmp_path / "rank-{rank}.json")],
                              env=_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=0), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    _check_reports(tmp_path, t, 2)


def test_rank_outside_world_size_is_refused(tmp_path):
    _setup(tmp_path)
    p = subprocess.run([sys.executable, "-m", "planc", "run", str(tmp_path / "tp.yaml")],
                       env=_env(RANK=2, WORLD_SIZE=2), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "rank 2 is outside" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (torch) is not installed")
def test_torchrun_launches_one_process_per_rank(tmp_path):
    t = _setup(tmp_path)
    p = subprocess.run(["torchrun", "--nproc-per-node", "2", "-m", "planc", "run", str(tmp_path / "tp.yaml"),
                        "--verify", "--json", "--report", str(tmp_path / "rank-{rank}.json")],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    _check_reports(tmp_path, t, 2)

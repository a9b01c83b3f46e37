"""`compile`, `explain` and `inspect` need headers and budgets only: they import neither numba (the
GPU loader), nor numpy and ml_dtypes (tensor data), nor torch. Checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

from planc.tools.synth import write_checkpoint

PROBE = """
import json, sys
from planc.face.cli import main
for argv in {argvs!r}:
    try:
        main(argv)
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in ("numba", "numpy", "ml_dtypes", "torch", "planc.execute") if m in sys.modules)))
"""


def test_compile_explain_inspect_import_no_gpu_or_tensor_libraries(tmp_path):
    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 2}\nrules:\n  - match: '*'\n")
    plan = tmp_path / "p.json"
    argvs = [["compile", str(spec), "-o", str(plan)], ["explain", str(plan), "--json"], ["explain", str(spec)],
             ["inspect", str(tmp_path / "ck")], ["explain", str(plan), "--host", "1MiB"]]
    out = subprocess.run([sys.executable, "-c", PROBE.format(argvs=argvs)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert plan.exists()
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


GPU_PATH = """
import json, os, sys
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import planc, planc.face.api, planc.execute, planc.execute.pipeline.loader, planc.execute.kernels.dispatch, planc.execute.device.driver
import planc.execute.pipeline.model, planc.execute.pipeline.verify, planc.execute.device.launch, planc.execute.pipeline.kernelruns
import planc.execute.kernels.fp4_dispatch, planc.execute.kernels.gguf_dispatch
from planc.execute.device import seam
print(json.dumps([type(seam.device()).__name__, "numba" in sys.modules]))
"""


def test_the_gpu_executor_imports_no_numba():
    """On a GPU the executor is the driver seam and the shipped machine code: importing all of it, and
    choosing the device implementation, loads no numba (numba comes in only for a launch that no
    shipped code serves, or under the simulator)."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", GPU_PATH], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["Gpu", False]


def test_reading_a_saved_plan_imports_no_spec_models(tmp_path):
    """`explain PLAN` (and the run path's plan reading) never imports pydantic: neither the spec models
    nor the CLI library's parameter coercion (typer is kept below 0.29, whose coercion uses pydantic)."""
    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 2}\nrules:\n  - match: '*'\n")
    plan = tmp_path / "p.json"
    first = subprocess.run([sys.executable, "-m", "planc", "compile", str(spec), "-o", str(plan)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    probe = """
import json, sys
from planc.face.cli import main
try:
    main(["explain", sys.argv[1], "--json"])
except SystemExit:
    pass
import planc.face.api
planc.face.api._plan(sys.argv[1], None)
print(json.dumps(sorted(m for m in ("pydantic", "networkx", "yaml", "planc.spec.model", "planc.compiler.compile") if m in sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", probe, str(plan)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_executor_imports_no_face():
    """execute/ sits below face/: it runs Plans; resolving specs and plan files (`face.target`), the
    API, the in-place module targets (`face.inplace`) and the hand-off into modules (`face.torch`)
    are the face's. A loaded model's own torch view (`LoadedModel.state_dict`) is the executor's
    (`execute.pipeline.torchview`), which `face.torch` builds on: no arrow runs up."""
    import ast
    from pathlib import Path

    import planc

    root = Path(planc.__file__).parent / "execute"
    found = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                if mod.lstrip(".").startswith("face") or mod.startswith("planc.face"):
                    found.append((rel, mod))
            elif isinstance(node, ast.Import):
                found += [(rel, a.name) for a in node.names if a.name.startswith("planc.face")]
    assert found == [], found


GPU_LAUNCHES = """
import json, os, sys
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
sys.path.insert(0, {tests!r})
import numpy as np
from execute_support import RecordingDevice
from planc.execute.device import seam
from planc.execute.kernels.fp4_dispatch import dequantize_fp4
from planc.execute.device.geometry import GpuGrid
from planc.execute.kernels.gguf_dispatch import dequantize_gguf

dev = RecordingDevice(seam.device(), grid=GpuGrid(132), forward=False)
dequantize_gguf(np.zeros(34, np.uint8), np.zeros(32, np.uint16), "Q8_0", "BF16", 32, dev=dev)
dequantize_fp4(np.zeros(16, np.uint8), np.zeros(1, np.uint8), None, np.zeros(64, np.uint8), "mxfp4", "BF16", 1, 1, 32,
               dev=dev)
print(json.dumps([[x[0] for x in dev.launches], "numba" in sys.modules]))
"""


def test_a_gpu_launch_of_the_format_kernels_imports_no_numba():
    """The GGUF and FP4 launchers hand the device a kernel name: the shipped machine code serves it
    (numba comes in only where none does). A launcher that built its numba kernels for each launch
    imported numba into every GGUF load (about 120 MB the plan does not count, and its import time)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = GPU_LAUNCHES.format(tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [["gguf_Q8_0_BF16", "mxfp4_BF16"], False]

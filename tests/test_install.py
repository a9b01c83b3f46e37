"""The non-editable install works: the wheel ships what `planc demo` needs.

The wheel is built from a copy of the sources (so the checkout gets no build/ folder), installed
with `pip install --no-deps --target` (the dependencies come from the running interpreter's
environment, which keeps this to seconds), and `planc demo --no-run` runs from a folder outside
the checkout, with the installed package first on the path.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.install


def _pip(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def _setuptools_recent() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


def test_wheel_installs_and_runs_the_demo(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "planc", src / "planc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so",
                                                                                 "native.json"))
    flags = ["--no-build-isolation"] if _setuptools_recent() else []  # else pip fetches setuptools for the build
    p = _pip("wheel", ".", "--no-deps", *flags, "-w", str(tmp_path / "dist"), cwd=src)
    if p.returncode and "No matching distribution" in p.stderr:
        pytest.skip(f"no package index to fetch the build backend from: {p.stderr.strip()[-200:]}")
    assert p.returncode == 0, p.stderr
    wheel = next((tmp_path / "dist").glob("planc-*.whl"))

    target = tmp_path / "site"
    p = _pip("install", "--no-deps", "--no-compile", "--target", str(target), str(wheel))
    assert p.returncode == 0, p.stderr
    assert (target / "planc" / "specs" / "demo.yaml").is_file()
    ptx = target / "planc" / "execute" / "kernels" / "ptx"  # the kernels' PTX ships: no compile at load time
    assert (ptx / "index.json").is_file() and len(list(ptx.glob("*.ptx"))) == len(list((ROOT / "planc" / "execute" / "kernels" / "ptx").glob("*.ptx")))
    assert (ptx / "cubins.json").is_file() and len(list(ptx.glob("*.cubin"))) == len(list(ptx.glob("*.ptx")))
    native = target / "planc" / "execute" / "io" / "native"  # the digest's loop, built by the wheel's build
    cc = shutil.which((os.environ.get("CC") or "cc").split()[0]) or shutil.which("gcc")
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and cc:
        assert (native / "readhash.x86_64-linux.so").is_file() and (native / "native.json").is_file()

    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "NUMBA_ENABLE_CUDASIM": "1"}
    where = subprocess.run([sys.executable, "-c", "import planc; print(planc.__file__)"], cwd=away, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(target)), where
    demo = subprocess.run([str(target / "bin" / "planc"), "demo", "--no-run", "--workdir", "w"], cwd=away, env=env,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "1. checkpoint" in demo.stdout and "2. compile + explain" in demo.stdout and "FITS" in demo.stdout
    assert (away / "w" / "demo.yaml").is_file() and (away / "w" / "dense" / "model.safetensors").is_file()
    assert not list(target.rglob("*.safetensors")), "the demo wrote into the installed package"

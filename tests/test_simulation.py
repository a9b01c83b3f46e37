"""One place decides whether the device is simulated (`planc.base.simulation`); the rest asks it or the device.

The package's source is read as Python (its syntax tree, so a message that names the variable for a
user does not count): only `planc/base/simulation.py` reads numba's flag or the environment variable, only
the choosing callers ask `simulation.simulated()`, and the kernel modules build for the target their
device hands them. Then the choice itself: NUMBA_ENABLE_CUDASIM read as numba reads it, in fresh
processes (numba fixes its mode at import), and the kernels the simulator's device is handed.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba is first imported, as tests/test_kernels.py

import planc  # noqa: E402
from planc.base import simulation  # noqa: E402

PACKAGE = Path(planc.__file__).resolve().parent
# Who may ask the choice: the seam choosing the device, and what runs before any device exists
# (`planc run`'s head start, `budget.device: auto` at compile, the demo, the PTX build's guard).
CALLERS = {"execute/device/seam.py", "face/prestart.py", "base/device.py", "face/demo.py", "execute/kernels/ptxbuild.py"}
KERNEL_MODULES = ("execute/kernels/kernels.py", "execute/kernels/gguf_kernels.py", "execute/kernels/fp4_kernels.py",
                  "execute/kernels/scatter.py")


def _trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def _reads_flag(tree) -> bool:
    """numba's flag (`config.ENABLE_CUDASIM`) or the variable as a key (`environ["NUMBA_ENABLE_CUDASIM"]`)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "ENABLE_CUDASIM"
               or isinstance(n, ast.Constant) and n.value in ("NUMBA_ENABLE_CUDASIM", "ENABLE_CUDASIM")
               for n in ast.walk(tree))


def _asks_simulated(tree) -> bool:
    """A call of a function named `simulated` (the choice), as opposed to a device's `simulated` attribute."""
    return any(isinstance(n, ast.Call) and (isinstance(n.func, ast.Name) and n.func.id == "simulated"
                                           or isinstance(n.func, ast.Attribute) and n.func.attr == "simulated")
               for n in ast.walk(tree))


def test_only_the_choosing_module_reads_the_simulator_flag():
    readers = {rel for rel, tree in _trees() if _reads_flag(tree)}
    assert readers == {"base/simulation.py"}


def test_only_the_choosing_callers_ask_whether_simulated():
    askers = {rel for rel, tree in _trees() if _asks_simulated(tree)}
    assert askers <= CALLERS | {"base/simulation.py"}, askers - CALLERS
    assert "execute/device/seam.py" in askers  # the device is chosen from it


def test_kernel_modules_are_handed_the_target():
    for rel in KERNEL_MODULES:
        tree = ast.parse((PACKAGE / rel).read_text())
        assert not _asks_simulated(tree) and not _reads_flag(tree), rel
        assert "config" not in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}, rel


def test_the_seam_has_no_choice_of_its_own():
    from planc.execute.device import seam

    assert not hasattr(seam, "_simulator_chosen")
    assert seam.Gpu.target == simulation.GPU and not seam.Gpu.simulated
    assert seam.Simulator.target == simulation.SIM and seam.Simulator.simulated
    dev = seam.default_device()
    assert dev.target == simulation.name() and dev.simulated == simulation.simulated()


def _fresh(env_value, code="import sys, planc.base.simulation as t; print(t.simulated(), t.name(), 'numba' in sys.modules)"):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if env_value is not None:
        env["NUMBA_ENABLE_CUDASIM"] = env_value
    env["PYTHONPATH"] = str(PACKAGE.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("value,sim", [(None, False), ("", False), ("0", False), ("1", True), ("2", True),
                                       ("yes", False)])
def test_the_variable_is_read_as_numba_reads_it_without_importing_numba(value, sim):
    assert _fresh(value) == [str(sim), simulation.SIM if sim else simulation.GPU, "False"]


def test_numba_and_the_choice_agree_in_a_process():
    code = ("import planc.base.simulation as t; from numba import config; "
            "print(t.simulated(), bool(config.ENABLE_CUDASIM))")
    assert _fresh("1", code) == ["True", "True"]


def test_choose_simulator_before_numba_is_imported():
    code = ("import planc.base.simulation as t; t.choose_simulator(); from planc.execute.device import seam; "
            "d = seam.default_device(); print(type(d).__name__, d.target)")
    assert _fresh("0", code) == ["Simulator", simulation.SIM]


def test_gguf_kernels_built_for_the_simulator_give_the_products_plainly():
    """The simulator's build multiplies plainly (its libdevice calls return NaN): Q4_K blocks (whose
    two products go through the target's multiply)
    dequantized by the kernels `gguf_kernels.kernels(SIM)` hands the simulator are the host's values."""
    if not simulation.simulated():
        pytest.skip("the simulator's kernels run only under the simulator")
    from numba import cuda

    from planc.execute.kernels import gguf_dispatch, gguf_kernels
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf
    from planc.execute.device.seam import Simulator
    from planc.execute.kernels.gguf_dequant import dequantize
    from planc.tools.synth_gguf import GGUFTensor, tensor_bytes

    assert set(gguf_kernels.kernels(simulation.SIM)) == set(gguf_dispatch.NAMES)
    raw = tensor_bytes(GGUFTensor("k.Q4_K", "Q4_K", (1, 256)))
    want = dequantize(raw, "Q4_K", (256,)).astype(np.float32)
    src, dst = cuda.to_device(raw), cuda.to_device(np.zeros(256, np.uint32))
    dequantize_gguf(src, dst, "Q4_K", "F32", 256, dev=Simulator())
    got = dst.copy_to_host().view(np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)

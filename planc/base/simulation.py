"""Whether this process's device is numba's CUDA simulator or a GPU: decided here, and only here.

Input: NUMBA_ENABLE_CUDASIM, read as numba reads it (an integer, non-zero: the simulator), or numba's
own flag once numba is imported (numba fixes its mode at import, so a process never mixes them).
Output: `simulated()` and `name()` (`SIM` or `GPU`, the target a kernel module builds for).

Everything else goes through here: the device seam picks `Simulator` or `Gpu` from it
(`planc.execute.device.seam.default_device`), and the kernel modules are handed the target by that device
(`gguf_kernels.kernels(target)`) instead of asking; `planc run`'s head start, `budget.device: auto`
and the demo ask here before numpy or numba is imported. This module imports the standard library alone.
"""

from __future__ import annotations

import os
import sys

SIM = "sim"  # numba's CUDA simulator: device memory is host memory, kernels run as Python threads
GPU = "gpu"  # a CUDA GPU through the driver
_ENV = "NUMBA_ENABLE_CUDASIM"


def simulated() -> bool:
    """True when this process's device is the CUDA simulator."""
    numba = sys.modules.get("numba")
    config = getattr(numba, "config", None)
    if config is not None and hasattr(config, "ENABLE_CUDASIM"):
        return bool(config.ENABLE_CUDASIM)
    try:
        return int(os.environ.get(_ENV, "0") or 0) != 0
    except ValueError:  # numba refuses such a value too; planc treats it as unset
        return False


def name() -> str:
    """`SIM` or `GPU`: what kernels are built for in this process."""
    return SIM if simulated() else GPU


def choose_simulator() -> None:
    """Ask for the simulator (a machine without a GPU); effective only before numba is imported."""
    os.environ[_ENV] = "1"


def choose_gpu() -> None:
    """Ask for the real target (building PTX); effective only before numba is imported."""
    os.environ[_ENV] = "0"

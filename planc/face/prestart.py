"""What `planc run` starts before its own imports: the CUDA driver and the load's device context.

The driver's start (`cuInit`, about 0.1 s) and the primary context (about 0.1 s more) are the
longest things a fresh process does before its first read, and they need nothing of the command
but the device. So `planc run` starts them on a thread first thing, from its raw arguments
(`--device`, else `$LOCAL_RANK`, else the `device` a saved plan names in its first 64 KiB), and
they overlap the imports of the CLI and the executor and the reading of the plan. Only a head
start: the command parses and checks its arguments as usual, and the load selects the device its
checked plan or `--device` names. This module imports only the standard library and the driver
binding (ctypes), never numpy or the CLI's libraries.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ..base import simulation

SNIFF = 1 << 16  # the bytes of a file's head that `head` reads
_DEVICE = re.compile(r"cuda(?::[0-9]{1,3})?")
_DEVICE_HINT = re.compile(rb'"device":"(cuda(?::[0-9]{1,3})?)"')
_VALUED = ("--device", "--rank", "--report")  # `planc run` options that take a value
_RANK = re.compile(r"[0-9]{1,3}")


def head(path: Path):
    """(size, the first 64 KiB) of a regular file; None when it is missing, or a FIFO, a device or a
    folder (opened without blocking and left to the reader that refuses it), or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return st.st_size, os.read(fd, SNIFF)
    except OSError:
        return None
    finally:
        os.close(fd)


def plan_device_hint(path: Path) -> str | None:
    """The device a saved plan names, from its first 64 KiB (the key follows the checkpoint's file
    list), so that its context can be made while the plan is read and checked; None for a spec or
    when not found. Only a hint: the checked plan decides, and nothing else is started from it."""
    got = head(path)
    if got is None or not got[1].startswith(b'{"kind":"planc-plan"'):
        return None
    m = _DEVICE_HINT.search(got[1])
    return m.group(1).decode() if m else None


def run_device(argv: list[str]) -> str | None:
    """The device `planc run ARGV` will load onto, as far as its raw arguments tell: `--device`,
    else `cuda:$LOCAL_RANK`, else the saved plan's own; None when unknown or not a device name."""
    target, device = None, None
    it = iter(argv)
    for a in it:
        if a == "--":
            target = target or next(it, None)
            break
        if a in _VALUED:
            v = next(it, None)
            if a == "--device":
                device = v
        elif a.startswith("--device="):
            device = a.split("=", 1)[1]
        elif not a.startswith("-") and target is None:
            target = a
    if device is None:
        local = os.environ.get("LOCAL_RANK", "").strip()
        if _RANK.fullmatch(local):  # anything else is left to the command, which names it
            device = f"cuda:{int(local)}"
    if device is None and target:
        device = plan_device_hint(Path(target))
    return device if device is not None and _DEVICE.fullmatch(device) else None


def start_run(argv: list[str]) -> None:
    """For `planc run ARGV`: start the driver, and the context of the device it will load onto,
    on a thread (nothing under the simulator); no BLAS thread per core in numpy's import (a value
    the user set is kept)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "--help" in argv or not gpu_present():
        return
    from ..execute.device import driver

    dev = run_device(argv)
    driver.prewarm(None if dev is None else (int(dev.split(":", 1)[1]) if ":" in dev else 0))


def gpu_present() -> bool:
    """Whether this process loads onto a GPU: not the simulator, a CUDA driver library, a device node.
    Asked before numpy or numba is imported (`planc run`'s head start, the demo)."""
    if simulation.simulated():
        return False
    import ctypes

    try:  # the driver library, without importing numba (which fixes simulator mode at import)
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))

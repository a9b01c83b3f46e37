"""Every PLANC_* setting read from the environment, in one place.

Each is read when it is used, not at import, so a test or a caller that sets the variable before
a load sees it take effect. docs/cli.md ("Environment variables") documents each one; a new setting
goes here and there, never as an `os.environ` read elsewhere in the package. The launcher
variables (RANK, WORLD_SIZE, LOCAL_RANK) and numba's own (NUMBA_*) belong to other programs and
are read where they are used.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOST_RESERVE = 256 * 2**20


class SettingError(ValueError):
    """A PLANC_* variable holds a value the setting cannot take."""


def _flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    return default if v is None else v != "0"


def raw_launch() -> bool:
    """PLANC_RAW_LAUNCH (default on): launch kernels through the driver; `0` sends every launch
    through numba's dispatcher, which compiles each kernel in the process."""
    return _flag("PLANC_RAW_LAUNCH", True)


def kernel_dir() -> Path:
    """PLANC_KERNEL_DIR: where the cubins of kernels numba had to compile are kept."""
    return Path(os.environ.get("PLANC_KERNEL_DIR") or Path.home() / ".cache" / "planc" / "kernels")


def numba_cache() -> bool:
    """PLANC_KERNEL_CACHE (default on): `0` turns off numba's own on-disk cache of compiled kernels."""
    return _flag("PLANC_KERNEL_CACHE", True)


def host_reserve_bytes() -> int:
    """PLANC_HOST_RESERVE: host memory kept free for everything else, a byte size; default 256 MiB."""
    v = os.environ.get("PLANC_HOST_RESERVE")
    if not v:
        return DEFAULT_HOST_RESERVE
    from .units import parse_bytes

    try:
        return parse_bytes(v)
    except ValueError as e:
        raise SettingError(f"PLANC_HOST_RESERVE: {e}") from None


def probe_file() -> Path | None:
    """PLANC_PROBE: the file `planc probe` writes and `planc compile` reads its I/O cost figures from;
    default ~/.cache/planc/io-probe.json (under $XDG_CACHE_HOME when set); `off`: None, the built-in
    figures are used whatever was measured."""
    v = os.environ.get("PLANC_PROBE")
    if v == "off":
        return None
    return Path(v) if v else default_probe_file()


def default_probe_file() -> Path:
    """Where `planc probe` keeps its figures unless PLANC_PROBE names a file."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planc" / "io-probe.json"


def debug() -> bool:
    """PLANC_DEBUG (set to anything): errors print their traceback after the one-line message."""
    return bool(os.environ.get("PLANC_DEBUG"))

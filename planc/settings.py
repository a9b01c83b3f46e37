"""Every PLANC_* setting read from the environment, in one place.

Each is read when it is used, not at import, so a test or a caller that sets the variable before
a load sees it take effect. A caller may also pass them as arguments (`planc.load(...,
settings={"host_reserve": "1GiB"})`, `execute(plan, settings=...)`): `overridden` puts them in
force, over the environment, for the duration of that call. docs/cli.md ("Environment
variables") documents each one; a new setting goes here and there, never as an `os.environ` read
elsewhere in the package. The launcher
variables (RANK, WORLD_SIZE, LOCAL_RANK) and numba's own (NUMBA_*) belong to other programs and
are read where they are used.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path

DEFAULT_HOST_RESERVE = 256 * 2**20


class SettingError(ValueError):
    """A PLANC_* variable holds a value the setting cannot take."""


# The settings a caller may pass by name, and the variables they stand for.
NAMES = {"raw_launch": "PLANC_RAW_LAUNCH", "kernel_dir": "PLANC_KERNEL_DIR", "kernel_cache": "PLANC_KERNEL_CACHE",
         "host_reserve": "PLANC_HOST_RESERVE", "probe": "PLANC_PROBE", "debug": "PLANC_DEBUG",
         "pin": "PLANC_PIN", "plan_cache": "PLANC_PLAN_CACHE"}
_overrides: dict[str, str] = {}  # variable -> value, while a call that was given settings runs
_lock = threading.Lock()


def _get(name: str) -> str | None:
    v = _overrides.get(name)
    return os.environ.get(name) if v is None else v


@contextmanager
def overridden(values=None):
    """`values` (setting name -> value: a bool, a byte size, a path or a string as the variable would
    hold it) in force over the environment until the block ends. Raises SettingError for a name
    that is not a setting or a value it cannot take, before anything is changed."""
    if not values:
        yield
        return
    unknown = sorted(set(values) - set(NAMES))
    if unknown:
        raise SettingError(f"unknown setting {', '.join(map(repr, unknown))}; the settings are {', '.join(NAMES)}")
    env = {}
    for k, v in values.items():
        if isinstance(v, bool):
            v = "1" if v else "0"
        elif isinstance(v, (int, os.PathLike)):
            v = str(os.fspath(v) if isinstance(v, os.PathLike) else v)
        elif not isinstance(v, str):
            raise SettingError(f"setting {k!r}: expected a bool, an integer, a path or a string, "
                               f"got {type(v).__name__}")
        env[NAMES[k]] = v
    if "PLANC_HOST_RESERVE" in env:
        _host_reserve(env["PLANC_HOST_RESERVE"])  # a bad size is refused now, naming the setting
    if (env.get("PLANC_PIN") or PIN_METHODS[0]) not in PIN_METHODS:  # empty: the default, as in the environment
        raise SettingError(f"setting 'pin': {env['PLANC_PIN']!r} is not one of {', '.join(PIN_METHODS)}")
    with _lock:
        saved = dict(_overrides)
        _overrides.update(env)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)


def _flag(name: str, default: bool) -> bool:
    v = _get(name)
    return default if v is None else v != "0"


def raw_launch() -> bool:
    """PLANC_RAW_LAUNCH (default on): launch kernels through the driver; `0` sends every launch
    through numba's dispatcher, which compiles each kernel in the process."""
    return _flag("PLANC_RAW_LAUNCH", True)


def kernel_dir() -> Path:
    """PLANC_KERNEL_DIR: where the cubins of kernels numba had to compile are kept."""
    return Path(_get("PLANC_KERNEL_DIR") or Path.home() / ".cache" / "planc" / "kernels")


def numba_cache() -> bool:
    """PLANC_KERNEL_CACHE (default on): `0` turns off numba's own on-disk cache of compiled kernels."""
    return _flag("PLANC_KERNEL_CACHE", True)


def host_reserve_bytes() -> int:
    """PLANC_HOST_RESERVE: host memory kept free for everything else, a byte size; default 256 MiB."""
    v = _get("PLANC_HOST_RESERVE")
    if not v:
        return DEFAULT_HOST_RESERVE
    return _host_reserve(v)


def _host_reserve(v: str) -> int:
    from .units import parse_bytes

    try:
        return parse_bytes(v)
    except ValueError as e:
        raise SettingError(f"PLANC_HOST_RESERVE: {e}") from None


def probe_file() -> Path | None:
    """PLANC_PROBE: the file `planc probe` writes and `planc compile` reads its I/O cost figures from;
    default ~/.cache/planc/io-probe.json (under $XDG_CACHE_HOME when set); `off`: None, the built-in
    figures are used whatever was measured."""
    v = _get("PLANC_PROBE")
    if v == "off":
        return None
    return Path(v) if v else default_probe_file()


def plan_cache_dir() -> Path | None:
    """PLANC_PLAN_CACHE: the folder compiled plans are kept in (`planc.plancache`); default
    ~/.cache/planc/plans (under $XDG_CACHE_HOME when set); `off`: no plan cache."""
    v = _get("PLANC_PLAN_CACHE")
    if v == "off":
        return None
    return Path(v) if v else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planc" / "plans"


def default_probe_file() -> Path:
    """Where `planc probe` keeps its figures unless PLANC_PROBE names a file."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planc" / "io-probe.json"


PIN_METHODS = ("register", "alloc")


def pin() -> str:
    """PLANC_PIN: how the pinned ring is made on a GPU: `register` (default: an anonymous mapping of
    transparent huge pages, registered with cuMemHostRegister, falling back to `alloc` where the
    driver refuses it) or `alloc` (cuMemHostAlloc)."""
    v = _get("PLANC_PIN") or "register"
    if v not in PIN_METHODS:
        raise SettingError(f"PLANC_PIN: {v!r} is not one of {', '.join(PIN_METHODS)}")
    return v


def debug() -> bool:
    """PLANC_DEBUG (set to anything): errors print their traceback after the one-line message."""
    return bool(_get("PLANC_DEBUG"))

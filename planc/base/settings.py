"""Every PLANC_* setting, in one place: a frozen, typed `Settings` value.

A load resolves its settings ONCE, at its entry (`planc.load`, `execute`): the environment's
PLANC_* variables, then the caller's overrides over them (`settings={"host_reserve": "1GiB"}` or a
`Settings`), strictly checked. The value is then passed down the call (execute -> its parts). For
the code a load runs that is not handed the value (the kernel loader's `raw_launch`/`kernel_dir`,
compile's `probe`), `using(s)` makes it the current settings of the calling context (a
`contextvars` variable: per thread, never process-global), and the accessor functions below
(`host_reserve_bytes()`, `pin()`, ...) read the current settings, else the environment at the time
of the call. Two loads in two threads with different settings each see their own.

docs/cli.md ("Environment variables") documents each one; a new setting goes here and there, never
as an `os.environ` read elsewhere in the package. The launcher variables (RANK, WORLD_SIZE,
LOCAL_RANK) and numba's own (NUMBA_*) belong to other programs and are read where they are used.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path

DEFAULT_HOST_RESERVE = 256 * 2**20
PIN_METHODS = ("register", "alloc")
# How a digest-verified load hashes (PLANC_DIGEST_HASH): the read-and-hash loop at its widest level
# or at one named (planc.execute.io.readhash.LEVELS), or Python's hasher on the reader's thread.
DIGEST_HASHES = ("best", "avx512", "avx2", "scalar", "python")
# How the load's thread calls the driver functions that only queue work (PLANC_ISSUE_GIL): holding the
# interpreter's lock (`hold`) or releasing it for the call as ctypes does by default (`release`).
ISSUE_GIL = ("hold", "release")
# What a finished load does with its pinned ring (PLANC_RING): unpins it (`fresh`), or keeps it pinned
# for the next load of this process (`kept`; `planc.warm_up` pins one ahead of the first).
RINGS = ("fresh", "kept")
# The settings that take one of a few names, and the names (the first is the default).
NAMED = {"pin": PIN_METHODS, "digest_hash": DIGEST_HASHES, "issue_gil": ISSUE_GIL, "ring": RINGS}


class SettingError(ValueError):
    """A setting (a PLANC_* variable, or a value passed as `settings=`) that does not exist or
    cannot take its value. `from_env`: the environment holds it (the loader calls that a SpecError
    `bad-env`), else the caller passed it."""

    def __init__(self, message: str, *, from_env: bool = False):
        super().__init__(message)
        self.from_env = from_env


# The settings a caller may pass by name, and the variables they stand for.
NAMES = {"raw_launch": "PLANC_RAW_LAUNCH", "kernel_dir": "PLANC_KERNEL_DIR", "kernel_cache": "PLANC_KERNEL_CACHE",
         "host_reserve": "PLANC_HOST_RESERVE", "probe": "PLANC_PROBE", "debug": "PLANC_DEBUG",
         "pin": "PLANC_PIN", "plan_cache": "PLANC_PLAN_CACHE", "digest_hash": "PLANC_DIGEST_HASH",
         "issue_gil": "PLANC_ISSUE_GIL", "ring": "PLANC_RING"}
_FLAGS = ("raw_launch", "kernel_cache", "debug")


def default_plan_cache() -> Path:
    """Where compiled plans are kept unless PLANC_PLAN_CACHE names a folder (`off`: nowhere)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planc" / "plans"


def default_probe_file() -> Path:
    """Where `planc probe` keeps its figures unless PLANC_PROBE names a file."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "planc" / "io-probe.json"


@dataclass(frozen=True)
class Settings:
    """The settings of one load, resolved once. Build one with `Settings.resolve(overrides)`.

    raw_launch (PLANC_RAW_LAUNCH, default on): launch kernels through the driver; off sends every
    launch through numba's dispatcher. kernel_dir (PLANC_KERNEL_DIR): where the cubins of kernels
    numba had to compile are kept. kernel_cache (PLANC_KERNEL_CACHE, default on): numba's own
    on-disk cache. host_reserve (PLANC_HOST_RESERVE): host bytes kept free for everything else,
    default 256 MiB. probe (PLANC_PROBE): the I/O probe file; None (`off`) for the built-in figures.
    debug (PLANC_DEBUG): errors print their traceback. pin (PLANC_PIN): how the pinned ring is made,
    `register` or `alloc`. plan_cache (PLANC_PLAN_CACHE): the folder compiled plans are kept in
    (`planc.compiler.plancache`); None (`off`) for no plan cache. digest_hash (PLANC_DIGEST_HASH):
    how a digest-verified load hashes, one of DIGEST_HASHES, default `best`. issue_gil (PLANC_ISSUE_GIL): `hold` (default) or `release`, how the driver calls that only queue
    work are made (`issue_gil()`). ring (PLANC_RING): `fresh` (default) or
    `kept`, whether a finished load's pinned ring stays pinned for the next (`ring()`)."""

    raw_launch: bool = True
    kernel_dir: Path = Path.home() / ".cache" / "planc" / "kernels"
    kernel_cache: bool = True
    host_reserve: int = DEFAULT_HOST_RESERVE
    probe: Path | None = None
    debug: bool = False
    pin: str = "register"
    plan_cache: Path | None = None
    digest_hash: str = "best"
    issue_gil: str = "hold"
    ring: str = "fresh"

    def __post_init__(self) -> None:
        # a Settings made directly (not through resolve) is checked too where a load would read a name
        for name, names in NAMED.items():
            if getattr(self, name) not in names:
                raise SettingError(f"setting {name!r} ({NAMES[name]}): {getattr(self, name)!r} is not one of "
                                   f"{', '.join(names)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The settings the PLANC_* variables hold (SettingError `from_env` for a value a setting
        cannot take)."""
        env = os.environ if environ is None else environ
        values = {}
        for name, var in NAMES.items():
            v = env.get(var)
            if name == "probe" and not v:
                values[name] = default_probe_file()
                continue
            if name == "plan_cache" and not v:
                values[name] = default_plan_cache()
                continue
            if v is None or (v == "" and name not in ("debug",)):
                continue
            if name in _FLAGS:  # a variable: set to anything but 0 (debug: to anything)
                values[name] = bool(v) if name == "debug" else v != "0"
            else:
                values[name] = _check(name, v, from_env=True)
        return cls(**values)

    @classmethod
    def resolve(cls, overrides: "Settings | Mapping | None" = None,
                environ: Mapping[str, str] | None = None) -> "Settings":
        """The environment's settings with `overrides` (setting name -> value, or a Settings) over
        them. Raises SettingError for an override that is not a mapping of known names to values
        they can take, before anything is changed."""
        if isinstance(overrides, Settings):
            return overrides
        base = cls.from_env(environ)
        if overrides is None:
            return base
        if not isinstance(overrides, Mapping):
            raise SettingError(f"settings: expected a mapping of setting name to value (or a Settings), got "
                               f"{type(overrides).__name__}; the settings are {', '.join(NAMES)}")
        unknown = sorted(map(str, set(overrides) - set(NAMES)))
        if unknown:
            raise SettingError(f"unknown setting {', '.join(map(repr, unknown))}; the settings are {', '.join(NAMES)}")
        return replace(base, **{k: _check(k, v) for k, v in overrides.items()})

    def to_env(self) -> dict[str, str]:
        """The PLANC_* variables that hold these settings (for a child process)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _FLAGS:
                out[NAMES[f.name]] = "1" if v else "0"
            elif f.name in ("probe", "plan_cache"):
                out[NAMES[f.name]] = "off" if v is None else str(v)
            else:
                out[NAMES[f.name]] = str(v)
        if not self.debug:
            out.pop("PLANC_DEBUG")
        return out


def _check(name: str, v, *, from_env: bool = False):
    """Setting `name`'s value `v`, typed: a bool for a flag (or "0"/"1" as the variable holds it), a
    byte size (an int, or a string such as "1GiB") for host_reserve, a path for kernel_dir and probe,
    one of NAMED[name] for pin, digest_hash, issue_gil and ring."""
    label = NAMES[name] if from_env else repr(name)
    where = NAMES[name] if from_env else f"setting {name!r} ({NAMES[name]})"
    if name in _FLAGS:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v in ("0", "1"):
            return v == "1"
        raise SettingError(f"setting {label}: expected a bool, got {type(v).__name__} {v!r}", from_env=from_env)
    if name == "host_reserve":
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise SettingError(f"{where}: expected a byte size (an integer or a string such as '1GiB'), got "
                               f"{type(v).__name__} {v!r}", from_env=from_env)
        from .units import parse_bytes

        if isinstance(v, int):
            try:  # the byte sizes' one parser: negative, or past 2**62, is no reserve
                return parse_bytes(v)
            except ValueError as e:
                raise SettingError(f"{where}: {e}", from_env=from_env) from None
        if not v:
            return DEFAULT_HOST_RESERVE

        try:
            return parse_bytes(v)
        except ValueError as e:
            raise SettingError(f"{where}: {e}", from_env=from_env) from None
    if name in ("kernel_dir", "probe", "plan_cache"):
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise SettingError(f"setting {label}: expected a path or a string, got {type(v).__name__} {v!r}",
                               from_env=from_env)
        if name == "probe":
            return None if v == "off" else (Path(v) if v else default_probe_file())
        if name == "plan_cache":
            return None if v == "off" else (Path(v) if v else default_plan_cache())
        return Path(v) if v else Settings.kernel_dir
    # pin, digest_hash, issue_gil, ring: one of a few names
    names = NAMED[name]
    if not isinstance(v, str):
        raise SettingError(f"setting {label}: expected one of {', '.join(names)}, got {type(v).__name__} "
                           f"{v!r}", from_env=from_env)
    v = v or names[0]  # empty: the default, as in the environment
    if v not in names:
        raise SettingError(f"{NAMES[name] if from_env else 'setting ' + repr(name)}: {v!r} is not one of "
                           f"{', '.join(names)}", from_env=from_env)
    return v


_current: contextvars.ContextVar[Settings | None] = contextvars.ContextVar("planc_settings", default=None)


def current() -> Settings:
    """The settings of the load running in this context (`using`), else the environment's now."""
    s = _current.get()
    return Settings.from_env() if s is None else s


@contextmanager
def using(s: Settings):
    """`s` is the current settings of this context (this thread, and the threads a load starts with
    `contextvars.copy_context()`) until the block ends."""
    token = _current.set(s)
    try:
        yield s
    finally:
        _current.reset(token)


@contextmanager
def overridden(values=None):
    """The environment's settings with `values` over them in force in this context until the block
    ends (`Settings.resolve`, then `using`). Raises SettingError before anything is changed."""
    base = _current.get()
    if base is not None and isinstance(values, Mapping):
        unknown = sorted(map(str, set(values) - set(NAMES)))
        if unknown:
            raise SettingError(f"unknown setting {', '.join(map(repr, unknown))}; the settings are {', '.join(NAMES)}")
        s = replace(base, **{k: _check(k, v) for k, v in values.items()})
    else:
        s = Settings.resolve(values)
    with using(s):
        yield s


def _field(name: str):
    s = _current.get()
    if s is not None:
        return getattr(s, name)
    v = os.environ.get(NAMES[name])
    if name in _FLAGS:
        return getattr(Settings, name) if v is None else (bool(v) if name == "debug" else v != "0")
    if name == "probe" and not v:
        return default_probe_file()
    if name == "plan_cache" and not v:
        return default_plan_cache()
    if v is None:
        return getattr(Settings, name)
    return _check(name, v, from_env=True)


def raw_launch() -> bool:
    """PLANC_RAW_LAUNCH (default on): launch kernels through the driver; `0` sends every launch
    through numba's dispatcher, which compiles each kernel in the process."""
    return _field("raw_launch")


def kernel_dir() -> Path:
    """PLANC_KERNEL_DIR: where the cubins of kernels numba had to compile are kept."""
    return _field("kernel_dir")


def numba_cache() -> bool:
    """PLANC_KERNEL_CACHE (default on): `0` turns off numba's own on-disk cache of compiled kernels."""
    return _field("kernel_cache")


def host_reserve_bytes() -> int:
    """PLANC_HOST_RESERVE: host memory kept free for everything else, a byte size; default 256 MiB."""
    return _field("host_reserve")


def probe_file() -> Path | None:
    """PLANC_PROBE: the file `planc probe` writes and `planc compile` reads its I/O cost figures from;
    default ~/.cache/planc/io-probe.json (under $XDG_CACHE_HOME when set); `off`: None, the built-in
    figures are used whatever was measured."""
    return _field("probe")


def pin() -> str:
    """PLANC_PIN: how the pinned ring is made on a GPU: `register` (default: an anonymous mapping of
    transparent huge pages, registered with cuMemHostRegister, falling back to `alloc` where the
    driver refuses it) or `alloc` (cuMemHostAlloc)."""
    return _field("pin")


def debug() -> bool:
    """PLANC_DEBUG (set to anything): errors print their traceback after the one-line message."""
    return _field("debug")


def plan_cache_dir() -> Path | None:
    """PLANC_PLAN_CACHE: the folder compiled plans are kept in (`planc.compiler.plancache`); default
    ~/.cache/planc/plans (under $XDG_CACHE_HOME when set); `off`: None, no plan cache."""
    return _field("plan_cache")


def digest_hash() -> str:
    """PLANC_DIGEST_HASH: how a digest-verified load hashes the bytes it reads: `best` (default: the
    read-and-hash loop, XXH3 with AVX-512 or AVX2 where the machine runs them), `avx512`, `avx2`,
    `scalar` (the loop at that level at most) or `python` (Python's hasher on the reader's thread).
    The digests are the same."""
    return _field("digest_hash")


def issue_gil() -> str:
    """PLANC_ISSUE_GIL: how a load calls the driver functions that only queue work on a stream (the
    async copies, event records and waits, kernel launches, the current context's look-up):
    `hold` (default) keeps the interpreter's lock through each call, a few microseconds; `release`
    lets it go for the call, as ctypes does, and the load's thread then waits to take it back from
    the reader threads after every call (`planc.execute.device.driver.issue_lib`)."""
    return _field("issue_gil")


def ring() -> str:
    """PLANC_RING: what a finished load does with its pinned ring: `fresh` (default: unpinned off the
    caller's path, each load pins its own) or `kept` (left pinned for the next load of this process
    on the same device with the same slot size, which then pins none; the report counts it in the
    load's host growth, `host.kept_ring_bytes`). `planc.warm_up(plan)` pins a ring ahead of the first
    load and keeps rings until `planc.release_ring()` (`planc.execute.io.ring.KEPT`)."""
    return _field("ring")

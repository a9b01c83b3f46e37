"""plancache: a spec and a rank -> the compiled `Plan`, from the plan cache when every key matches.

A compiled plan is kept as a plan file under the cache folder (`settings.plan_cache_dir`:
PLANC_PLAN_CACHE, default ~/.cache/planc/plans; `off` turns it off), named by the sha256 of its
keys: the spec's text and path, the checkpoint's path and its own stat (a file added to a folder
of shards changes the folder's), the planc version and plan format, a digest of the source of the
code a plan follows from (`code_digest`: the compiler, the plan, the spec, the manifest readers and
their base; a change of that code within one version is a miss), the target (rank, device,
the resolved device budget) and the cost figures compile would choose read methods by. A hit is
an entry that decodes through every check any plan file passes (`plan.decode`) and whose recorded
planc version, rank, spec digest, checkpoint path, device, device budget, costs and file
fingerprints (size, mtime of each checkpoint file) all equal today's: one differing key is a miss,
and the spec is compiled again. A corrupt, foreign or unreadable entry is ignored and replaced.
Entries are read only from a folder of the user's own that no one else can write (`trusted`): an
entry is a plan, and whoever can put one there chooses what a load of the spec does.

Writes are atomic: the plan goes to a new temporary file in the cache folder, then `os.replace`
puts it under its name, so concurrent processes read the old entry or the new one, never half of
one. A cache that cannot be written (read-only, full) costs the next call a compile, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from ..plan.records import Plan

MAX_ENTRY_BYTES = 128 << 20  # an entry is a plan file: planc.plan.codec.MAX_PLAN_BYTES


def _stamp(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


# The packages whose code decides what a spec compiles to.
_PLAN_CODE = ("base", "compiler", "manifest", "plan", "spec")
_code: list = []


def code_digest() -> str:
    """The sha256 of the source of every module of `_PLAN_CODE` (paths and bytes, in path order),
    worked out once a process: the plans of one version compiled by other code are other entries."""
    if not _code:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for sub in _PLAN_CODE:
            for f in sorted((root / sub).rglob("*.py")):
                if f.name.startswith(".") or not f.is_file():  # an editor's lock link, a folder named *.py
                    continue
                h.update(str(f.relative_to(root)).encode() + b"\0")
                try:
                    h.update(f.read_bytes())
                except OSError as e:  # unreadable: its name and why stand for it
                    h.update(f"<{type(e).__name__}>".encode())
        _code.append(h.hexdigest())
    return _code[0]


def cache_key(loaded, rank: int, costs, device_budget) -> str:
    """The entry's name: the sha256 of every key (spec, checkpoint, version, code, target, costs)."""
    import planc

    from ..plan.check import FORMAT

    doc = {"planc": planc.__version__, "format": FORMAT, "code": code_digest(),
           "spec": [os.path.abspath(loaded.path), loaded.text_sha256],
           "checkpoint": _stamp(loaded.checkpoint_path), "rank": rank, "device": loaded.spec.device,
           "device_budget": list(device_budget), "costs": list(costs)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> bytes | None:
    """The entry's bytes, or None: missing, not a regular file (a link, a FIFO), too large, unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def trusted(folder: Path) -> bool:
    """Whether entries in `folder` may be used: it is a folder of this user that no one else can
    write (an entry is a plan: whoever can put one there chooses what a load of the spec does)."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _current(plan: Plan, loaded, rank: int, costs, device_budget=None) -> bool:
    """Whether a decoded entry is today's plan: the same version, rank, spec, checkpoint, device,
    device budget, costs and files (an entry renamed from another spec's, even of the same text
    beside another checkpoint, is not)."""
    import planc

    if (plan.planc != planc.__version__ or plan.tensor_parallel.rank != rank
            or plan.spec.sha256 != loaded.text_sha256 or tuple(plan.costs or ()) != tuple(costs)
            or plan.device != loaded.spec.device
            or os.path.abspath(plan.checkpoint.source) != os.path.abspath(loaded.checkpoint_path)
            or plan.tensor_parallel.size != loaded.spec.tensor_parallel.size
            or (device_budget is not None and plan.budget.device_bytes != device_budget[0])):
        return False
    root = plan.checkpoint.root
    for f in plan.checkpoint.files:
        try:
            st = os.stat(os.path.join(root, f.path))
        except OSError:
            return False
        if st.st_size != f.size_bytes or st.st_mtime_ns != f.mtime_ns:
            return False
    return True


def lookup(folder: Path, key: str, loaded, rank: int, costs, device_budget=None) -> Plan | None:
    from ..base.errors import PlancError
    from ..plan.codec import decode

    if not trusted(folder):
        return None
    path = folder / f"{key}.json"
    data = _read(path)
    if data is None:
        return None
    try:
        plan = decode(data, str(path))
    except PlancError:  # corrupt or foreign: ignored, and replaced by the compile that follows
        return None
    return plan if _current(plan, loaded, rank, costs, device_budget) else None


def store(folder: Path, key: str, plan: Plan) -> Path | None:
    """Write the entry atomically (a temporary file in `folder`, then a rename); None when it cannot be."""
    from ..plan.codec import encode_bytes

    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(encode_bytes(plan))
        final = folder / f"{key}.json"
        os.replace(tmp, final)
        return final
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return None


def cached_compile(spec_path, rank: int = 0, loaded=None) -> Plan:
    """The plan of `spec_path` for `rank`: from the cache when every key matches, else compiled (and
    stored). The plan's `source` note says which (`explain` shows it). `loaded`: the spec, already read."""
    from ..base import settings
    from .compile import compile_loaded, device_budget
    from ..plan.costs import load_costs
    from ..manifest import read_manifest
    from ..spec.model import load_spec

    loaded = loaded or load_spec(spec_path)
    folder = settings.plan_cache_dir()
    if folder is None:
        return compile_loaded(loaded, read_manifest(loaded.checkpoint_path), rank)
    costs = load_costs()
    dev = device_budget(loaded)
    key = cache_key(loaded, rank, costs, dev)
    hit = lookup(folder, key, loaded, rank, costs, dev)
    if hit is not None:
        return hit.with_notes(device_budget=dev[1], source="cache", cache_entry=str(folder / f"{key}.json"))
    plan = compile_loaded(loaded, read_manifest(loaded.checkpoint_path), rank, capacity=lambda _d: dev)
    where = store(folder, key, plan)
    return plan.with_notes(source="compiled", cache_entry=str(where) if where else "")

"""resolve: what a user names (a spec file, a plan file, a `Plan`) + a rank + the launcher's variables
-> the `Plan` to explain or load. The CLI (`planc run`, `planc explain`, `planc compile`) and the
Python API (`planc.load`, `planc.load_into`) both call here, so one input gives one answer, the same
error class and code, on both faces.

Invariants:
- The launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK) are read once, into a `Launch`; a value
  that is not an integer 0 or more is a `BindError [bad-rank]` naming the variable.
- Whether a path is a plan or a spec is decided from its content (`is_plan`), in this one place: a
  truncated plan is a plan (`[plan-syntax]`), a JSON spec is a spec; a spec whose key looks like a
  plan's (a typo) is still read as the spec it is.
- Every rank problem (not an integer, outside tensor_parallel.size, a tensor-parallel spec without
  one, a saved plan of another rank or world size) is a `BindError [bad-rank]`, before anything is
  compiled or loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..base.codes import Code
from ..base.errors import BindError, PlanFormatError, SpecError, printable
from ..base.units import SPEC_CAP, ascii_int

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Launch:
    """The launcher's variables, each an integer 0 or more or None (unset)."""

    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        env = os.environ if env is None else env
        return cls(*(_launcher_int(k, env.get(k)) for k in LAUNCHER))


def _launcher_int(name: str, val: str | None) -> int | None:
    if val is None:
        return None
    n = ascii_int(val)
    if n is None or n < 0:
        raise BindError(f"{name}={printable(val)[:40]!r} is not an integer 0 or more, which a launcher sets it to",
                        code=Code.BAD_RANK)
    return n


def is_plan(path: Path) -> bool:
    """Whether `path` is read as a plan (else as a spec): by content, in one place (`planc.face.filekind`)."""
    from .filekind import is_plan_file

    return is_plan_file(path)


def _looks_like_spec(path: Path) -> bool:
    """A JSON document with a spec's `rules` and none of a plan's `runs`."""
    try:
        doc = json.loads(path.read_bytes()[:SPEC_CAP])
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "rules" in doc and "runs" not in doc


def pick_rank(rank: int | None, size: int, launch: Launch, *, flag: str = "--rank", all_hint: str = "",
              where: str = ""):
    """The rank of a spec of `tensor_parallel.size` `size`: `rank` (given), else $RANK, else 0 when there
    is one rank. Without tensor parallelism (size 1), RANK and WORLD_SIZE are a data-parallel launch:
    every replica loads the whole plan, so they are checked but do not pick a rank. `where`: the spec's
    path, which the messages name."""
    at = f"{where}: " if where else ""
    env, world = launch.rank, launch.world_size
    if world is not None and size > 1 and world != size:
        raise BindError(f"{at}WORLD_SIZE={world} but the spec's tensor_parallel.size is {size}", code=Code.BAD_RANK)
    if rank is None and (env is None or size == 1):
        if size > 1:
            how = "--rank R" if flag == "--rank" else "rank="
            raise BindError(f"{at}tensor_parallel.size is {size}: pass {how} (0..{size - 1}){all_hint}, or set RANK",
                            code=Code.BAD_RANK)
        return 0
    r, what = (env, "RANK") if rank is None else (rank, flag)
    if not 0 <= r < size:
        raise BindError(f"{at}rank {r} is outside tensor_parallel.size {size} (ranks 0..{size - 1}); it came from {what}",
                        code=Code.BAD_RANK)
    return r


def held_to_launcher(plan, where: str, rank: int | None, launch: Launch, *, flag: str = "--rank"):
    """A saved (or given) plan, checked against the rank asked for, RANK and WORLD_SIZE as its spec
    would be."""
    tp = plan.tensor_parallel
    env, world = launch.rank, launch.world_size
    if world is not None and tp.size > 1 and world != tp.size:
        raise BindError(f"WORLD_SIZE={world} but {where} is a plan of tensor_parallel.size {tp.size}",
                        code=Code.BAD_RANK)
    if rank is not None:
        want, what = pick_rank(rank, tp.size, launch, flag=flag), flag
    elif tp.size > 1:
        want, what = env, "RANK"
    else:  # a data-parallel replica: RANK does not pick the plan
        want, what = None, None
    if want is not None and want != tp.rank:
        raise BindError(f"{where} is the plan of rank {tp.rank}, but {what} {want} asks for another",
                        code=Code.BAD_RANK)
    return plan


def resolve(target, rank: int | None = None, *, launch: Launch | None = None, flag: str = "--rank"):
    """The plan that `target` (a spec path, a plan path or a `Plan`) names for `rank`.

    `launch`: the launcher's variables, read from the environment when not given. `flag`: how the
    caller's face spells the rank, for messages (`--rank` on the command line, `rank=` in Python).
    Raises a `PlancError` subclass; a refused plan is returned (its `fits` false), not raised."""
    from ..plan.records import Plan

    launch = Launch.from_env() if launch is None else launch
    if isinstance(target, Plan):
        return held_to_launcher(target, "the plan given", rank, launch, flag=flag)
    if not isinstance(target, (str, os.PathLike)):
        raise SpecError(f"spec_or_plan must be the path of a spec or a plan file, or a Plan; got "
                        f"{type(target).__name__}", code=Code.SPEC_MISSING)
    path = Path(target)
    if is_plan(path):
        from ..plan.codec import load_plan

        try:
            return held_to_launcher(load_plan(path), str(path), rank, launch, flag=flag)
        except PlanFormatError as e:
            if e.code != Code.PLAN_KIND or not _looks_like_spec(path):
                raise
            # a JSON spec whose key looks like a plan's (a typo): read below as the spec it is
    # A spec is compiled (or its plan taken from the plan cache): only then the spec models (pydantic)
    # and the compiler are imported.
    from ..compiler.plancache import cached_compile
    from ..spec.model import load_spec

    loaded = load_spec(path)
    return cached_compile(path, pick_rank(rank, loaded.spec.tensor_parallel.size, launch, flag=flag, where=str(path)),
                          loaded)

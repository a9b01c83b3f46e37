"""admit: Plan -> `Timeline` (one window per run) and the verdict, by replaying the step DAG.

The replay walks the plan in the executor's order and acquires and releases each buffer where the
executor does:
- `alloc:ring` (the pinned ring) and `alloc:device` (arena + landing + staging) are acquired before
  the first read and held to the end;
- runs go in order; a run's ring requests hold no host bytes beyond the ring;
- a run's host-path parts go one at a time, after the run's reads are drained: each part's read
  steps acquire its owned buffers, its normalize and pack steps acquire their scratch, and its
  stage step releases all of them once the output sits in the ring.
Window k is run k: host = ring + the run's host-path peak; device = the regions allocated up front;
resident = the arena bytes staged once run k is done.

Direct-path steps hold no host bytes and stage into regions already allocated, so they are
replayed in aggregate (their stage bytes summed per run); `replay_steps` walks every step one by
one and gives the same timeline (a test holds them equal).

The plan is admitted when every window fits `budget.host` and, when set, `budget.device`.
Otherwise the refusal is the first window in plan order that does not fit; it names the run, the
step that holds the most (a step id of the plan), the bytes needed and allowed, and the knob that
would help. Compile-time admission, re-admission of a saved plan and `explain` all call `admit`.
"""

from __future__ import annotations

from functools import lru_cache

from .records import ALLOC_DEVICE, ALLOC_RING, Plan, Refusal, Timeline, Window, part_steps
from ..base.units import gib
from ..base.codes import Code


@lru_cache(maxsize=1 << 16)
def host_part_peak(part) -> tuple[int, str, int]:
    """(peak bytes held, largest step id, its bytes) of one host-path part, by its steps.

    Kept per part (parts are immutable values): the codec's check of a run and the replay both ask."""
    held = peak = big = 0
    big_id = ""
    for s in part_steps(part):
        if s.kind == "stage":
            held = 0  # releases the part's buffers
            continue
        held += s.host_bytes
        if held > peak:
            peak = held
        if s.host_bytes > big:
            big, big_id = s.host_bytes, s.id
    return peak, big_id, big


def run_host_bytes(parts, host_parts) -> int:
    """Host bytes beyond the ring while a run goes: its largest host-path part (one at a time)."""
    return max((host_part_peak(parts[h.part])[0] for h in host_parts), default=0)


def _windows(plan: Plan, held_and_staged) -> tuple[Window, ...]:
    """One window per run from `held_and_staged(run)` -> (host bytes beyond the ring, bytes staged)."""
    lay = plan.layout
    ring, device = lay.held_host_bytes, lay.device_bytes
    windows, resident, prev_landing = [], 0, 0
    for run in plan.runs:
        held, staged = held_and_staged(run)
        resident += staged
        windows.append(Window(run.index, ring + held, device, ring, held, prev_landing + run.landing_bytes,
                              resident))
        prev_landing = run.landing_bytes
    if not windows:
        windows.append(Window(0, ring, device, ring, 0, 0, 0))
    return tuple(windows)


def timeline(plan: Plan) -> tuple[Window, ...]:
    parts = plan.parts
    return _windows(plan, lambda run: (run_host_bytes(parts, run.host_parts), sum(parts[p].out_bytes for p in run.parts)))


def replay_steps(plan: Plan) -> tuple[Window, ...]:
    """The same timeline, walking every step of the DAG one by one (slow; for tests and `verify`).

    Raises ValueError when a step comes before a step it waits for (the order is not topological).
    """
    parts = plan.parts
    done = {ALLOC_RING, ALLOC_DEVICE}

    def walk(run) -> tuple[int, int]:
        host_ids = {h.part for h in run.host_parts}
        peak = staged = 0
        for pid in [p for p in run.parts if p not in host_ids] + [h.part for h in run.host_parts]:
            held = 0
            for s in part_steps(parts[pid]):
                if any(d not in done for d in s.deps):
                    raise ValueError(f"step {s.id} comes before a step it waits for")
                done.add(s.id)
                if s.kind == "stage":
                    staged += s.device_bytes
                    held = 0
                else:
                    held += s.host_bytes
                    peak = max(peak, held)
        return peak, staged

    return _windows(plan, walk)


def admit(plan: Plan) -> Timeline:
    wins = timeline(plan)
    refusal = None
    for w in wins:
        refusal = _host_refusal(w, plan) or _device_refusal(w, plan)
        if refusal:
            break
    return Timeline(wins, max(w.host_bytes for w in wins), max(w.device_bytes for w in wins), refusal)


def dominant_step(plan: Plan, run: int) -> tuple[str, int]:
    """(step id, bytes) of the step that holds the most host memory while run `run` goes: the pinned
    ring (`alloc:ring`), or a host-path part's largest step (its read buffer, its normalize or pack
    scratch) when that is larger; on a tie the greater step id. A host refusal names this step, and
    `explain` shows it per run: both ask here, so they agree."""
    step, size = ALLOC_RING, plan.layout.held_host_bytes
    if plan.runs:
        for h in plan.runs[run].host_parts:
            _, sid, n = host_part_peak(plan.parts[h.part])
            if n > size or (n == size and sid > step):
                step, size = sid, n
    return step, size


def _fmt(n: int) -> str:
    return f"{n:,} bytes ({gib(n)})"


def _host_refusal(w: Window, plan: Plan) -> Refusal | None:
    budget = plan.budget.host_bytes
    if w.host_bytes <= budget:
        return None
    io = plan.io
    step, size = dominant_step(plan, w.run)
    if step == ALLOC_RING:
        maps = plan.layout.map_bytes
        knob = (f"lower io.slots (now {io.slots}) or io.slot (now {io.slot_bytes:,} bytes): "
                f"the ring alone holds {_fmt(plan.layout.ring_bytes)}")
        if maps:  # the windows of min(map_lanes, workers) requests count: name the lesser
            fewer = f"io.map_lanes, now {io.map_lanes}" if io.map_lanes < io.workers else f"io.workers, now {io.workers}"
            knob += (f" and the mapped read windows {_fmt(maps)} (a smaller io.map_window, now "
                     f"{io.map_window_bytes:,} bytes, or fewer {fewer}, map fewer)")
    else:
        knob = (f"this part needs {_fmt(w.host_bytes)} with the ring: run it on the device "
                f"(on: device), or raise budget.host to {_fmt(w.host_bytes)}")
    msg = (f"refused: run {w.run} needs {_fmt(w.host_bytes)} of host memory, budget.host allows "
           f"{_fmt(budget)}; largest step: {step} ({_fmt(size)}); {knob}")
    return Refusal(Code.HOST_BUDGET, w.run, step, w.host_bytes, budget, msg)


def _device_refusal(w: Window, plan: Plan) -> Refusal | None:
    budget = plan.budget.device_bytes
    if budget is None or w.device_bytes <= budget:
        return None
    lay, io = plan.layout, plan.io
    biggest = max(plan.parts, key=lambda p: (p.out_bytes, p.label), default=None)
    step, size = ALLOC_DEVICE, lay.landing_bytes + lay.staging_bytes + lay.scatter_table_bytes
    if biggest is not None and biggest.out_bytes > size:
        step, size = f"stage:{biggest.label}", biggest.out_bytes
    knob = f"raise budget.device to {_fmt(w.device_bytes)}, skip tensors, or load them in a smaller dtype"
    if step == ALLOC_DEVICE:
        if lay.staging_bytes > lay.landing_bytes:
            knob = f"lower io.slots (now {io.slots}) to shrink the device staging slots, or " + knob
        else:
            knob = f"lower io.run (now {io.run_bytes:,} bytes) to shrink the landing buffers, or " + knob
    msg = (f"refused: run {w.run} needs {_fmt(w.device_bytes)} of device memory (arena {_fmt(lay.arena_bytes)} + "
           f"landing {_fmt(lay.landing_bytes)} + staging {_fmt(lay.staging_bytes)} + scatter table "
           f"{_fmt(lay.scatter_table_bytes)}), budget.device allows "
           f"{_fmt(budget)}; largest step: {step} ({_fmt(size)}); {knob}")
    return Refusal(Code.DEVICE_BUDGET, w.run, step, w.device_bytes, budget, msg)

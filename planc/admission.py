"""admit: Schedule + Graph + budgets -> `Timeline` (a window per run) and the verdict.

Window k is the moment run k starts: runs k-1 and k are in flight (at most two runs are).
  host(k)   = ring + host_bytes(run k-1) + host_bytes(run k)
  device(k) = arena + landing regions (both allocated once, before the first read)
The plan is admitted when every window fits `budget.host` and, when set, `budget.device`.
Otherwise the refusal is the first window in plan order that does not fit; it names the run,
the step that contributes most to it, the bytes needed and allowed, and the knob that would help.
`explain` reads this same timeline, so the explanation cannot drift from the decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph
from .schedule import Schedule
from .spec import Spec
from .units import gib


@dataclass(frozen=True)
class Window:
    run: int
    host_bytes: int
    device_bytes: int
    ring_bytes: int
    host_inflight_bytes: int  # host-path buffers of runs k-1 and k
    landing_bytes: int  # landing bytes used by runs k-1 and k
    resident_bytes: int  # arena bytes filled once run k is done


@dataclass(frozen=True)
class Refusal:
    code: str
    run: int
    step: str
    needed_bytes: int
    allowed_bytes: int
    message: str

    def as_dict(self) -> dict:
        return dict(code=self.code, run=self.run, step=self.step, needed_bytes=self.needed_bytes,
                    allowed_bytes=self.allowed_bytes, message=self.message)


@dataclass(frozen=True)
class Timeline:
    windows: tuple[Window, ...]
    host_peak_bytes: int
    device_peak_bytes: int
    refusal: Refusal | None

    @property
    def fits(self) -> bool:
        return self.refusal is None


def timeline(sched: Schedule, graph: Graph) -> tuple[Window, ...]:
    windows, resident, prev_host, prev_landing = [], 0, 0, 0
    device = sched.arena_bytes + sched.landing_bytes + sched.staging_bytes
    out_bytes = {n.id: n.out_bytes for n in graph.parts}
    for run in sched.runs:
        resident += sum(out_bytes[p] for p in run.parts)
        windows.append(Window(run.index, sched.ring_bytes + prev_host + run.host_bytes, device,
                              sched.ring_bytes, prev_host + run.host_bytes, prev_landing + run.landing_bytes, resident))
        prev_host, prev_landing = run.host_bytes, run.landing_bytes
    if not windows:
        windows.append(Window(0, 0, device, 0, 0, 0, 0))
    return tuple(windows)


def admit(spec: Spec, sched: Schedule, graph: Graph) -> Timeline:
    wins = timeline(sched, graph)
    refusal = None
    for w in wins:
        refusal = _host_refusal(w, spec, sched, graph) or _device_refusal(w, spec, sched, graph)
        if refusal:
            break
    return Timeline(wins, max(w.host_bytes for w in wins), max(w.device_bytes for w in wins), refusal)


def _fmt(n: int) -> str:
    return f"{n:,} bytes ({gib(n)})"


def _host_refusal(w: Window, spec: Spec, sched: Schedule, graph: Graph) -> Refusal | None:
    budget = spec.budget.host
    if w.host_bytes <= budget:
        return None
    io = spec.io
    contributors = [("ring", sched.ring_bytes)]
    for k in (w.run - 1, w.run):
        if k < 0:
            continue
        for pid in sched.runs[k].parts:
            n = graph.parts[pid]
            if n.path == "host":
                contributors.append((f"read+normalize:{n.placement}#{n.index}", n.host_bytes))
    step, size = max(contributors, key=lambda c: (c[1], c[0]))
    if step == "ring":
        knob = (f"lower io.slots (now {io.slots}) or io.slot (now {io.slot:,} bytes): "
                f"the ring alone holds {_fmt(sched.ring_bytes)}")
    elif size + sched.ring_bytes > budget:
        knob = (f"this part alone needs {_fmt(size + sched.ring_bytes)} with the ring: run it on the device "
                f"(on: device), or raise budget.host to {_fmt(size + sched.ring_bytes)}")
    else:
        knob = (f"lower io.run (now {io.run:,} bytes) so fewer host-path parts are in flight, "
                f"or raise budget.host to {_fmt(w.host_bytes)}")
    msg = (f"refused: run {w.run} needs {_fmt(w.host_bytes)} of host memory, budget.host allows "
           f"{_fmt(budget)}; largest step: {step} ({_fmt(size)}); {knob}")
    return Refusal("host-budget", w.run, step, w.host_bytes, budget, msg)


def _device_refusal(w: Window, spec: Spec, sched: Schedule, graph: Graph) -> Refusal | None:
    budget = spec.budget.device
    if budget is None or w.device_bytes <= budget:
        return None
    biggest = max(sched.tensors, key=lambda t: (t.nbytes, t.name), default=None)
    contributors = [("landing", sched.landing_bytes), ("staging", sched.staging_bytes)]
    if biggest is not None:
        contributors.append((f"stage:{biggest.name}", biggest.nbytes))
    step, size = max(contributors, key=lambda c: (c[1], c[0]))
    knob = (f"raise budget.device to {_fmt(w.device_bytes)}, skip tensors, or load them in a smaller dtype")
    if step == "staging":
        knob = f"lower io.slots (now {spec.io.slots}) to shrink the device staging slots, or " + knob
    if step == "landing":
        knob = f"lower io.run (now {spec.io.run:,} bytes) to shrink the landing buffers, or " + knob
    msg = (f"refused: run {w.run} needs {_fmt(w.device_bytes)} of device memory (arena {_fmt(sched.arena_bytes)} + "
           f"landing {_fmt(sched.landing_bytes)} + staging {_fmt(sched.staging_bytes)}), budget.device allows {_fmt(budget)}; largest step: {step} "
           f"({_fmt(size)}); {knob}")
    return Refusal("device-budget", w.run, step, w.device_bytes, budget, msg)

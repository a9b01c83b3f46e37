"""A run's kernels on a stream of their own (`kernelruns.KernelRuns`), under the CUDA simulator.

The simulator runs every copy and kernel at once, so it cannot show a kernel reading bytes not yet
copied; these tests check the order the executor asks of the device instead: every stream call,
event record and wait of a real load is logged (a wrapper of the simulator's device, nothing in the
executor patched), and a happens-before relation over the log (streams in order, a wait ordering a
stream after the event's recorded point) must order each run's kernels after its copies, and each
run's copies after the kernels that read its landing region before.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numba  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

from execute_support import SMALL_IO, assert_model, spec_file, synth  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.device import seam  # noqa: E402
from planc.execute.pipeline.events import CopyIssued, KernelsLaunched  # noqa: E402
from planc.execute.pipeline.kernelruns import reads_landing  # noqa: E402


class _Event:
    def __init__(self, dev, inner):
        self.dev, self.inner = dev, inner

    def record(self, stream):
        self.dev.log.append(("record", id(self), id(stream)))
        self.inner.record(stream)

    def wait(self, stream):
        self.dev.log.append(("wait", id(self), id(stream)))
        self.inner.wait(stream)

    def synchronize(self):
        self.inner.synchronize()


class Ordering:
    """The simulator's device, logging copies, launches, records and waits with their streams."""

    def __init__(self, inner):
        self.inner, self.log = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def event(self):
        return _Event(self, self.inner.event())

    def stage(self, buf, copies, stream):
        self.log.append(("stage", id(stream)))
        return self.inner.stage(buf, copies, stream)

    def launch(self, name, grid, block, stream, *args, kernel=None):
        self.log.append(("launch", id(stream)))
        return self.inner.launch(name, grid, block, stream, *args, kernel=kernel)

    def observe(self, e):
        if isinstance(e, CopyIssued) and e.request is not None:
            self.log.append(("copied", e.run))
        elif isinstance(e, KernelsLaunched):
            self.log.append(("kernels", e.run))


def _happens_before(log):
    """(ops, hb): ops = [(kind, stream, run, position)] of the stages and launches in `log`, each
    given its run (a stage: the request's `copied` after it; a launch: the `kernels` right after
    its block); hb(a, b): whether op a completes before op b starts on the device."""
    clock: dict = {}  # stream -> {stream: last position known done} at the stream's tail
    events: dict = {}  # event -> the clock of its latest record
    ops, vcs, by_pos = [], {}, {}
    for i, entry in enumerate(log):
        kind = entry[0]
        if kind in ("stage", "launch"):
            s = entry[1]
            vc = dict(clock.get(s, {}))
            vc[s] = i
            clock[s] = vc
            vcs[i] = vc
            ops.append([kind, s, None, i])
            by_pos[i] = ops[-1]
        elif kind == "record":
            events[entry[1]] = dict(clock.get(entry[2], {}))
        elif kind == "wait":
            got = events[entry[1]]
            mine = dict(clock.get(entry[2], {}))
            for s, at in got.items():
                mine[s] = max(mine.get(s, -1), at)
            clock[entry[2]] = mine
        elif kind in ("copied", "kernels"):  # the stages (launches) just before it, records between
            mine = "stage" if kind == "copied" else "launch"
            j = i - 1
            while j >= 0 and log[j][0] in (mine, "record"):
                if log[j][0] == mine and by_pos[j][2] is None:
                    by_pos[j][2] = entry[1]
                j -= 1

    def hb(a, b):
        return a[3] <= vcs[b[3]].get(a[1], -1)

    return ops, hb


def _violations(plan, log) -> list:
    ops, hb = _happens_before(log)
    stages = [o for o in ops if o[0] == "stage" and o[2] is not None]
    launches = [o for o in ops if o[0] == "launch" and o[2] is not None]
    bad = []
    for k in launches:
        bad += [f"run {k[2]}'s kernel at {k[3]} may start before its copy at {s[3]}"
                for s in stages if s[2] == k[2] and not hb(s, k)]
    for s in stages:
        r = plan.runs[s[2]]
        bad += [f"run {r.index}'s copy at {s[3]} may overwrite landing region {r.landing_region} while run "
                f"{k[2]}'s kernel at {k[3]} reads it"
                for k in launches if k[2] < r.index and plan.runs[k[2]].landing_region == r.landing_region
                and reads_landing(plan.runs[k[2]]) and not hb(k, s)]
    return bad


@pytest.fixture(params=["fp8", "dense"])
def loaded(request, tmp_path):
    """A plan of several runs alternating two landing regions whose kernels read them: FP8 blocks
    dequantized with their scales, or BF16 widened to F32."""
    if request.param == "fp8":
        rules = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "planc", "specs", "fp8.yaml")))["rules"]
    else:
        rules = [{"match": "*", "dtype": "float32"}]
    path, want = synth(tmp_path, request.param, size_bytes=300_000, shards=1, seed=0)
    plan = compile_spec(spec_file(tmp_path, path, rules, io=SMALL_IO))
    assert len(plan.runs) >= 4 and len({r.landing_region for r in plan.runs if reads_landing(r)}) == 2
    return plan, want, request.param


def _load(plan):
    dev = Ordering(seam.device())
    model = execute(plan, device=dev, observer=dev.observe)
    return dev, model


def test_kernels_run_on_their_own_stream_after_their_copies_and_before_their_region_is_reused(loaded):
    plan, want, family = loaded
    dev, model = _load(plan)
    try:
        if family == "dense":
            assert_model(model, {n: a.astype("float32") for n, a in want.items()})
    finally:
        model.free()
    ops, _ = _happens_before(dev.log)
    copy_streams = {o[1] for o in ops if o[0] == "stage"}
    kernel_streams = {o[1] for o in ops if o[0] == "launch" and o[2] is not None}
    assert len(copy_streams) == 1 and kernel_streams and not kernel_streams & copy_streams
    assert {o[2] for o in ops if o[0] == "launch" and o[2] is not None} == {r.index for r in plan.runs if r.kernels}
    assert _violations(plan, dev.log) == []


class _CopiesForget(Ordering):
    """A device that drops every wait the copy stream is asked for (the stream that stages)."""

    def event(self):
        ev = _Event(self, self.inner.event())
        wait = ev.wait
        ev.wait = lambda stream: None if ("stage", id(stream)) in self.log else wait(stream)
        return ev


def test_the_check_finds_copies_that_do_not_wait_for_the_kernels(loaded):
    """Without the wait before a run's first copy, the relation no longer orders the copies into a
    landing region after the kernels of two runs before, and the check says which."""
    plan, _, _ = loaded
    dev = _CopiesForget(seam.device())
    model = execute(plan, device=dev, observer=dev.observe)
    model.free()
    bad = _violations(plan, dev.log)
    assert bad and all("may overwrite landing region" in b for b in bad)

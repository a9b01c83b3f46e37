"""The load's counts and timings are folded from its events (`planc.execute.pipeline.meter.Meter`):
each event adds what it says, and a load's report holds what its events told an outside observer."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402
from execute_support import SMALL_IO, spec_file, synth  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.pipeline import events as ev  # noqa: E402
from planc.execute.pipeline.meter import PHASES, Counts, Meter  # noqa: E402


def test_each_event_adds_what_it_says():
    m = Meter()
    for e in (ev.CopyIssued(0, 0, 3, 100, start=1.0, end=1.5), ev.CopyIssued(0, 1, 1, 10, 1, start=2.0, end=2.25),
              ev.CopyIssued(0, None, 1, 10, start=3.0, end=9.0), ev.HostPartDone(0, 4, 10, 2),
              ev.KernelsLaunched(0, 5, 2, start=4.0, end=4.125), ev.RunWaited(1), ev.DeviceReady(1, 2, start=0.0, end=0.5),
              ev.Timed("wait_reads", start=0.0, end=0.25), ev.Timed("wait_reads", start=1.0, end=1.25),
              ev.Step("slot_wait", start=0.0, end=1.0), ev.Step("pin", start=0.0, end=7.0),
              ev.RunStarted(0), ev.ReadDone(0, 0, 100, False), ev.LoadEnded(True)):
        m(e)
    m.record("plan", 0.125)
    assert m.counts() == Counts(requests=4, copies=6, kernels=8, host_parts=1, run_waits=1)
    t = m.timings()
    assert list(t)[:len(PHASES)] == list(PHASES)
    assert t["issue"] == 0.75 and t["wait_reads"] == 0.5 and t["wait_slots"] == 1.0
    assert t["wait_device"] == 0.5 and t["plan"] == 0.125 and t["launch"] == 0.125 and "pin" not in t


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("meter")
    path, _ = synth(tmp, "dense", layers=1)
    rules = [{"match": "*.mlp.*", "dtype": "float32"}, {"match": "*.self_attn.q_proj.weight", "on": "host",
                                                        "transpose": True}, {"match": "*"}]
    plan = compile_spec(spec_file(tmp, path, rules, io=SMALL_IO))
    seen = []
    model = execute(plan, observer=seen.append)
    yield plan, model.report, seen
    model.free()


def test_the_report_counts_what_the_events_told(loaded):
    plan, rep, seen = loaded
    again = Meter()
    for e in seen:
        again(e)
    n = again.counts()
    assert any(isinstance(e, ev.HostPartDone) for e in seen)  # the host path reports through events too
    assert (rep.requests.issued, rep.copies.issued, rep.kernels.issued, rep.run_waits) == \
        (n.requests, n.copies, n.kernels, n.run_waits) == \
        (plan.totals.requests, plan.totals.copies, plan.totals.kernels, 0)
    assert isinstance(seen[-1], ev.LoadEnded) and seen[-1].ok
    assert set(PHASES) | {"prepare", "free", "release"} <= set(rep.timings)
    assert rep.kernels.issued and rep.timings["launch"] > 0  # the time to issue the kernels, as told

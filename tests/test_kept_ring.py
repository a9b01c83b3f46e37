"""A pinned ring kept between loads (PLANC_RING=kept, `planc.warm_up`), under the CUDA simulator.

The second load takes the first's slots pinned (the same buffers, none pinned again), loads the same
bytes, and counts the kept ring in its host growth (`host.kept_ring_bytes`), so that growth still
stands beside the plan's host peak; `release_ring` gives it back; a failed load keeps nothing.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402

import planc  # noqa: E402
from execute_support import assert_model, fail_read_at, load_checked, spec_file, synth  # noqa: E402
from planc.base.errors import PlancError  # noqa: E402
from planc.base.settings import SettingError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.io.readers import KEPT_READERS  # noqa: E402
from planc.execute.io.ring import KEPT  # noqa: E402

IO = {"slot": "64KiB", "slots": 4, "workers": 2}


@pytest.fixture
def ckpt(tmp_path):
    path, want = synth(tmp_path, "dense", size_bytes=1 << 20, layers=2, seed=3)
    spec = spec_file(tmp_path, path, [{"match": "*"}], io=IO)
    yield spec, want
    planc.release_ring()
    assert KEPT.held_bytes() == 0 and KEPT_READERS.pool is None


def _slots():
    with KEPT.lock:
        return [id(v) for e in KEPT.held.values() for _, v in e[2]]


def test_fresh_ring_is_not_kept(ckpt):
    spec, want = ckpt
    models = []
    _, m = load_checked(spec, models)
    assert_model(m, want)
    assert m.report.host.kept_ring_bytes == 0
    assert KEPT.held_bytes() == 0
    for x in models:
        x.free()


def test_kept_ring_is_taken_by_the_next_load(ckpt):
    spec, want = ckpt
    models = []
    plan, first = load_checked(spec, models, settings={"ring": "kept"})
    ring = plan.layout.ring_bytes
    assert first.report.host.kept_ring_bytes == 0
    assert KEPT.held_bytes() == ring
    kept = _slots()
    _, second = load_checked(spec, models, settings={"ring": "kept"})
    assert_model(second, want)
    h = second.report.host
    assert h.kept_ring_bytes == ring
    assert h.growth_bytes >= ring  # the kept ring counted in, as the first load's own ring was
    assert "pin" not in second.report.timings or second.report.timings.get("wait_pin", 0) == 0
    assert _slots() == kept  # the same pinned buffers, given back again
    # a load with the default setting still takes them, and unpins them when it is done
    _, third = load_checked(spec, models)
    assert third.report.host.kept_ring_bytes == ring
    assert KEPT.held_bytes() == 0
    for x in models:
        x.free()


def test_warm_up_pins_the_ring_ahead_and_release_gives_it_back(ckpt):
    spec, want = ckpt
    plan = planc.warm_up(spec)
    ring = plan.layout.ring_bytes
    assert KEPT.held_bytes() == ring
    m = planc.load(plan)
    assert_model(m, want)
    assert m.report.host.kept_ring_bytes == ring
    assert KEPT.held_bytes() == ring  # kept again: warm_up keeps rings until release_ring
    m.free()
    assert planc.warm_up(plan) is not None and KEPT.held_bytes() == ring  # again: nothing pinned twice
    assert planc.release_ring() == ring
    assert KEPT.held_bytes() == 0
    m = planc.load(plan)
    assert m.report.host.kept_ring_bytes == 0 and KEPT.held_bytes() == 0
    m.free()


def test_a_ring_of_another_slot_size_is_not_taken(ckpt, tmp_path):
    spec, _ = ckpt
    planc.warm_up(spec)
    other = compile_spec(spec_file(tmp_path, compile_spec(spec).checkpoint.root, [{"match": "*"}],
                                   io={**IO, "slot": "128KiB"}, name="other.yaml"))
    m = execute(other)
    assert m.report.host.kept_ring_bytes == 0
    m.free()


def test_a_failed_load_keeps_no_ring(ckpt, monkeypatch):
    spec, _ = ckpt
    planc.warm_up(spec)
    fail_read_at(monkeypatch, 2)
    with pytest.raises(PlancError):
        planc.load(spec)
    assert KEPT.held_bytes() == 0  # taken by the load, dropped with it


def test_ring_setting_is_checked():
    with pytest.raises(SettingError, match="ring"):
        planc.load("nothing.yaml", settings={"ring": "forever"})


def test_warm_up_refuses_a_ring_past_the_live_room(ckpt):
    spec, _ = ckpt
    from planc.base.errors import AdmissionError

    with pytest.raises(AdmissionError, match="ring"):
        planc.warm_up(spec, settings={"host_reserve": "1000TiB"})
    assert KEPT.held_bytes() == 0


def test_warm_up_without_the_ring_pins_nothing(ckpt):
    spec, want = ckpt
    plan = planc.warm_up(spec, ring=False)
    assert KEPT.held_bytes() == 0
    m = planc.load(plan)
    assert_model(m, want)
    assert m.report.host.kept_ring_bytes == 0 and KEPT.held_bytes() == 0
    m.free()


def test_one_ring_per_device_the_latest_slot_size_replacing_the_last(ckpt, tmp_path):
    spec, _ = ckpt
    plan = planc.warm_up(spec)  # 4 slots of 64 KiB, kept
    root = plan.checkpoint.root
    for slot, name in (("128KiB", "a.yaml"), ("256KiB", "b.yaml"), ("32KiB", "c.yaml")):
        other = compile_spec(spec_file(tmp_path, root, [{"match": "*"}], io={**IO, "slot": slot}, name=name))
        m = execute(other)
        assert m.report.host.kept_ring_bytes == 0
        m.free()
        assert KEPT.held_bytes() == other.layout.ring_bytes  # that load's ring replaced the one before


def test_a_smaller_ring_taken_from_a_larger_one_gives_it_back_whole(ckpt, tmp_path):
    spec, _ = ckpt
    plan = planc.warm_up(spec)
    two = compile_spec(spec_file(tmp_path, plan.checkpoint.root, [{"match": "*"}], io={**IO, "slots": 2},
                                 name="two.yaml"))
    m = execute(two)
    assert m.report.host.kept_ring_bytes == two.layout.ring_bytes == plan.layout.ring_bytes // 2
    m.free()
    assert KEPT.held_bytes() == plan.layout.ring_bytes  # not shrunk to the smaller load's two slots
    m = execute(plan)
    assert m.report.host.kept_ring_bytes == plan.layout.ring_bytes
    m.free()


def test_loads_at_once_never_count_the_same_kept_slots(ckpt):
    import threading

    spec, want = ckpt
    plan = planc.warm_up(spec)
    out, errors = [], []

    def one():
        try:
            m = execute(plan)
            out.append((m.report.host.kept_ring_bytes, m))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(k for k, _ in out) <= plan.layout.ring_bytes  # each kept slot in one load's report at most
    for _, m in out:
        assert_model(m, want)
        m.free()
    assert KEPT.held_bytes() == plan.layout.ring_bytes


def test_release_ring_during_a_load_is_final(ckpt):
    from planc.execute.pipeline.events import RunStarted

    spec, want = ckpt
    plan = planc.warm_up(spec)
    released = []

    def observe(event):
        if isinstance(event, RunStarted) and not released:
            released.append(planc.release_ring())

    m = execute(plan, observer=observe)
    assert_model(m, want)
    assert m.report.host.kept_ring_bytes == plan.layout.ring_bytes  # taken before the release
    m.free()
    assert released == [0] and KEPT.held_bytes() == 0  # the load did not keep it after the release


@pytest.mark.parametrize("ring", ["no", None, 0, 1])
def test_warm_up_takes_ring_as_a_bool_only(ckpt, ring):
    from planc.base.errors import BindError

    spec, _ = ckpt
    with pytest.raises(BindError) as e:
        planc.warm_up(spec, ring=ring)
    assert e.value.code == "bad-ring" and KEPT.held_bytes() == 0


def test_warm_up_refuses_a_refused_plan(ckpt, tmp_path):
    from planc.base.errors import AdmissionError

    spec, _ = ckpt
    plan = compile_spec(spec)
    small = spec_file(tmp_path, plan.checkpoint.root, [{"match": "*"}], io=IO, host="64KiB", name="small.yaml")
    with pytest.raises(AdmissionError):
        planc.warm_up(small)
    assert KEPT.held_bytes() == 0


# -- the readers' threads, kept beside the ring -------------------------------------------------

def _readers() -> set:
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("planc-read")}


def test_warm_up_keeps_the_readers_threads_and_the_loads_use_them(ckpt):
    """The threads warm_up started are the ones every later load reads on: a load starts none of its
    own and ends none; release_ring ends them."""
    from planc.execute.pipeline.events import ReadDone

    spec, want = ckpt
    before = _readers()
    plan = planc.warm_up(spec)
    kept = _readers() - before
    assert len(kept) == plan.io.workers and KEPT_READERS.pool is not None
    for _ in range(2):
        on = set()
        m = execute(plan, observer=lambda e: on.add(__import__("threading").current_thread())
                    if isinstance(e, ReadDone) else None)
        assert_model(m, want)
        m.free()
        assert on and on <= kept  # read on the kept threads
        assert _readers() - before == kept  # none started, none ended
    planc.release_ring()
    assert not (_readers() - before) and all(not t.is_alive() for t in kept)


def test_a_load_without_a_kept_ring_leaves_no_readers_thread(ckpt):
    spec, want = ckpt
    before = _readers()
    m = planc.load(spec)
    assert_model(m, want)
    m.free()
    assert not (_readers() - before) and KEPT_READERS.pool is None


def test_a_failed_load_keeps_no_readers(ckpt, monkeypatch):
    spec, _ = ckpt
    before = _readers()
    planc.warm_up(spec)
    fail_read_at(monkeypatch, 2)
    with pytest.raises(PlancError):
        planc.load(spec)
    assert KEPT_READERS.pool is None and not (_readers() - before)


def test_loads_of_another_width_start_their_own_and_the_latest_is_kept(ckpt, tmp_path):
    spec, want = ckpt
    plan = planc.warm_up(spec)  # 2 readers
    first = KEPT_READERS.pool
    three = compile_spec(spec_file(tmp_path, plan.checkpoint.root, [{"match": "*"}], io={**IO, "workers": 3},
                                   name="three.yaml"))
    m = execute(three)
    assert_model(m, want)
    m.free()
    assert KEPT_READERS.pool is not first and KEPT_READERS.pool.workers == 3
    for t in list(first._threads):  # the replaced pool's threads end on their own
        t.join(5)
        assert not t.is_alive()


def test_a_forked_child_does_not_take_its_parents_readers(ckpt):
    """A child made by fork has none of the kept threads: it starts its own."""
    spec, _ = ckpt
    plan = planc.warm_up(spec)
    pid = os.fork()
    if pid == 0:  # the child: nothing but the check, then out
        code = 0 if KEPT_READERS.take(plan.io.workers) is None and KEPT_READERS.drop() is None else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    mine = KEPT_READERS.take(plan.io.workers)
    assert mine is not None  # the parent's are still kept
    KEPT_READERS.give(mine)


def test_a_shut_down_pool_is_never_taken(ckpt):
    spec, want = ckpt
    plan = planc.warm_up(spec)
    KEPT_READERS.pool.shutdown(wait=True)  # (as a close that failed after giving it back would)
    m = execute(plan)
    assert_model(m, want)
    m.free()
    assert KEPT_READERS.pool is not None and not KEPT_READERS.pool.closed


def test_a_pool_given_back_after_release_ring_is_not_kept(ckpt):
    """A load that took the kept readers, then release_ring while it ran: when it gives them back the
    keep decision (asked under the kept pool's lock) says no, and the load ends them itself."""
    spec, _ = ckpt
    plan = planc.warm_up(spec)
    pool = KEPT_READERS.take(plan.io.workers)  # as a load's open_pool does
    planc.release_ring()
    assert KEPT_READERS.give(pool, lambda: KEPT.keeping) is pool
    pool.shutdown(wait=True)
    assert KEPT_READERS.pool is None


def test_a_ring_given_back_after_release_ring_is_not_kept(ckpt, monkeypatch):
    """release_ring between a load's look at whether rings are kept and its giving the ring back:
    the keep decision is asked again under the kept ring's lock, says no, and the load unpins it."""
    spec, want = ckpt
    plan = planc.warm_up(spec)
    real = KEPT.give

    def give(dev, slot, pairs, keep=lambda: True):
        planc.release_ring()  # in the window: after Regions.free's look, before the ring is kept
        return real(dev, slot, pairs, keep)

    monkeypatch.setattr(KEPT, "give", give)
    m = execute(plan)
    assert_model(m, want)
    m.free()
    monkeypatch.undo()
    assert KEPT.held_bytes() == 0 and not KEPT.keeping


def test_kept_ring_refuses_when_keep_says_no(ckpt):
    spec, _ = ckpt
    plan = planc.warm_up(spec)
    dev_slot = next(iter(KEPT.held.values()))
    dev, (_, slot) = dev_slot[0], dev_slot[1]
    pairs = KEPT.take(dev, slot, plan.io.slots)
    assert len(pairs) == plan.io.slots
    assert KEPT.give(dev, slot, pairs, lambda: False) is pairs
    assert KEPT.held_bytes() == 0
    assert KEPT.give(dev, slot, pairs) == [] and KEPT.held_bytes() == plan.layout.ring_bytes


def test_a_forked_child_does_not_take_its_parents_ring(ckpt):
    """A child made by fork holds none of the parent's pinned slots and keeps none by default."""
    spec, _ = ckpt
    plan = planc.warm_up(spec)
    assert KEPT.held_bytes() == plan.layout.ring_bytes and KEPT.keeping
    pid = os.fork()
    if pid == 0:
        ok = KEPT.held_bytes() == 0 and not KEPT.keeping and KEPT.lock.acquire(blocking=False)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert KEPT.held_bytes() == plan.layout.ring_bytes  # the parent's are still kept

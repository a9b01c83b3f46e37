"""Plan files that planc must refuse or survive, and the replay's properties.

1. The hostile-plan corpus (tests/hostile/plans.py): every field path of three valid plans (every
   record kind: copies, conversions in place and through a landing buffer, a transpose, an FP8
   dequantization, a scatter, host-path parts, a tensor-parallel rank with a strided input and
   padding; a refused plan) removed, retyped, negated, enlarged past its region, reordered,
   duplicated or dropped, and files, budgets, the refusal, the peaks, `fields`, `format` and `kind`
   edited. Each mutated file is either a `PlanFormatError` (exit 2, one line naming a field path of
   the plan) or a plan that is safe: its recorded decision is the replay's and, when it fits, its
   peaks are within its budgets. A sample goes through `planc run --verify` and `planc explain` in
   process (exit 2, 3 or 0 as the edit says; one line on stderr; nothing allocated before a
   refusal), and the accepted mutants that change what is loaded are loaded under the simulator:
   bit-exact against what their records say, or a typed error.
2. Hypothesis mutates the valid plans at random (a few edits at once, any path, any value): a plan
   error, or a plan whose replay fits its budget and which (for a few examples) loads bit-exact.
3. Replay properties over random tiny checkpoints and specs (tests/test_properties.py's strategy):
   the fast replay equals the step-by-step one; the step DAG is acyclic and the executor's order is
   topological; admitted implies every window within budget; more budget never refuses an admitted
   plan; explain's per-run counts sum to the totals; decode(encode(plan)) is an equal plan with a
   byte-identical encoding; explain reads the same from the spec and from the file.
"""

from __future__ import annotations

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import atexit  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import networkx as nx  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

from execute_support import NP, bits, cast, cli_run, one_line, watch_regions  # noqa: E402
from hostile.plans import build_plans, corpus, dtype_edits, path_texts, walk  # noqa: E402
from planc.plan import admission  # noqa: E402
from planc.base.dtypes import op_problem  # noqa: E402
from planc.base.errors import PlanFormatError, PlancError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.plan.explain import explain_doc  # noqa: E402
from planc.plan.codec import decode, encode, load_plan  # noqa: E402
from test_properties import cases, compile_plan, write  # noqa: E402

# The valid plans are compiled once, when the module is collected: the mutations are named after
# their field paths, so the parametrization needs the documents.
_HOME = Path(tempfile.mkdtemp(prefix="planc-hostile-plans-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
BUILT = build_plans(_HOME / "ckpt")
PLANS = BUILT.plans
DOCS = {name: json.loads(encode(p)) for name, p in PLANS.items()}
TEXTS = {name: path_texts(doc) for name, doc in DOCS.items()}
MUTATIONS = corpus(BUILT)
DTYPE_EDITS = [m for name in ("mixed", "tp") for m in dtype_edits(name, DOCS[name])]
BY_ID = {m.id: m for m in MUTATIONS}
OUTCOMES: dict[str, str] = {}  # mutation id -> refused | accepted (filled as the corpus runs)
ACCEPTED: dict = {}  # mutation id -> the plan it decoded to (blind mutations only)
EXECUTED: Counter = Counter()
_files = iter(range(10**9))


def _write(doc) -> Path:
    folder = _HOME / "plans"
    folder.mkdir(exist_ok=True)
    path = folder / f"p{next(_files)}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return path


# ------------------------------------------------------------------------------------------
# what a loaded plan must be


def check_refused(e: PlanFormatError, original: dict, mutated) -> str:
    """A plan error: exit 2, one line, no traceback, and (for a field error) a field path of the plan."""
    assert type(e) is PlanFormatError and e.exit_code == 2
    msg = e.message
    assert "\n" not in msg and "\r" not in msg and "Traceback" not in msg, msg
    if e.code == "plan-invalid":
        named = msg.split(": invalid plan: ", 1)[1].split(": ", 1)[0]
        known = _texts(original)
        if named not in known and isinstance(mutated, dict):
            known = known | path_texts(mutated)
        assert named in known, f"the error names {named!r}, not a field path of the plan: {msg}"
    else:
        assert e.code in ("plan-kind", "plan-version", "plan-syntax"), (e.code, msg)
    return msg


def _texts(doc) -> set:
    for name, d in DOCS.items():
        if d is doc:
            return TEXTS[name]
    return path_texts(doc)


def check_safe(plan) -> None:
    """A plan that decoded: its recorded decision is the replay's, and it fits what it says it fits."""
    tl = admission.admit(plan)
    assert (tl.peak, tl.refusal, tl.windows) == (plan.peak, plan.refusal, plan.timeline)
    b = plan.budget
    if plan.fits:
        assert plan.peak.host_bytes <= b.host_bytes
        assert b.device_bytes is None or plan.peak.device_bytes <= b.device_bytes
        for w in plan.timeline:
            assert w.host_bytes <= b.host_bytes and (b.device_bytes is None or w.device_bytes <= b.device_bytes)
    else:
        r = plan.refusal
        assert r.needed_bytes > r.allowed_bytes
    assert admission.replay_steps(plan) == plan.timeline


def load(path: Path, original: dict, mutated):
    """('refused', message) or ('accepted', plan); any other exception fails the test."""
    try:
        plan = load_plan(path)
    except PlanFormatError as e:
        return "refused", check_refused(e, original, mutated)
    check_safe(plan)
    return "accepted", plan


def expected(plan) -> dict[str, np.ndarray]:
    """What each tensor must hold after loading `plan`, worked out from its records with numpy alone:
    each part's input segments read from the file, converted, transposed or dequantized, placed at
    its arena offset; padding zero."""
    arena = np.zeros(plan.layout.arena_bytes, np.uint8)
    raw = {f.path: np.fromfile(os.path.join(plan.checkpoint.root, f.path), np.uint8) for f in plan.checkpoint.files}
    for p in plan.parts:
        ins = []
        for i in p.inputs:
            b = np.concatenate([raw[i.file][off:off + n] for off, n, _ in i.segments()] or [np.zeros(0, np.uint8)])
            ins.append(b.view(NP[i.dtype]))
        w = ins[0].reshape(p.inputs[0].shape)
        if p.op == "copy":
            out = w
        elif p.op == "convert":
            out = cast(w, p.out_dtype)
        elif p.op == "transpose":
            out = w.T if w.dtype == NP[p.out_dtype] else cast(w.T, p.out_dtype)
        else:  # dequantize: the scales by block, row-major, whatever the shape the scale input states
            rows, cols = w.shape
            blk = p.block
            s = ins[1].reshape(-(-rows // blk), -(-cols // blk)).astype(np.float32)
            s = np.repeat(np.repeat(s, blk, axis=0), blk, axis=1)[:rows, :cols]
            with np.errstate(over="ignore", invalid="ignore"):
                out = (w.astype(np.float32) * s).astype(NP[p.out_dtype])
        arena[p.dst_offset:p.dst_offset + p.out_bytes] = bits(out)
    return {t.name: arena[t.offset_bytes:t.offset_bytes + t.nbytes] for t in plan.tensors}


def assert_loads(plan, model) -> None:
    """The model holds bit for bit what `expected(plan)` works out, with the plan's dtypes and shapes."""
    want = expected(plan)
    assert sorted(model.keys()) == sorted(want)
    for t in plan.tensors:
        got = model[t.name].to_host()
        assert got.dtype == NP[t.dtype] and got.shape == t.shape, (t.name, got.dtype, got.shape)
        assert np.array_equal(bits(got), want[t.name]), f"{t.name}: bytes differ from what the plan says"


def load_or_typed_error(plan):
    """execute(verify=True): bit-exact, or a typed planc error. Returns the outcome."""
    try:
        model = execute(plan, verify=True)
    except PlancError as e:
        assert e.exit_code in (2, 3) and "\n" not in e.message, e.message
        return f"typed error {e.code}"
    try:
        assert model.report["verify"]["ok"], model.report["verify"]
        assert_loads(plan, model)
    finally:
        model.free()
    return "bit-exact"


@pytest.fixture
def allocations(monkeypatch):
    """The loads that allocated their regions (`execute_support.watch_regions`)."""
    return watch_regions(monkeypatch)


# ------------------------------------------------------------------------------------------
# 1. the corpus


def test_valid_plans_hold_every_record_kind():
    m, tp, refused = PLANS["mixed"], PLANS["tp"], PLANS["refused"]
    ops = {(p.op, p.path, p.landing_bytes > 0) for p in m.parts}
    assert {("copy", "direct", False), ("convert", "direct", False), ("convert", "direct", True),
            ("transpose", "direct", True), ("dequantize", "direct", True), ("convert", "host", False),
            ("transpose", "host", False)} <= ops
    assert m.totals.scatters >= 1 and m.layout.staging_bytes > 0 and len(m.runs) >= 2
    # a scatter of wide elements into an arena that is not a whole number of them (a load once failed on it)
    assert any(q.scatter and m.layout.arena_bytes % q.width for r in m.runs for q in r.requests)
    assert any(h for r in m.runs for h in r.host_parts)
    assert tp.tensor_parallel == (1, 2) and any(i.count > 1 for p in tp.parts for i in p.inputs)
    assert tp.layout.zero and any(p.zero_bytes for p in tp.parts)
    assert m.fits and tp.fits and not refused.fits
    assert len(MUTATIONS) > 5000


@pytest.mark.parametrize("name", sorted(PLANS))
def test_valid_plan_files_load_as_compiled(name):
    """The unmutated files decode to the compiled plans, and the two load identically."""
    path = _write(DOCS[name])
    outcome, plan = load(path, DOCS[name], DOCS[name])
    assert outcome == "accepted" and plan.to_dict() == PLANS[name].to_dict()
    a, b = explain_doc(plan), explain_doc(PLANS[name])
    assert (a.pop("source"), a.pop("cache_entry")) == ("plan file", None)  # where each came from differs
    b.pop("source"), b.pop("cache_entry")
    assert a == b
    if plan.fits:
        models = [execute(p, verify=True) for p in (PLANS[name], plan)]
        try:
            for model in models:
                assert_loads(plan, model)
        finally:
            for model in models:
                model.free()


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_hostile_plan(m):
    original = DOCS[m.plan]
    doc = m.mutated(original)
    outcome, got = load(_write(doc), original, doc)
    OUTCOMES[m.id] = outcome
    if outcome == "accepted" and m.expect is None:
        ACCEPTED[m.id] = got
    if m.expect == "refuse":
        assert outcome == "refused", f"{m.id} was accepted"
        assert all(w in got for w in m.words), (m.words, got)
    elif m.expect is not None:
        assert outcome == "accepted", f"{m.id} was refused: {got}"


def _cli_sample() -> list:
    """The edits with a stated outcome, and of the blind mutations of `mixed` the first of each kind and
    the first at each top-level key."""
    out, seen = [m for m in MUTATIONS if m.expect is not None], set()
    for m in MUTATIONS:
        if m.expect is None and m.plan == "mixed":
            keys = {("kind", m.kind), ("key", m.path.split(".")[0].split("[")[0])}
            if not keys <= seen:
                seen |= keys
                out.append(m)
    return out


CLI = _cli_sample()


@pytest.mark.parametrize("m", CLI, ids=[m.id for m in CLI])
def test_hostile_plan_cli(m, capsys, allocations, monkeypatch):
    """`planc run PLAN --verify` and `planc explain PLAN`: exit 2 for a plan error, 3 for a plan that
    refuses, 2 for a checkpoint that is not the fingerprinted one, 0 when the edit is harmless; one
    line on stderr; nothing allocated unless the load goes ahead."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    doc = m.mutated(DOCS[m.plan])
    path = _write(doc)
    try:
        load_plan(path)
        decoded = True
    except PlanFormatError:
        decoded = False
    if m.expect is None and decoded:
        pytest.skip("accepted: loaded by test_accepted_mutants_load")
    rc, out, err = cli_run(capsys, "run", path, "--verify")
    want = m.expect if isinstance(m.expect, int) else 2
    assert rc == want, (rc, err)
    if rc:
        line = one_line(err)
        assert out == "" and line.endswith("]")
        if not decoded:
            assert "invalid plan" in line or "plan format" in line or "not a planc plan" in line, line
        if rc == 2 and decoded:
            assert line.endswith(("[file-changed]", "[file-removed]")), line
        assert not allocations, "a load allocated although it failed before the load"
    else:  # loaded, and --verify found every part bit-exact
        assert err == "" and out and len(allocations) == 1, err
    rc, out, err = cli_run(capsys, "explain", path)
    assert rc == (2 if not decoded else 0), (rc, err)
    if not decoded:
        one_line(err)
        assert out == ""


def _changes_the_load(plan, base) -> bool:
    """Whether `plan` loads other bytes, other places or in another order than `base`."""
    a, b = plan.to_dict(), base.to_dict()
    keys = ("tensors", "parts", "runs", "layout", "device", "io", "steps")  # fingerprints: the CLI edits
    for d in (a, b):
        for p in d["parts"]:
            p.pop("reason")
        for r in d["runs"]:
            r.pop("requests_uncoalesced"), r.pop("copies_uncoalesced")
        for s in d["steps"]:
            s.pop("note")
    return any(a[k] != b[k] for k in keys)


def _accepted_sample(limit: int = 10) -> list:
    """Up to `limit` accepted blind mutants that change the load, one per (field, kind)."""
    groups = {}
    for m in MUTATIONS:
        if m.expect is not None:
            continue
        if len(OUTCOMES) == len(MUTATIONS):  # the corpus ran: what it accepted
            plan = ACCEPTED.get(m.id)
        else:
            try:
                plan = decode(json.dumps(m.mutated(DOCS[m.plan])))
            except PlanFormatError:
                plan = None
        if plan is None:
            continue
        if _changes_the_load(plan, PLANS[m.plan]):
            kind = "delta" if m.kind in ("+1", "+4096", "past", "neg", "2**63") else m.kind
            groups.setdefault(("".join(c for c in m.path if not c.isdigit()), kind), (m, plan))
    def rank(m):  # what the executor reads first: order, read offsets, shapes, labels; fingerprints last
        if m.path.startswith("checkpoint"):
            return 2
        interesting = m.kind in ("reverse", "dup", "drop-first", "drop-last") or m.path.startswith("tensors") \
            or m.path.endswith((".start", ".shape", ".index"))
        return 0 if interesting else 1

    return sorted(groups.values(), key=lambda x: (rank(x[0]), x[0].id))[:limit]


def test_accepted_mutants_load(allocations):
    """The accepted mutants that change the load run under the simulator with verify: bit-exact
    against what their records say (tests/test_plan_file.py's `expected`), or a typed error."""
    sample = _accepted_sample()
    assert sample, "no accepted mutant changes the load"
    outcomes = {}
    for m, plan in sample:
        outcomes[m.id] = load_or_typed_error(plan)
        EXECUTED[outcomes[m.id]] += 1
    assert all(o == "bit-exact" or o.startswith("typed error") for o in outcomes.values()), outcomes


# The fields whose blind edits a plan file may carry and still decode, and why that is safe. Any other
# accepted mutation is a field the codec leaves unchecked: test_corpus_outcomes names it.
ACCEPTABLE = {
    "planc": "the version that wrote the plan: shown only",
    "spec.path": "shown only", "spec.sha": "shown only", "checkpoint.source": "shown only",
    "skipped": "names shown only", "skipped[]": "names shown only", "parts[].reason": "shown only",
    "reasons": "the reasons table: shown only", "reasons[]": "shown only",
    "sources": "source tensor names, shown in a verify mismatch", "sources[]": "as above",
    "parts[].inputs[].source_index": "which source name is shown", "parts[].reason_index": "which reason is shown",
    "tensors[].name": "the name the tensor is loaded under (sorted and unique, checked); parts refer to it by index",
    "tensor_parallel.size": "the rank's world, shown and matched against RANK; no record depends on it",
    "budget.host_bytes": "more budget: the replay still fits",
    "io.workers": "reader threads, bounded (1..256)", "io.run_bytes": "compile-time knob, read by no load",
    "io.merge_gap_bytes": "compile-time knob, read by no load",
    "io.strided": "compile-time knob, read by no load (the requests say how each slice is read, checked)",
    "io.map_window_bytes": "the reader maps by it, bounded (1 B..1 GiB); layout.map_bytes must cover the windows "
                           "it makes (checked), so the host peak stays what the plan claims",
    "io.map_lanes": "the reader maps at most this many windows at once, bounded (1..64); layout.map_bytes must "
                    "cover that many of the largest (checked)",
    "costs": "the cost figures the compiler chose read methods by: shown only (the requests are checked)",
    "costs.source": "shown only", "costs.page_s": "shown only", "costs.copy_byte_s": "shown only",
    "costs.read_byte_s": "shown only", "costs.request_s": "shown only",
    "costs.disk_byte_s": "shown only (the predicted cold wall), and absent in plans saved before it",
    "costs.link_byte_s": "shown only (the predicted wall's link, the limits), and absent in plans saved before it",
    "checkpoint.root": "fingerprints: `execute` refuses a file whose size or mtime differ (exit 2)",
    "checkpoint.files[].path": "fingerprints", "checkpoint.files[].size_bytes": "fingerprints (reads stay inside)",
    "checkpoint.files[].mtime_ns": "fingerprints",
    "runs[].requests_uncoalesced": "reported counts", "runs[].copies_uncoalesced": "reported counts",
    "parts[].index": "a label, unique: names the part's steps",
    "parts[].block": "read by dequantize only (checked there)",
    "parts[].inputs[].seg": "read only when count > 1 (checked there)",
    "parts[].inputs[].stride": "read only when count > 1 (checked there)",
    "parts[].inputs[].tensor": "the source's name, shown in a verify mismatch",
    "parts[].inputs[].shape": "same element count: a host-path transpose's rows and cols, or a scale's shape "
                              "(read by block), in bounds; loads what the records say",
    "parts[].inputs[].shape[]": "as above",
    "parts[].inputs[].start": "a host-path read, inside its file: loads what the records say",
    "tensors[].shape": "the view's shape, same element count",
    "runs[].kernels[].rows": "read by transpose and dequantize only (checked there)",
    "runs[].kernels[].cols": "read by transpose and dequantize only (checked there)",
    "parts": "reordered parts: every record names parts by id, each checked against its run",
    "runs[].requests": "request order: each request is independent (staging slots are stream-ordered)",
    "runs[].requests[].copies": "copy order within a request", "runs[].kernels": "kernels of distinct parts",
    "runs[].host_parts": "host-path parts go one at a time: the peak does not depend on their order",
}


def test_corpus_outcomes():
    """Every mutation ended in one of the two outcomes, and every accepted blind one edits a field of
    ACCEPTABLE (what no load depends on, what the fingerprint check covers, or a change the records
    still describe safely)."""
    if len(OUTCOMES) < len(MUTATIONS):
        pytest.skip("the corpus did not run in this session (run the whole module)")
    n = Counter(OUTCOMES.values())
    assert set(n) <= {"refused", "accepted"}
    fields = {"".join(c for c in BY_ID[i].path if not c.isdigit()) for i in ACCEPTED}
    unchecked = sorted(fields - set(ACCEPTABLE))
    assert not unchecked, f"accepted edits of fields the codec does not check: {unchecked}"
    print(f"\nhostile plans: {len(MUTATIONS)} mutations, {n['refused']} refused, {n['accepted']} accepted-safe, "
          f"executed: {dict(EXECUTED)}")


# ------------------------------------------------------------------------------------------
# 2. random mutations


PATHS = {name: [p for p, _, _ in walk(doc, sample=False) if p[0] != "fields"] + [("fields",), ("format",)]
         for name, doc in DOCS.items()}
VALUES = st.one_of(st.integers(-2**64, 2**64), st.integers(-3, 70000), st.floats(allow_nan=True), st.booleans(),
                   st.none(), st.text(max_size=8), st.lists(st.integers(-2, 5), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _accepted_blind(name: str) -> list:
    """The blind mutations of plan `name` that the corpus accepted (decoded here if it did not run)."""
    if name not in _ACCEPTED_BY_PLAN:
        if len(OUTCOMES) < len(MUTATIONS):
            for m in MUTATIONS:
                if m.expect is None and m.id not in ACCEPTED:
                    try:
                        ACCEPTED[m.id] = decode(json.dumps(m.mutated(DOCS[m.plan])))
                    except PlanFormatError:
                        pass
        _ACCEPTED_BY_PLAN[name] = [BY_ID[i] for i in sorted(ACCEPTED) if BY_ID[i].plan == name]
    return _ACCEPTED_BY_PLAN[name]


_ACCEPTED_BY_PLAN: dict = {}


@st.composite
def random_edit(draw, name, combine: bool):
    """One edit of plan `name`: a random value, an integer moved, a key removed or a blind mutation at any
    path; or (`combine`) one of the blind mutations the corpus accepted, to be combined with others."""
    if combine:
        pool = _accepted_blind(name)
        return None, "blind", pool[draw(st.integers(0, len(pool) - 1))]
    paths = PATHS[name]
    path = paths[draw(st.integers(0, len(paths) - 1))]
    kind = draw(st.sampled_from(["value", "delta", "remove", "blind"]))
    if kind == "value":
        return path, "value", draw(VALUES)
    if kind == "delta":
        return path, "delta", draw(st.sampled_from([-1, 1, 2, 7, 4096, -4096, 2**31, 2**62]))
    if kind == "blind":
        same = [m for m in MUTATIONS if m.plan == name and m.expect is None]
        return None, "blind", same[draw(st.integers(0, len(same) - 1))]
    return path, "remove", None


def _apply(doc, edit) -> None:
    path, kind, arg = edit
    if kind == "blind":
        arg.apply(doc)
        return
    node = doc
    for k in path[:-1]:
        node = node[k]
    key = path[-1]
    if kind == "remove":
        node.pop(key)
    elif kind == "value":
        node[key] = arg
    elif type(node[key]) is int:
        node[key] += arg
    else:
        node[key] = arg


RUNS = {"n": 0}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_mutations_refuse_or_load_safely(data):
    """A few random edits at once: a plan error, or a plan whose replay fits and which loads bit-exact
    (or fails typed at the fingerprint check); never another exception, never a load past its budget."""
    name = data.draw(st.sampled_from(sorted(PLANS)))
    doc = json.loads(json.dumps(DOCS[name]))
    combine = bool(_accepted_blind(name)) and data.draw(st.booleans())
    for edit in data.draw(st.lists(random_edit(name, combine), min_size=1, max_size=4)):
        try:
            _apply(doc, edit)
        except (KeyError, IndexError, TypeError, AttributeError):
            pass  # an earlier edit removed or retyped what this one edits
    try:
        text = json.dumps(doc, allow_nan=True)
    except (TypeError, ValueError):
        return
    outcome, got = load(_write_text(text), DOCS[name], doc)
    RUNS[outcome] = RUNS.get(outcome, 0) + 1
    if outcome == "accepted" and got.fits and data.draw(st.booleans()) and RUNS["n"] < 4:
        RUNS["n"] += 1
        assert load_or_typed_error(got) in ("bit-exact", "typed error file-changed", "typed error file-removed",
                                            "typed error plan-header-mismatch")  # sources no longer where the headers put them


def _write_text(text: str) -> Path:
    folder = _HOME / "plans"
    folder.mkdir(exist_ok=True)
    path = folder / f"r{next(_files)}.json"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------
# 3. replay properties


@settings(max_examples=60, deadline=None)
@given(cases())
def test_replay_properties(case):
    ts, rules, io, budget = case
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write(Path(tmp), ts)
        plan = compile_plan(ckpt, rules, io, budget)
        text = encode(plan)
        back = decode(text)
    # the fast replay is the step-by-step one, and admission reads it
    tl = admission.admit(plan)
    assert admission.timeline(plan) == admission.replay_steps(plan) == tl.windows == plan.timeline
    assert (tl.peak, tl.refusal) == (plan.peak, plan.refusal)
    # the executor's order is a topological order of an acyclic DAG, with unique step ids
    ids = [s.id for s in plan.steps]
    assert len(ids) == len(set(ids))
    pos = {s: k for k, s in enumerate(ids)}
    assert all(pos[d] < pos[s.id] for s in plan.steps for d in s.deps)
    g = plan.dag()
    assert nx.is_directed_acyclic_graph(g) and set(g.nodes) == set(ids)
    # admitted => every window within budget
    b = plan.budget
    if plan.fits:
        assert all(w.host_bytes <= b.host_bytes and (b.device_bytes is None or w.device_bytes <= b.device_bytes)
                   for w in tl.windows)
    else:
        assert plan.refusal.step in pos, plan.refusal
    # more budget never refuses an admitted plan; its own peaks are always enough
    bigger = [(b.host_bytes + 50_000, None if b.device_bytes is None else b.device_bytes + 50_000),
              (b.host_bytes, None)] if plan.fits else []
    for host, dev in bigger + [(plan.peak.host_bytes, plan.peak.device_bytes)]:
        more = admission.admit(plan.with_budget(host, dev))
        assert more.fits and more.windows == tl.windows, (host, dev, more.refusal)
    # explain's per-run counts sum to the totals (plus the scatter table's upload and the padding fills)
    ex = explain_doc(plan)
    tot, lay = plan.totals, plan.layout
    assert sum(r["requests"] for r in ex["runs"]) == tot.requests == ex["totals"]["requests"]
    assert sum(r["copies"] for r in ex["runs"]) + (1 if lay.scatter_segments else 0) == tot.copies
    assert sum(r["kernels"] for r in ex["runs"]) + sum(1 for _, n in lay.zero if n > 0) == tot.kernels
    assert sum(r["parts"] for r in ex["runs"]) == tot.source_tensors == len(plan.parts)
    # the codec round-trips, byte for byte, and explain reads the same from the file
    assert back.to_dict() == plan.to_dict()
    assert encode(back) == text
    where = ("source", "cache_entry")  # where each plan came from: compiled, or this file
    assert {k: v for k, v in explain_doc(back).items() if k not in where} == {k: v for k, v in ex.items() if k not in where}


def test_fast_parse_decides_as_the_exact_parser():
    """Every mutated plan decodes to the same plan, or is refused with the same message, whether
    orjson parses it first or only the standard library's parser with its duplicate-key check does;
    and the valid files take the fast parse."""
    import planc.plan.codec as codec

    def outcome(text):
        try:
            return decode(text, "p").to_dict()
        except PlanFormatError as e:
            return e.message

    fast = codec._fast_parse
    for name, doc in DOCS.items():
        assert fast(encode(PLANS[name])) is not None and fast(json.dumps(doc)) is not None
    texts = [json.dumps(m.mutated(DOCS[m.plan]), ensure_ascii=False) for m in MUTATIONS[::2]]
    base = json.dumps(DOCS["mixed"])
    texts += [base[:-1] + ', "peak": {"host_bytes": 0, "device_bytes": 0}}',  # a key repeated, at the top
              base.replace('"io": {', '"io": {"slots": 1, ', 1),  # and in an object of the top
              base.replace('"costs": {', '"costs": {"x": {"a": 1, "a": 2}, ', 1)]  # and deeper down
    texts.append(json.dumps(dict(DOCS["mixed"], peak={"host_bytes": 10**30, "device_bytes": 0})))
    got = [outcome(t) for t in texts]
    try:
        codec._fast_parse = lambda data: None
        want = [outcome(t) for t in texts]
    finally:
        codec._fast_parse = fast
    assert got == want
    assert all("appears twice" in m for m in got[-4:-1]), got[-4:-1]
    assert "must be between 0 and" in got[-1]  # an integer past 64 bits is named as one, not as a float


# ------------------------------------------------------------------------------------------
# 4. dtypes: what each op can produce


def test_compiled_parts_are_what_their_ops_produce():
    """Compile writes only parts the reader's rule allows (`dtypes.op_problem`, the one table)."""
    for plan in PLANS.values():
        for p in plan.parts:
            scale = p.inputs[1].dtype if len(p.inputs) >= 2 else None
            assert op_problem(p.op, p.path, p.inputs[0].dtype, p.out_dtype, scale) is None, p


@pytest.mark.parametrize("m", DTYPE_EDITS, ids=[m.id for m in DTYPE_EDITS])
def test_dtype_edit_is_refused_or_loads_bit_exact(m):
    """A part's dtypes relabelled wherever the plan states them (the tensor, its parts, their kernels;
    or the weight input and its kernel): a dtype its op cannot produce is a plan error naming the
    field; one it can is refused against the checkpoint's headers or loads bit-exact."""
    doc = DOCS[m.plan]
    mutated = m.mutated(doc)
    outcome, got = load(_write(mutated), doc, mutated)
    fields = mutated["fields"]
    pid = int(m.id.split("parts[")[1].split("]")[0])
    part = dict(zip(fields["part"], mutated["parts"][pid]))
    w = dict(zip(fields["input"], part["inputs"][0]))
    s = dict(zip(fields["input"], part["inputs"][1])) if len(part["inputs"]) > 1 else None
    why = op_problem(part["op"], part["path"], w["dtype"], part["out_dtype"], s and s["dtype"])
    if why:
        assert outcome == "refused" and why in got, (m.id, got)
    elif outcome == "accepted":
        assert load_or_typed_error(got) in ("bit-exact", "typed error plan-header-mismatch"), m.id


def test_each_format_s_checks_are_its_own_class():
    """The plan reader looks a format's own checks up by its name, and the executor's class of that
    format names the same check: one class per format on each side of the seam."""
    from planc.base.formats import FORMATS as NAMES
    from planc.execute.kernels.formats import FORMATS
    from planc.plan.formatcheck import CHECKS, FormatCheck

    assert set(CHECKS) == {"gguf", "mxfp4", "nvfp4"} and set(CHECKS) <= set(NAMES)
    for name, fmt in FORMATS.items():
        assert fmt.check is CHECKS.get(name), name
        if fmt.check is not None:
            assert isinstance(fmt.check, FormatCheck) and fmt.check.name == name

"""Invariants of compile on random tiny checkpoints, random io settings and random rules (hypothesis).

- admitted => every timeline window fits budget.host and, when set, budget.device;
- more budget never turns an admitted plan into a refused one;
- every byte of every placed direct-path input is copied exactly once, to the part's place (arena
  or landing); host-path inputs are never copied from a request;
- coalescing never increases requests or copies;
- a refusal names the first run that does not fit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_st
from planc.compiler.compile import compile_loaded
from planc.manifest import read_manifest
from planc.spec.model import LoadedSpec, validate_spec

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
TARGETS = ["keep", "float16", "bfloat16", "float32"]
LANDING = 1 << 40  # landing-space destinations are told apart from arena ones by this offset


@st.composite
def tensors(draw):
    names = draw(st.lists(st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,2}){0,2}", fullmatch=True),
                          min_size=1, max_size=6, unique=True))
    out = {}
    for n in names:
        shape = draw(st.one_of(st.tuples(st.integers(1, 4000)), st.tuples(st.integers(1, 48), st.integers(1, 48)),
                               st.sampled_from([(0,), (0, 7), (5, 0)])))  # tensors of no elements too
        out[n] = (shape, draw(st.sampled_from(sorted(DTYPES))))
    return out


@st.composite
def rule_for(draw, name, shape):
    kind = draw(st.sampled_from(["keep", "convert", "skip", "host"] + (["transpose"] if len(shape) == 2 else [])))
    r = {"match": name}
    if kind == "convert":
        r["dtype"] = draw(st.sampled_from(TARGETS[1:]))
    elif kind == "skip":
        r["skip"] = True
    elif kind == "host":
        r["on"] = "host"
        r["dtype"] = draw(st.sampled_from(TARGETS))
    elif kind == "transpose":
        r["transpose"] = True
        if draw(st.booleans()):
            r["on"], r["dtype"] = "host", draw(st.sampled_from(TARGETS))
    return r


@st.composite
def cases(draw):
    ts = draw(tensors())
    rules = [draw(rule_for(n, shape)) for n, (shape, _) in sorted(ts.items())]
    rules = draw(st.permutations(rules)) + [{"match": "*"}]
    io = {"slot": 4096 * draw(st.integers(1, 3)), "slots": draw(st.integers(1, 4)),
          "run": draw(st.one_of(st.integers(1, 40000), st.just(2**20))),
          "merge_gap": draw(st.sampled_from([0, 100, 4096, 20000]))}
    budget = {"host": draw(st.integers(0, 120_000)),
              "device": draw(st.one_of(st.none(), st.integers(0, 60_000)))}
    return ts, rules, io, budget


def write(folder: Path, ts: dict) -> str:
    path = folder / "m.safetensors"
    write_st(path, {n: np.zeros(shape, DTYPES[dt]) for n, (shape, dt) in ts.items()})
    return str(path)


def compile_plan(ckpt: str, rules, io, budget):
    spec = validate_spec({"checkpoint": ckpt, "budget": budget, "io": io, "rules": rules})
    return compile_loaded(LoadedSpec(spec, "<spec>", ckpt, "0"), read_manifest(ckpt))


def compile_doc(ckpt: str, rules, io, budget):
    return compile_plan(ckpt, rules, io, budget).to_dict()


def first_failing(d) -> int | None:
    host, dev = d["budget"]["host_bytes"], d["budget"]["device_bytes"]
    for w in d["timeline"]:
        if w["host_bytes"] > host or (dev is not None and w["device_bytes"] > dev):
            return w["run"]
    return None


@settings(max_examples=30, deadline=None)
@given(cases())
def test_admission_properties(case):
    ts, rules, io, budget = case
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write(Path(tmp), ts)
        d = compile_doc(ckpt, rules, io, budget)
        # admitted => every window fits; a refusal is the first window that does not
        bad = first_failing(d)
        assert d["fits"] == (bad is None) == (d["refusal"] is None)
        if d["refusal"]:
            r = d["refusal"]
            assert r["run"] == bad
            w = d["timeline"][bad]
            if r["code"] == "host-budget":
                assert (r["needed_bytes"], r["allowed_bytes"]) == (w["host_bytes"], budget["host"])
            else:
                assert r["code"] == "device-budget" and w["host_bytes"] <= budget["host"]
                assert (r["needed_bytes"], r["allowed_bytes"]) == (w["device_bytes"], budget["device"])
            assert f"run {bad}" in r["message"]
        assert d["peak"]["host_bytes"] == max(w["host_bytes"] for w in d["timeline"])
        assert d["peak"]["device_bytes"] == max(w["device_bytes"] for w in d["timeline"])
        # more budget never refuses an admitted plan, and never changes the plan's figures
        more = {"host": budget["host"] + 50_000, "device": None if budget["device"] is None else budget["device"] + 50_000}
        for bigger in (more, {"host": budget["host"], "device": None}, {"host": d["peak"]["host_bytes"], "device": None}):
            d2 = compile_doc(ckpt, rules, io, bigger)
            assert not (d["fits"] and not d2["fits"])
            assert (d2["totals"], d2["peak"], d2["timeline"]) == (d["totals"], d["peak"], d["timeline"])
        assert compile_doc(ckpt, rules, io, {"host": d["peak"]["host_bytes"],
                                             "device": d["peak"]["device_bytes"]})["fits"]


@settings(max_examples=30, deadline=None)
@given(cases())
def test_every_byte_copied_once_to_its_place(case):
    ts, rules, io, budget = case
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write(Path(tmp), ts)
        size = Path(ckpt).stat().st_size
        d = compile_doc(ckpt, rules, io, budget)
    (fname,) = {f["path"] for f in d["checkpoint"]["files"]}
    arena, regions = d["layout"]["arena_bytes"], d["layout"]["landing_region_bytes"]
    expected = np.full(size, -1, np.int64)  # where each source byte must land
    host_bytes = np.zeros(size, bool)
    run_of = {p: r["index"] for r in d["runs"] for p in r["parts"]}
    kernels = {}  # part -> its kernel; a merged kernel (`more`) reads its parts' sources end to end
    by_id = {p["id"]: p for p in d["parts"]}
    for r in d["runs"]:
        for k in r["kernels"]:
            src = k["src_offset"]
            for pid in (k["part"], *k["more"]):
                kernels[pid] = {**k, "src_offset": src}
                src += sum(i["nbytes"] for i in by_id[pid]["inputs"])
    placed = {i["tensor"] for p in d["parts"] for i in p["inputs"]}
    assert placed | set(d["skipped"]) == set(ts)
    for p in d["parts"]:
        assert p["dst_offset"] + p["out_bytes"] <= arena
        for inp in p["inputs"]:
            lo, hi = inp["start"], inp["start"] + inp["nbytes"]
            assert inp["file"] == fname and hi <= size
            if p["path"] == "host":
                host_bytes[lo:hi] = True
                continue
            if p["landing_bytes"]:
                k = kernels[p["id"]]
                base = LANDING + (k["src_offset"] if inp["role"] == "weight" else k["scale_offset"])
                region = regions[run_of[p["id"]] % 2]
                assert base - LANDING + inp["nbytes"] <= region
            else:
                base = p["dst_offset"]
            expected[lo:hi] = base + np.arange(inp["nbytes"])
    got = np.full(size, -1, np.int64)
    count = np.zeros(size, np.int64)
    for r in d["runs"]:
        for q in r["requests"]:
            assert q["file"] == fname
            assert q["offset"] % 4096 == 0 and 0 < q["length"] <= io["slot"] and q["length"] % 4096 == 0
            for slot_off, space, dst, n, _rows, _pitch in q["copies"]:
                assert n > 0 and slot_off + n <= q["length"]
                lo = q["offset"] + slot_off
                assert lo + n <= size
                count[lo:lo + n] += 1
                got[lo:lo + n] = (LANDING if space == "landing" else 0) + dst + np.arange(n)
    assert count.max(initial=0) <= 1, "a byte is copied twice"
    assert np.array_equal(count == 1, expected >= 0), "copied bytes differ from the placed inputs"
    assert np.array_equal(got, expected)
    assert not (host_bytes & (count > 0)).any()
    # arena places do not overlap
    spans = sorted((p["dst_offset"], p["dst_offset"] + p["out_bytes"]) for p in d["parts"])
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@settings(max_examples=30, deadline=None)
@given(cases())
def test_coalescing_never_increases_requests_or_copies(case):
    ts, rules, io, budget = case
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write(Path(tmp), ts)
        d = compile_doc(ckpt, rules, io, budget)
        alone = compile_doc(ckpt, rules, {**io, "merge_gap": 0}, budget)
    t = d["totals"]
    assert t["requests"] <= t["requests_uncoalesced"]
    assert t["copies"] <= t["copies_uncoalesced"]
    for r in d["runs"]:
        assert len(r["requests"]) <= r["requests_uncoalesced"]
        assert sum(len(q["copies"]) for q in r["requests"]) <= r["copies_uncoalesced"] - sum(
            h["copies"] for h in r["host_parts"])
    assert (t["requests_uncoalesced"], t["copies_uncoalesced"]) == (
        alone["totals"]["requests_uncoalesced"], alone["totals"]["copies_uncoalesced"])
    # runs hold at most io.run bytes of payload unless a single part is larger
    parts = {p["id"]: p for p in d["parts"]}
    for r in d["runs"]:
        payload = sum(sum(i["nbytes"] for i in parts[p]["inputs"]) for p in r["parts"])
        assert payload == r["payload_bytes"]
        assert payload <= io["run"] or len(r["parts"]) == 1


@settings(max_examples=40, deadline=None)
@given(cases())
def test_a_compiled_plan_passes_the_plans_own_check(case):
    """What compile writes, `load_plan` reads back: the plan's check refuses nothing compile made
    (an empty tensor under a conversion once made it write a plan its own reader refused)."""
    from planc.plan.codec import decode, encode

    ts, rules, io, budget = case
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write(Path(tmp), ts)
        text = encode(compile_plan(ckpt, rules, io, budget))
        assert encode(decode(text)) == text

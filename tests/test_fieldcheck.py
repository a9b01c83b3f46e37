"""The plan file's record fields, checked from one statement of their kinds (`planc.plan.fieldcheck`):
the generated fast check never accepts a record the field-by-field check refuses, and the
field-by-field check names the field that is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planc.plan.check import FIELDS
from planc.plan.checkbase import _Bad
from planc.plan.fieldcheck import KINDS, Fields, shape_ok

ENV = {"tensors": 3, "reasons": 2, "sources": 4, "files": 2, "slot": 65536, "staging": 1, "room": 4096}


def _bound(rec):
    return Fields(rec, FIELDS[rec]).bind(**{k: v for k, v in ENV.items()})


# values near every kind's edges, of every JSON type
VALUES = st.one_of(st.integers(-3, 5), st.sampled_from([2**62, 2**62 + 1, 4095, 4096, 4097, 65536, 65537, 1 << 16,
                                                        (1 << 16) + 1]),
                   st.sampled_from(["", "copy", "direct", "arena", "landing", "weight", "F32", "BF16", "Q4_K", "x",
                                    "convert", "none", "dequantize"]),
                   st.sampled_from([0.0, 1.0, -0.0, 0.1, float("inf")]), st.booleans(), st.none(),
                   st.lists(st.integers(-1, 3), max_size=4), st.just([[0]]))


@pytest.mark.parametrize("rec", sorted(KINDS))
def test_the_kinds_list_the_file_s_fields(rec):
    assert [n for n, _ in KINDS[rec]] == list(FIELDS[rec])


# a record of each kind whose every field is right
GOOD = {"tensor": ["w", "F32", [2, 3], 0, 24], "part": [0, 0, "copy", "direct", 0, [[0]], 0, 0, "F32", 0, 0, 0, 0, "",
                                                         0.0, 0, 0],
        "input": ["weight", 0, 0, 0, 24, "F32", [2, 3], 0, 0, 1], "request": [0, 0, 4096, [], False, -1, 1, 0, 1],
        "copy": [0, "arena", 0, 16, 1, 0], "kernel": [0, "convert", "BF16", "F32", "landing", 0, None, 0, 6, 2, 3, 0, [],
                                                      "float", 0.0, 0],
        "host_part": [0, 0, 1]}


@pytest.mark.parametrize("rec", sorted(KINDS))
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_fast_never_accepts_what_slow_refuses(rec, data):
    """A right record with one to three fields replaced by values near every kind's edges."""
    f = _bound(rec)
    r = list(GOOD[rec])
    assert f.fast(r)
    for i in data.draw(st.lists(st.integers(0, len(r) - 1), min_size=1, max_size=3)):
        r[i] = data.draw(VALUES)
    if rec in ("tensor", "input"):  # shapes: dims checked beside `fast` (`shape_ok`)
        i = [n for n, _ in KINDS[rec]].index("shape")
        ok = f.fast(r) and shape_ok(r[i])
    else:
        ok = f.fast(r)
    if ok:
        f.slow(r, "x")  # raises _Bad if fast let a wrong field through


def test_slow_names_the_first_wrong_field():
    f = _bound("part")
    good = [0, 0, "copy", "direct", 0, [[0]], 0, 0, "F32", 0, 0, 0, 0, "", 0.0, 0, 0]
    assert f.fast(good) and f.slow(good, "parts[0]") == good
    for i, bad, want in [(0, 3, "tensor_index: must be between 0 and 2, got 3"), (2, "copyy", "op: must be one of"),
                         (5, [], "inputs: must list 1 to 3 inputs, got 0"), (8, "F33", "out_dtype: unknown dtype"),
                         (14, 0.1, "add: 0.1 is not a float32 value"), (15, (1 << 16) + 1, "unpermute: must be between")]:
        r = list(good)
        r[i] = bad
        assert not f.fast(r)
        with pytest.raises(_Bad) as e:
            f.slow(r, "parts[7]")
        assert f"parts[7].{e.value.path.split('.', 1)[1]}: {e.value.problem}".startswith(f"parts[7].{want}")
    r = list(good)
    r[14] = 0.5  # a float32 constant: slow accepts what fast leaves to it
    assert not f.fast(r) and f.slow(r, "p")[14] == 0.5


def test_a_field_whose_range_depends_on_its_case_is_named_with_that_range(tmp_path):
    """A request's count, width and staging and a copy's pitch: the message states the range of the
    record's case (a plain request reads one segment), not the kind's widest."""
    import json

    import numpy as np

    from conftest import write_spec, write_st
    from planc.base.errors import PlanFormatError
    from planc.compiler.compile import compile_spec
    from planc.plan.codec import decode, encode

    write_st(tmp_path / "m.safetensors", {"a": np.zeros(3000, np.float32)})
    spec = write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1GiB"},
                                 "io": {"slot": "8KiB", "slots": 2}, "rules": [{"match": "*"}]})
    doc = json.loads(encode(compile_spec(spec)))
    for field, bad, want in [(8, 0, "requests[0].count: must be between 1 and 1, got 0"),
                             (6, 9, "requests[0].width: must be between 1 and 1, got 9"),
                             (5, 5, "requests[0].staging: must be between -1 and -1, got 5"),
                             (6, "1", "requests[0].width: must be an integer, got '1'")]:
        d = json.loads(json.dumps(doc))
        d["runs"][0][1][0][field] = bad
        with pytest.raises(PlanFormatError, match=want.replace("[", r"\[").replace("]", r"\]")):
            decode(json.dumps(d).encode(), "p.json")
    d = json.loads(json.dumps(doc))
    d["runs"][0][1][0][3][0][5] = 5000
    with pytest.raises(PlanFormatError, match=r"copies\[0\]\.pitch: must be between 0 and 0, got 5,000"):
        decode(json.dumps(d).encode(), "p.json")

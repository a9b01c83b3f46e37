"""Hand-made hostile edits of plan files around strided inputs and landing buffers (format 4).

Each edit keeps every derived field (read bytes, ring, peaks) consistent, so only the check it aims
at can refuse it: a row of a strided slice copied twice (after the slice is already complete), a
piece of a row copied twice (after the row is complete), a copy part given a landing buffer, and a
transpose or dequantize made to run "in place" in the arena. Each must be a `PlanFormatError`
naming a field path; before the fix the first two decoded (rows written twice), the third raised a
TypeError out of `decode`, the last two decoded and failed only once the load had allocated.
"""

from __future__ import annotations

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from hostile.plans import build_plans  # noqa: E402
from planc.base.errors import PlanFormatError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.plan.codec import decode, encode  # noqa: E402


@pytest.fixture(scope="module")
def docs():
    home = Path(tempfile.mkdtemp(prefix="planc-hostile-strided-"))
    try:
        built = build_plans(home / "ckpt")
        yield {name: json.loads(encode(p)) for name, p in built.plans.items()}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _slice_request(doc):
    """(run, request) of the request that carries the rows of the strided slice `tp.col`."""
    part = next(k for k, p in enumerate(doc["parts"]) if doc["tensors"][p[0]][0] == "tp.col")
    pf, inf = doc["fields"]["part"], doc["fields"]["input"]  # positions by the file's own field table
    inp = dict(zip(inf, doc["parts"][part][pf.index("inputs")][0]))
    start, seg, stride, count = inp["start"], inp["seg"], inp["stride"], inp["count"]
    for r in doc["runs"]:
        for q in r[1]:
            if q[7] and q[1] == start or any(q[1] + c[0] == start for c in q[3]):
                return r, q, (start, seg, stride, count, doc["parts"][part][pf.index("dst_offset")])
    raise AssertionError("no request carries tp.col")


def _refused(doc, *words):
    with pytest.raises(PlanFormatError) as ei:
        decode(json.dumps(doc))
    assert ei.value.code == "plan-invalid" and all(w in ei.value.message for w in words), ei.value.message


def _loads_bit_exact(doc) -> None:
    m = execute(decode(json.dumps(doc)), verify=True)
    try:
        assert m.report["verify"]["ok"]
    finally:
        m.free()


def test_the_edits_start_from_plans_that_load(docs):
    for name in ("tp", "tp-rows", "mixed"):
        _loads_bit_exact(docs[name])


def test_last_row_of_a_2d_copy_copied_again(docs):
    d = json.loads(json.dumps(docs["tp-rows"]))
    _, q, (start, seg, stride, count, dst) = _slice_request(d)
    (c,) = [c for c in q[3] if c[4] > 1]
    assert (c[3], c[4], c[5]) == (seg, count, stride)  # one 2-D copy carries every row
    last = count - 1
    q[3].append([c[0] + last * stride, "arena", dst + last * seg, seg, 1, 0])
    _refused(d, "rows of the slice of 'tp.col' are not copied exactly once")


def test_trailing_rows_copied_again_as_a_second_2d_copy(docs):
    d = json.loads(json.dumps(docs["tp-rows"]))
    _, q, (start, seg, stride, count, dst) = _slice_request(d)
    (c,) = [c for c in q[3] if c[4] > 1]
    q[3].append([c[0] + 5 * stride, "arena", dst + 5 * seg, seg, count - 5, stride])
    _refused(d, "not copied exactly once")


def test_piece_of_a_complete_row_copied_again(docs):
    d = json.loads(json.dumps(docs["tp-rows"]))
    _, q, (start, seg, stride, count, dst) = _slice_request(d)
    (c,) = [c for c in q[3] if c[4] > 1]
    last, half = count - 1, seg // 2
    row = c[0] + last * stride
    q[3].remove(c)
    q[3] += [[c[0], "arena", dst, seg, last, stride],  # rows 0..last-1
             [row, "arena", dst + last * seg, half, 1, 0], [row + half, "arena", dst + last * seg + half, seg - half, 1, 0],
             [row + half, "arena", dst + last * seg + half, seg - half, 1, 0]]  # the second half twice
    _refused(d, f"row {last} of the slice of 'tp.col' is not copied exactly once")
    q[3].pop()  # without the duplicate, the same pieces load bit-exact
    _loads_bit_exact(d)


def test_copy_part_with_a_landing_buffer_is_a_plan_error(docs):
    d = json.loads(json.dumps(docs["tp"]))
    p = next(p for p in d["parts"] if p[2] == "copy")
    p[9] = p[5][0][4]  # landing_bytes = its read bytes: was a TypeError out of decode
    _refused(d, ".landing_bytes", "copy lands nothing")


def test_transpose_in_place_in_the_arena_is_a_plan_error(docs):
    d = json.loads(json.dumps(docs["mixed"]))
    pid = next(k for k, p in enumerate(d["parts"]) if p[2] == "transpose" and p[3] == "direct")
    p = d["parts"][pid]
    run = next(r for r in d["runs"] if pid in r[0])
    (k,) = [k for k in run[2] if k[0] == pid]
    n, land, dst = p[5][0][4], k[5], p[15]  # dst_offset
    p[9] = 0
    k[4], k[5] = "arena", dst
    for q in run[1]:
        for j, c in enumerate(q[3]):
            if c[1] == "landing" and c[2] <= land < c[2] + c[3]:
                before, after = land - c[2], c[2] + c[3] - land - n
                pieces = ([[c[0], "landing", c[2], before, 1, 0]] if before else []) + \
                    [[c[0] + before, "arena", dst, n, 1, 0]] + \
                    ([[c[0] + before + n, "landing", land + n, after, 1, 0]] if after else [])
                q[3][j:j + 1] = pieces
                break
    _refused(d, f"parts[{pid}].landing_bytes", "transpose lands its")

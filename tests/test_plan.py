"""schedule + admission + plan on tiny checkpoints, with every figure worked out by hand.

Offsets come from the file's own header: `ds` is the data start (8 + header length); each test
checks the data offsets it relies on, then spells out runs, requests, copies, kernels, layout,
timeline and totals.
"""

from __future__ import annotations

import hashlib
import json
import struct

import ml_dtypes
import numpy as np
import pytest

from conftest import st_header, write_spec, write_st
from planc import __version__
from planc.compiler.compile import compile_spec
from planc.base.errors import PlanFormatError
from planc.plan.explain import explain_doc
from planc.plan.codec import encode, load_plan, save_plan
from planc.tools.synth import write_checkpoint


def f32(n):
    return np.arange(int(np.prod(n)), dtype=np.float32).reshape(n)


def compile_doc(tmp_path, rules, *, io, budget=None, name="spec.yaml"):
    doc = {"checkpoint": "m.safetensors", "budget": budget or {"host": "1GiB"}, "io": io, "rules": rules}
    return compile_spec(write_spec(tmp_path, doc, name))


def reqs(run):
    """Requests as (file, offset, length, copies), a 1-D copy as (slot offset, space, dst, bytes)."""
    return [(q["file"], q["offset"], q["length"], [tuple(c[:4]) if c[4:] == [1, 0] else tuple(c) for c in q["copies"]])
            for q in run["requests"]]


# ----------------------------------------------------------------------------- direct path, copies


@pytest.fixture
def abcd(tmp_path):
    """a [0,4096)  b [4096,5120) (skipped)  c [5120,7168)  d [7168,13312): all F32, in name order."""
    path = write_st(tmp_path / "m.safetensors", {"a": f32(1024), "b": f32(256), "c": f32(512), "d": f32(1536)})
    ds, offs = st_header(path)
    assert {k: (s - ds, n) for k, (s, n) in offs.items()} == {
        "a": (0, 4096), "b": (4096, 1024), "c": (5120, 2048), "d": (7168, 6144)}
    assert ds < 1024  # the hand-worked page arithmetic below assumes it
    return tmp_path, ds


RULES_ABCD = [{"match": "b", "skip": True}, {"match": "*"}]


def test_copies_without_merge_whole_plan(abcd):
    tmp_path, ds = abcd
    plan = compile_doc(tmp_path, RULES_ABCD, io={"slot": 4096, "slots": 2, "run": "1MiB", "merge_gap": 0})
    f = "m.safetensors"
    st = (tmp_path / f).stat()
    spec_text = (tmp_path / "spec.yaml").read_bytes()

    def part(i, name, start, n, dst):
        return {"id": i, "tensor": name, "index": 0, "op": "copy", "path": "direct",
                "reason": "pure copy into the final place",
                "inputs": [{"role": "weight", "tensor": name, "file": f, "start": start, "nbytes": n, "dtype": "F32",
                            "shape": [n // 4], "seg": n, "stride": n, "count": 1}],
                "offset_bytes": 0, "out_bytes": n, "out_dtype": "F32", "landing_bytes": 0, "host_bytes": 0, "block": 0,
                "zero_bytes": 0, "ggml": "", "add": 0.0, "unpermute": 0, "dst_offset": dst}

    def steps(i, name, start, n):
        return [{"id": f"read:{name}#0:weight", "kind": "read", "part": i, "host_bytes": 0, "device_bytes": 0,
                 "note": f"{f}@{start}+{n}", "deps": ["alloc:ring"]},
                {"id": f"stage:{name}#0", "kind": "stage", "part": i, "host_bytes": 0, "device_bytes": n,
                 "note": "pinned ring -> device", "deps": ["alloc:device", f"read:{name}#0:weight"]}]

    alloc = [{"id": "alloc:ring", "kind": "alloc", "part": -1, "host_bytes": 8192, "device_bytes": 0,
              "note": "pinned host ring", "deps": []},
             {"id": "alloc:device", "kind": "alloc", "part": -1, "host_bytes": 0, "device_bytes": 12288,
              "note": "arena + landing + staging + scatter table", "deps": []}]
    expected = {
        "kind": "planc-plan", "planc": __version__,
        "spec": {"path": str(tmp_path / "spec.yaml"), "sha256": hashlib.sha256(spec_text).hexdigest()},
        "checkpoint": {"source": str(tmp_path / f), "root": str(tmp_path),
                       "files": [{"path": f, "size_bytes": ds + 13312, "mtime_ns": st.st_mtime_ns}]},
        "device": "cuda:0",
        "tensor_parallel": {"rank": 0, "size": 1},
        "budget": {"host_bytes": 2**30, "device_bytes": None},
        "io": {"workers": 16, "slot_bytes": 4096, "slots": 2, "run_bytes": 2**20, "direct": "auto",
               "merge_gap_bytes": 0, "strided": "auto", "map_window_bytes": 32 << 20, "map_lanes": 4},
        # ring = slots x slot; arena = a + c + d laid out in read order
        "layout": {"arena_bytes": 12288, "landing_region_bytes": [0, 0], "staging_bytes": 0, "scatter_segments": 0,
                   "zero": [], "ring_bytes": 8192, "map_bytes": 0},
        "tensors": [
            {"name": "a", "dtype": "F32", "shape": [1024], "offset_bytes": 0, "nbytes": 4096},
            {"name": "c", "dtype": "F32", "shape": [512], "offset_bytes": 4096, "nbytes": 2048},
            {"name": "d", "dtype": "F32", "shape": [1536], "offset_bytes": 6144, "nbytes": 6144}],
        "parts": [part(0, "a", ds, 4096, 0), part(1, "c", ds + 5120, 2048, 4096), part(2, "d", ds + 7168, 6144, 6144)],
        "steps": alloc + steps(0, "a", ds, 4096) + steps(1, "c", ds + 5120, 2048) + steps(2, "d", ds + 7168, 6144),
        "runs": [{
            "index": 0, "parts": [0, 1, 2], "tensors": 3, "read_bytes": 20480, "payload_bytes": 12288,
            "host_bytes": 0, "landing_bytes": 0, "landing_region": 0,
            # a alone: one extent; the gap a -> c (1024 bytes) exceeds merge_gap 0; c and d touch: one extent.
            "requests": [{**q, "scatter": False, "staging": -1, "width": 1, "stride": 0, "count": 1} for q in [
                {"file": f, "offset": 0, "length": 4096, "copies": [[ds, "arena", 0, 4096 - ds, 1, 0]]},
                {"file": f, "offset": 4096, "length": 4096, "copies": [[0, "arena", 4096 - ds, ds, 1, 0]]},
                {"file": f, "offset": 4096, "length": 4096, "copies": [[ds + 1024, "arena", 4096, 3072 - ds, 1, 0]]},
                {"file": f, "offset": 8192, "length": 4096, "copies": [[0, "arena", 7168 - ds, 4096, 1, 0]]},
                {"file": f, "offset": 12288, "length": 4096, "copies": [[0, "arena", 11264 - ds, ds + 1024, 1, 0]]}]],
            "kernels": [], "host_parts": [],
            "requests_uncoalesced": 6, "copies_uncoalesced": 6}],  # a: 2 pages, c: 1, d: 3
        "timeline": [{"run": 0, "host_bytes": 8192, "device_bytes": 12288, "ring_bytes": 8192,
                      "host_inflight_bytes": 0, "landing_bytes": 0, "resident_bytes": 12288}],
        "skipped": ["b"],
        "totals": {"tensors": 3, "source_tensors": 3, "payload_bytes": 12288, "read_bytes": 20480,
                   "requests": 5, "requests_uncoalesced": 6, "copies": 5, "copies_uncoalesced": 6,
                   "kernels": 0, "scatters": 0, "resident_bytes": 12288, "runs": 1},
        "peak": {"host_bytes": 8192, "device_bytes": 12288},
        "fits": True,
        "refusal": None,
        "costs": {"source": "default", "page_s": 6.1e-8, "copy_byte_s": 2.8e-11, "read_byte_s": 2.3e-11,
                  "request_s": 2.6e-5, "disk_byte_s": 5.56e-10, "link_byte_s": 1 / 55.4e9},
    }
    assert plan.to_dict() == expected
    # the file is the compact form: records as arrays in the order `fields` states, files by index
    doc = json.loads(encode(plan))
    assert doc["fields"]["part"][:6] == ["tensor_index", "index", "op", "path", "reason_index", "inputs"]
    assert doc["reasons"] == ["pure copy into the final place"] and doc["sources"] == ["a", "c", "d"]
    assert doc["parts"][1] == [1, 0, "copy", "direct", 0, [["weight", 1, 0, ds + 5120, 2048, "F32", [512], 2048, 2048, 1]],
                               0, 2048, "F32", 0, 0, 0, 0, "", 0.0, 0, 4096]
    assert doc["runs"][0][1][0] == [0, 0, 4096, [[ds, "arena", 0, 4096 - ds, 1, 0]], False, -1, 1, 0, 1]
    assert "steps" not in doc and "totals" not in doc  # derived, not stored


def test_merge_gap_joins_across_a_skipped_tensor(abcd):
    tmp_path, ds = abcd
    plan = compile_doc(tmp_path, RULES_ABCD, io={"slot": 4096, "slots": 2, "run": "1MiB", "merge_gap": 1024})
    (run,) = plan.to_dict()["runs"]
    f = "m.safetensors"
    # one extent [ds, ds + 13312) -> pages [0, 16384): the skipped b is read but not copied.
    assert reqs(run) == [
        (f, 0, 4096, [(ds, "arena", 0, 4096 - ds)]),
        (f, 4096, 4096, [(0, "arena", 4096 - ds, ds), (ds + 1024, "arena", 4096, 3072 - ds)]),
        (f, 8192, 4096, [(0, "arena", 7168 - ds, 4096)]),
        (f, 12288, 4096, [(0, "arena", 11264 - ds, ds + 1024)]),
    ]
    t = plan.to_dict()["totals"]
    assert (t["requests"], t["requests_uncoalesced"], t["copies"], t["copies_uncoalesced"]) == (4, 6, 5, 6)
    assert t["read_bytes"] == 16384


def test_runs_cut_at_io_run(abcd):
    tmp_path, ds = abcd
    plan = compile_doc(tmp_path, RULES_ABCD, io={"slot": 8192, "slots": 1, "run": 6144, "merge_gap": 0})
    d = plan.to_dict()
    # read order a (4096), c (2048), d (6144): a + c = 6144 fits one run, d is the next.
    assert [r["parts"] for r in d["runs"]] == [[0, 1], [2]]
    assert [r["tensors"] for r in d["runs"]] == [2, 1]
    f = "m.safetensors"
    assert reqs(d["runs"][0]) == [(f, 0, 8192, [(ds, "arena", 0, 4096)]),
                                  (f, 4096, 4096, [(ds + 1024, "arena", 4096, 2048)])]
    # d [ds + 7168, ds + 13312) -> pages [4096, 16384), cut on the file's slot grid at 8192
    assert reqs(d["runs"][1]) == [(f, 4096, 4096, [(ds + 3072, "arena", 6144, 1024 - ds)]),
                                  (f, 8192, 8192, [(0, "arena", 7168 - ds, ds + 5120)])]
    assert [w["resident_bytes"] for w in d["timeline"]] == [6144, 12288]
    assert [w["host_bytes"] for w in d["timeline"]] == [8192, 8192]


def test_merge_that_would_add_a_request_is_not_made(tmp_path):
    path = write_st(tmp_path / "m.safetensors", {"a": f32(1750), "b": f32(2500), "c": f32(1500)})
    ds, offs = st_header(path)
    assert {k: s - ds for k, (s, _) in offs.items()} == {"a": 0, "b": 7000, "c": 17000}
    assert ds <= 1192
    plan = compile_doc(tmp_path, [{"match": "b", "skip": True}, {"match": "*"}],
                       io={"slot": 8192, "slots": 1, "run": "1MiB", "merge_gap": 16384})
    # joined, [ds, ds + 23000) would span pages [0, 24576): 3 cells of the slot grid, the middle
    # one all gap; alone, a takes [0, 8192) and c [16384, 24576): 2.
    (run,) = plan.to_dict()["runs"]
    assert reqs(run) == [("m.safetensors", 0, 8192, [(ds, "arena", 0, 7000)]),
                         ("m.safetensors", 16384, 8192, [(ds + 17000 - 16384, "arena", 7000, 6000)])]
    assert (run["requests_uncoalesced"], run["copies_uncoalesced"]) == (2, 2)


def test_requests_are_cut_on_the_files_slot_grid(tmp_path):
    path = write_st(tmp_path / "m.safetensors", {"a": f32(1024), "b": f32(1500)})
    ds, offs = st_header(path)
    assert {k: s - ds for k, (s, _) in offs.items()} == {"a": 0, "b": 4096}
    assert ds <= 2192
    plan = compile_doc(tmp_path, [{"match": "b", "dtype": "float16"}, {"match": "*"}],
                       io={"slot": 8192, "slots": 1, "run": "1MiB", "merge_gap": 0})
    # b (to the landing buffer) straddles the grid line at 8192 joined or alone, so joining costs
    # no copy: 2 requests and 3 copies (a, b's head, b's tail) against 3 and 3. The cuts are the
    # file's, not the extent's: a request never crosses a multiple of the slot.
    (run,) = plan.to_dict()["runs"]
    assert reqs(run) == [("m.safetensors", 0, 8192, [(ds, "arena", 0, 4096), (ds + 4096, "landing", 0, 8192 - ds - 4096)]),
                         ("m.safetensors", 8192, 4096, [(0, "landing", 8192 - ds - 4096, ds + 10096 - 8192)])]
    t = plan.to_dict()["totals"]
    assert (t["requests"], t["requests_uncoalesced"], t["copies"], t["copies_uncoalesced"]) == (2, 3, 3, 3)


def test_kernels_and_landing_regions(tmp_path):
    path = write_st(tmp_path / "m.safetensors", {"a": f32(1024), "b": f32((2, 3)), "c": f32(512), "d": f32(1024)})
    ds, offs = st_header(path)
    assert {k: s - ds for k, (s, _) in offs.items()} == {"a": 0, "b": 4096, "c": 4120, "d": 6168}
    assert ds <= 2024
    rules = [{"match": "a", "dtype": "float16"}, {"match": "b", "transpose": True},
             {"match": "c", "dtype": "bfloat16"}, {"match": "*"}]
    plan = compile_doc(tmp_path, rules, io={"slot": 4096, "slots": 2, "run": 4096, "merge_gap": 0})
    d = plan.to_dict()
    f = "m.safetensors"
    # arena: a F16 2048 @0, b 24 @2048, c BF16 1024 @2072, d 4096 @3096 (aligned to 4 already)
    assert [(t["name"], t["dtype"], t["shape"], t["offset_bytes"], t["nbytes"]) for t in d["tensors"]] == [
        ("a", "F16", [1024], 0, 2048), ("b", "F32", [3, 2], 2048, 24), ("c", "BF16", [512], 2072, 1024),
        ("d", "F32", [1024], 3096, 4096)]
    # runs: a (4096) | b + c (24 + 2048) | d (4096)
    assert [r["parts"] for r in d["runs"]] == [[0], [1, 2], [3]]
    r0, r1, r2 = d["runs"]
    assert reqs(r0) == [(f, 0, 4096, [(ds, "landing", 0, 4096 - ds)]),
                        (f, 4096, 4096, [(0, "landing", 4096 - ds, ds)])]
    # landing offsets are aligned to the element size only, so b and c stay neighbours: one copy
    assert reqs(r1) == [(f, 4096, 4096, [(ds, "landing", 0, 2072)])]
    assert reqs(r2) == [(f, 4096, 4096, [(ds + 2072, "arena", 3096, 2024 - ds)]),
                        (f, 8192, 4096, [(0, "arena", 5120 - ds, ds + 2072)])]
    k = dict(scale_offset=None, block=0, src_space="landing", more=[], format="float", add=0.0, unpermute=0)
    assert r0["kernels"] == [dict(k, part=0, op="convert", src_dtype="F32", dst_dtype="F16", src_offset=0,
                                  dst_offset=0, numel=1024, rows=0, cols=0)]
    assert r1["kernels"] == [
        dict(k, format="transpose", part=1, op="transpose", src_dtype="F32", dst_dtype="F32", src_offset=0, dst_offset=2048,
             numel=6, rows=2, cols=3),
        dict(k, part=2, op="convert", src_dtype="F32", dst_dtype="BF16", src_offset=24, dst_offset=2072,
             numel=512, rows=0, cols=0)]
    assert r2["kernels"] == []
    assert [(r["landing_region"], r["landing_bytes"]) for r in d["runs"]] == [(0, 4096), (1, 2072), (0, 0)]
    # device = arena 7192 + landing regions (even runs 4096, odd runs 2072)
    assert d["layout"] == {"arena_bytes": 7192, "landing_region_bytes": [4096, 2072], "ring_bytes": 8192, "staging_bytes": 0, "scatter_segments": 0, "zero": [], "map_bytes": 0}
    assert d["timeline"] == [
        {"run": 0, "host_bytes": 8192, "device_bytes": 13360, "ring_bytes": 8192, "host_inflight_bytes": 0,
         "landing_bytes": 4096, "resident_bytes": 2048},
        {"run": 1, "host_bytes": 8192, "device_bytes": 13360, "ring_bytes": 8192, "host_inflight_bytes": 0,
         "landing_bytes": 6168, "resident_bytes": 3096},
        {"run": 2, "host_bytes": 8192, "device_bytes": 13360, "ring_bytes": 8192, "host_inflight_bytes": 0,
         "landing_bytes": 2072, "resident_bytes": 7192}]
    assert d["peak"] == {"host_bytes": 8192, "device_bytes": 13360}
    t = d["totals"]
    assert (t["requests"], t["requests_uncoalesced"], t["copies"], t["copies_uncoalesced"], t["kernels"]) == (5, 6, 5, 6, 3)
    assert (t["read_bytes"], t["payload_bytes"], t["resident_bytes"]) == (20480, 10264, 7192)
    assert [(p["path"], p["landing_bytes"]) for p in d["parts"]] == [
        ("direct", 4096), ("direct", 24), ("direct", 2048), ("direct", 0)]


def test_same_size_conversion_in_place(tmp_path):
    path = write_st(tmp_path / "m.safetensors", {"x": np.ones(2048, ml_dtypes.bfloat16)})
    ds, _ = st_header(path)
    plan = compile_doc(tmp_path, [{"match": "*", "dtype": "float16"}],
                       io={"slot": 8192, "slots": 1, "run": "1MiB", "merge_gap": 0})
    d = plan.to_dict()
    (run,) = d["runs"]
    assert reqs(run) == [("m.safetensors", 0, 8192, [(ds, "arena", 0, 4096)])]
    assert run["kernels"] == [{"part": 0, "op": "convert", "src_dtype": "BF16", "dst_dtype": "F16",
                               "src_space": "arena", "src_offset": 0, "scale_offset": None, "dst_offset": 0,
                               "numel": 2048, "rows": 0, "cols": 0, "block": 0, "more": [], "format": "float", "add": 0.0, "unpermute": 0}]
    assert d["layout"]["landing_region_bytes"] == [0, 0]
    assert d["parts"][0]["reason"] == "same-size conversion runs in place on the device"


def test_dequantize_lands_weight_and_scale(tmp_path):
    path = write_st(tmp_path / "m.safetensors", {"w": np.zeros((130, 5), ml_dtypes.float8_e4m3fn),
                                                 "w_scale_inv": np.ones((2, 1), np.float32)})
    ds, offs = st_header(path)
    assert {k: s - ds for k, (s, _) in offs.items()} == {"w_scale_inv": 0, "w": 8}
    plan = compile_doc(tmp_path, [{"match": "w", "dequantize": {}}],
                       io={"slot": 4096, "slots": 1, "run": "1MiB", "merge_gap": 0})
    d = plan.to_dict()
    (run,) = d["runs"]
    # landing follows the file: scale 8 bytes at 0, weight 650 bytes at 8 -> one copy
    assert reqs(run) == [("m.safetensors", 0, 4096, [(ds, "landing", 0, 658)])]
    assert run["kernels"] == [{"part": 0, "op": "dequantize", "src_dtype": "F8_E4M3", "dst_dtype": "BF16",
                               "src_space": "landing", "src_offset": 8, "scale_offset": 0, "dst_offset": 0,
                               "numel": 650, "rows": 130, "cols": 5, "block": 128, "more": [], "format": "fp8", "add": 0.0, "unpermute": 0}]
    assert d["layout"] == {"arena_bytes": 1300, "landing_region_bytes": [658, 0], "ring_bytes": 4096, "staging_bytes": 0, "scatter_segments": 0, "zero": [], "map_bytes": 0}
    assert d["peak"] == {"host_bytes": 4096, "device_bytes": 1958}
    assert d["skipped"] == []
    assert [i["role"] for i in d["parts"][0]["inputs"]] == ["weight", "scale"]


# ----------------------------------------------------------------------------- host path


@pytest.fixture
def host_ckpt(tmp_path):
    """a_h1 F32 [1024] (4096), b_h2 F32 [2048] (8192), c_g F32 [1024] (4096), in that order."""
    path = write_st(tmp_path / "m.safetensors", {"a_h1": f32(1024), "b_h2": f32(2048), "c_g": f32(1024)})
    ds, offs = st_header(path)
    assert {k: s - ds for k, (s, _) in offs.items()} == {"a_h1": 0, "b_h2": 4096, "c_g": 12288}
    return tmp_path, ds


HOST_RULES = [{"match": "*_h?", "on": "host", "dtype": "bfloat16"}, {"match": "*"}]
HOST_IO = {"slot": 4096, "slots": 1, "run": 8192, "merge_gap": 0}


def test_host_path_costs(host_ckpt):
    tmp_path, ds = host_ckpt
    d = compile_doc(tmp_path, HOST_RULES, io=HOST_IO).to_dict()
    # host cost of a host part = input bytes + output bytes + chunk scratch (planc.plan.hostcost: 24 bytes
    # a value, the whole tensor being one chunk): a_h1 4096 + 2048 + 1024 x 24, b_h2 8192 + 4096 + 2048 x 24
    a_h, b_h = 6144 + 1024 * 24, 12288 + 2048 * 24
    assert [(p["tensor"], p["path"], p["host_bytes"], p["landing_bytes"]) for p in d["parts"]] == [
        ("a_h1", "host", a_h, 0), ("b_h2", "host", b_h, 0), ("c_g", "direct", 0, 0)]
    steps = {s["id"]: (s["kind"], s["host_bytes"], s["device_bytes"], s["deps"]) for s in d["steps"]}
    assert steps["alloc:ring"] == ("alloc", 4096, 0, [])
    assert steps["alloc:device"] == ("alloc", 0, 10240, [])
    assert steps["read:a_h1#0:weight"] == ("read", 4096, 0, ["alloc:ring"])
    assert steps["normalize:a_h1#0"] == ("normalize", 2048 + 1024 * 24, 0, ["read:a_h1#0:weight"])
    assert steps["stage:a_h1#0"] == ("stage", 0, 2048, ["alloc:device", "normalize:a_h1#0"])
    assert steps["stage:c_g#0"] == ("stage", 0, 4096, ["alloc:device", "read:c_g#0:weight"])
    # runs: a_h1 (4096) | b_h2 (8192) | c_g (4096)
    assert [r["parts"] for r in d["runs"]] == [[0], [1], [2]]
    assert [r["host_parts"] for r in d["runs"]] == [[{"part": 0, "dst_offset": 0, "copies": 1}],
                                                    [{"part": 1, "dst_offset": 2048, "copies": 1}], []]
    assert [r["host_bytes"] for r in d["runs"]] == [a_h, b_h, 0]  # each run's largest host-path part
    assert [r["requests"] for r in d["runs"][:2]] == [[], []]
    assert reqs(d["runs"][2]) == [("m.safetensors", 12288, 4096, [(ds, "arena", 6144, 4096 - ds)]),
                                  ("m.safetensors", 16384, 4096, [(0, "arena", 10240 - ds, ds)])]
    # window k = ring + run k's host-path parts, one at a time (the executor drains a run's reads,
    # then reads, transforms and stages each host-path part, releasing its buffers before the next)
    assert [(w["host_bytes"], w["host_inflight_bytes"]) for w in d["timeline"]] == [
        (4096 + a_h, a_h), (4096 + b_h, b_h), (4096, 0)]
    assert d["peak"] == {"host_bytes": 4096 + b_h, "device_bytes": 10240}
    assert d["layout"] == {"arena_bytes": 10240, "landing_region_bytes": [0, 0], "ring_bytes": 4096, "staging_bytes": 0, "scatter_segments": 0, "zero": [], "map_bytes": 0}
    t = d["totals"]
    assert (t["requests"], t["requests_uncoalesced"], t["copies"], t["copies_uncoalesced"]) == (4, 4, 4, 4)
    assert (t["read_bytes"], t["payload_bytes"], t["kernels"]) == (4096 + 8192 + 8192, 16384, 0)
    assert [r["read_bytes"] for r in d["runs"]] == [4096, 8192, 8192]


# ring 4096 + a host part's reads, output and chunk scratch (planc.plan.hostcost: 24 bytes a value)
PEAK_H = 4096 + 8192 + 4096 + 2048 * 24  # run 1: b_h2
PEAK_A = 4096 + 4096 + 2048 + 1024 * 24  # run 0: a_h1


def test_host_path_refusal_names_first_failing_run(host_ckpt):
    tmp_path, _ = host_ckpt
    plan = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": PEAK_H - 1})
    r = plan.refusal
    assert not plan.fits
    assert (r.code, r.run, r.step, r.needed_bytes, r.allowed_bytes) == (
        "host-budget", 1, "normalize:b_h2#0", PEAK_H, PEAK_H - 1)
    assert r.step in {s.id for s in plan.steps}
    assert f"run 1 needs {PEAK_H:,} bytes" in r.message and f"{PEAK_H - 1:,} bytes" in r.message
    assert "on: device" in r.message
    # the same inputs give the same refusal; the peaks do not depend on the budget
    again = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": PEAK_H - 1})
    assert encode(again) == encode(plan)
    assert plan.peak.host_bytes == PEAK_H


def test_host_path_refusal_in_run_zero_when_part_alone_too_big(host_ckpt):
    tmp_path, _ = host_ckpt
    r = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": PEAK_A - 1}).refusal
    assert (r.code, r.run, r.step, r.needed_bytes) == ("host-budget", 0, "normalize:a_h1#0", PEAK_A)
    assert "on: device" in r.message


def test_host_budget_exactly_fits(host_ckpt):
    tmp_path, _ = host_ckpt
    assert compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": PEAK_H}).fits


# ----------------------------------------------------------------------------- refusals


def test_ring_refusal(abcd):
    tmp_path, _ = abcd
    plan = compile_doc(tmp_path, RULES_ABCD, io={"slot": 4096, "slots": 4, "run": "1MiB", "merge_gap": 0},
                       budget={"host": 16383})
    r = plan.refusal
    assert (r.code, r.run, r.step, r.needed_bytes, r.allowed_bytes) == (
        "host-budget", 0, "alloc:ring", 16384, 16383)
    assert "io.slots (now 4)" in r.message
    assert plan.to_dict()["fits"] is False


def test_device_refusal(abcd):
    tmp_path, _ = abcd
    plan = compile_doc(tmp_path, RULES_ABCD, io={"slot": 4096, "slots": 2, "run": "1MiB", "merge_gap": 0},
                       budget={"host": "1MiB", "device": 12287})
    r = plan.refusal
    assert (r.code, r.run, r.step, r.needed_bytes, r.allowed_bytes) == (
        "device-budget", 0, "stage:d#0", 12288, 12287)
    assert r.step in {s.id for s in plan.steps}
    assert "budget.device" in r.message
    ok = compile_doc(tmp_path, RULES_ABCD, io={"slot": 4096, "slots": 2, "run": "1MiB", "merge_gap": 0},
                     budget={"host": "1MiB", "device": 12288})
    assert ok.fits


def test_nothing_placed_allocates_nothing(abcd):
    tmp_path, _ = abcd
    d = compile_doc(tmp_path, [{"match": "*", "skip": True}], io={"slot": 4096}, budget={"host": 0}).to_dict()
    assert d["fits"]
    assert d["layout"] == {"arena_bytes": 0, "landing_region_bytes": [0, 0], "ring_bytes": 0, "staging_bytes": 0, "scatter_segments": 0, "zero": [], "map_bytes": 0}
    assert d["runs"] == [] and d["skipped"] == ["a", "b", "c", "d"]
    assert d["peak"] == {"host_bytes": 0, "device_bytes": 0}


# ----------------------------------------------------------------------------- determinism


def test_plan_json_byte_identical(tmp_path):
    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    doc = {"checkpoint": "ck/model.safetensors", "budget": {"host": "1MiB"},
           "io": {"slot": "16KiB", "slots": 2, "run": "32KiB", "merge_gap": "4KiB"},
           "rules": [{"match": "model.layers.{L}.self_attn.{P}.weight",
                      "fuse": {"into": "model.layers.{L}.self_attn.qkv.weight", "over": "P",
                               "order": ["q_proj", "k_proj", "v_proj"]}},
                     {"match": "*mlp*", "dtype": "float16", "on": "host"}, {"match": "*norm*", "dtype": "float32"},
                     {"match": "*"}]}
    p = write_spec(tmp_path, doc)
    a, b = compile_spec(p), compile_spec(p)
    assert encode(a) == encode(b)
    assert a.fits and len(a.runs) > 2 and a.totals.kernels > 0
    save_plan(a, tmp_path / "plan.json")
    assert (tmp_path / "plan.json").read_text() == encode(a)
    assert encode(load_plan(tmp_path / "plan.json")) == encode(a)


def raw_st(path, entries, key_order):
    """A safetensors file with data in `entries` order, header keys in `key_order`, header padded to 512 bytes."""
    header, data, off = {}, b"", 0
    for name, arr in entries:
        b = arr.tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        data, off = data + b, off + len(b)
    h = json.dumps({k: header[k] for k in key_order}).encode()
    h += b" " * (512 - len(h))
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def counts(plan):
    d = plan.to_dict()
    return (d["totals"], d["peak"], d["layout"],
            [(r["read_bytes"], r["payload_bytes"], r["host_bytes"], r["landing_bytes"], len(r["requests"]),
              [[c[1:] for c in q["copies"]] for q in r["requests"]]) for r in d["runs"]],
            d["timeline"])


def test_plan_does_not_depend_on_header_key_order_or_names(tmp_path):
    arrs = [np.zeros(300, np.float32), np.zeros((7, 9), np.float16), np.zeros(1500, np.float32),
            np.zeros(64, np.float16), np.zeros(5000, np.float32)]
    io = {"slot": 8192, "slots": 2, "run": 12000, "merge_gap": 512}
    rules = [{"match": "*", "source_dtype": ["F16"], "dtype": "float32"}, {"match": "*"}]
    results = []
    for k, names in enumerate([["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e"], ["q", "zz", "m", "b0", "x"]]):
        folder = tmp_path / str(k)
        folder.mkdir()
        order = names if k != 1 else list(reversed(names))
        raw_st(folder / "m.safetensors", list(zip(names, arrs)), order)
        results.append(compile_doc(folder, rules, io=io))
    first = results[0].to_dict()
    second = results[1].to_dict()
    for d in (first, second):
        d.pop("checkpoint"), d.pop("spec")
    assert first == second  # header key order changes nothing at all
    assert counts(results[0]) == counts(results[2])  # renaming changes only the names


def test_renaming_keeps_costs_with_safetensors_layout(tmp_path):
    shapes = [(3, 5), (40,), (17,), (2, 2, 2)]
    plans = []
    for k, names in enumerate([["w0", "w1", "w2", "w3"], ["b.x", "b.y", "c.z", "d.w"]]):
        folder = tmp_path / str(k)
        write_st(folder / "m.safetensors", {n: np.ones(s, np.float32) for n, s in zip(names, shapes)})
        plans.append(compile_doc(folder, [{"match": "*", "dtype": "float16"}],
                                 io={"slot": 4096, "slots": 3, "run": 100, "merge_gap": 16}))
    # names sort the same way in both, so the file layout is the same and so is every figure
    assert counts(plans[0]) == counts(plans[1])


# ----------------------------------------------------------------------------- explain and plan files


def test_explain_reads_the_same_timeline(host_ckpt):
    tmp_path, _ = host_ckpt
    plan = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": PEAK_H - 1, "device": "1MiB"})
    e = explain_doc(plan)
    assert e["fits"] is False and e["refusal"] == plan.to_dict()["refusal"]
    assert [r["host_peak_bytes"] for r in e["runs"]] == [w["host_bytes"] for w in plan.to_dict()["timeline"]]
    assert e["headroom"] == {"host_bytes": -1, "device_bytes": 2**20 - 10240}
    assert [r["requests"] for r in e["runs"]] == [1, 1, 2]
    assert sum(r["requests"] for r in e["runs"]) == e["totals"]["requests"]
    # the step that holds the most host memory in each run: the normalize of an F32 -> BF16 part (its
    # output plus the transform's counted chunk scratch, more than its read buffer), as the refusal names it
    assert [r["dominant_step"] for r in e["runs"]] == ["normalize:a_h1#0", "normalize:b_h2#0", "alloc:ring"]
    assert e["refusal"]["step"] == e["runs"][e["refusal"]["run"]]["dominant_step"]


@pytest.mark.parametrize("host, run", [(PEAK_A - 1, 0), (PEAK_H - 1, 1)])
def test_explain_dominant_step_is_the_refusals(host_ckpt, host, run):
    """explain's dominant step of the refused run is the step the refusal names (one replay, one answer)."""
    tmp_path, _ = host_ckpt
    plan = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": host})
    r = plan.refusal
    assert r.code == "host-budget" and r.run == run
    e = explain_doc(plan)
    assert e["runs"][run]["dominant_step"] == r.step == e["refusal"]["step"]
    assert r.step in {s.id for s in plan.steps}
    # and a plan that fits shows the same steps for its runs
    fits = compile_doc(tmp_path, HOST_RULES, io=HOST_IO, budget={"host": 1 << 20})
    assert [x["dominant_step"] for x in explain_doc(fits)["runs"]] == [x["dominant_step"] for x in e["runs"]]


def test_load_plan_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"kind": "other"}')
    with pytest.raises(PlanFormatError) as info:
        load_plan(tmp_path / "x.json")
    assert info.value.code == "plan-kind"
    (tmp_path / "y.json").write_text('{"kind": "planc-plan", "format": 999}')
    with pytest.raises(PlanFormatError) as info:
        load_plan(tmp_path / "y.json")
    assert info.value.code == "plan-version"
    (tmp_path / "z.json").write_text("{")
    with pytest.raises(PlanFormatError) as info:
        load_plan(tmp_path / "z.json")
    assert info.value.code == "plan-syntax"


def test_permuting_names_of_same_shaped_tensors_keeps_costs(tmp_path):
    shapes = {"w0": ((3, 5), np.float32), "w1": ((3, 5), np.float32), "w2": ((3, 5), np.float32),
              "h0": ((40,), np.float16), "h1": ((40,), np.float16)}
    perm = {"w0": "w2", "w1": "w0", "w2": "w1", "h0": "h1", "h1": "h0"}
    rules = [{"match": "*", "source_dtype": ["F16"], "dtype": "float32"}, {"match": "*"}]
    plans = []
    for k, names in enumerate([{n: n for n in shapes}, perm]):
        folder = tmp_path / str(k)
        write_st(folder / "m.safetensors", {names[n]: np.ones(s, dt) for n, (s, dt) in shapes.items()})
        plans.append(compile_doc(folder, rules, io={"slot": 4096, "slots": 2, "run": 64, "merge_gap": 8}))
    assert counts(plans[0]) == counts(plans[1])
    strip = [{k: v for k, v in p.to_dict().items() if k not in ("checkpoint", "spec")} for p in plans]
    assert strip[0] == strip[1]  # same names, same shapes, same layout: the very same plan


def test_the_package_states_the_plan_format_it_reads():
    import planc
    from planc.plan.check import FORMAT

    assert planc.PLAN_FORMAT == FORMAT


def test_a_kernel_record_of_another_format_is_refused(tmp_path):
    """Each kernel record names its format (`planc.base.formats`); one the part's op and dtypes do not
    decide, or one no class serves, is refused with the field named."""
    from planc.plan.codec import decode

    path = write_st(tmp_path / "m.safetensors", {"x": np.ones(2048, np.float32)})
    assert path
    plan = compile_doc(tmp_path, [{"match": "*", "dtype": "bfloat16"}],
                       io={"slot": 8192, "slots": 1, "run": "1MiB", "merge_gap": 0})
    doc = json.loads(encode(plan))
    assert doc["runs"][0][2][0][13] == "float"
    for bad, why in (("fp8", "is a float kernel"), ("q4", "must be one of float, transpose")):
        doc["runs"][0][2][0][13] = bad
        with pytest.raises(PlanFormatError, match=r"runs\[0\]\.kernels\[0\]\.format.*" + why):
            decode(json.dumps(doc))

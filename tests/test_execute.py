"""End-to-end tests of `planc.execute` under the CUDA simulator: spec -> plan -> LoadedModel.

Every load is checked twice: by `execute(plan, verify=True)` (the executor's own host
reference) and independently here, by comparing `model[name].to_host()` bit for bit with
numpy / ml_dtypes arrays built from the tensors the test wrote.

The simulator is switched on before numba is first imported (tests/test_kernels.py does the
same; whichever module pytest imports first decides, and both ask for it). Every simulated
thread is a Python thread, so checkpoints are the tiny synthetic families, and conversions
run on a few tensors only.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import errno  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import struct  # noqa: E402
import weakref  # noqa: E402

import ml_dtypes  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

import planc.execute.pipeline.parts as parts_mod  # noqa: E402
from execute_support import (CONVERSIONS, NP, QKV, SMALL_IO, STACK, TARGET, RecordingDevice, assert_model, assert_tensor, cast,  # noqa: E402
                             refuse_direct_open,
                             cold_page_cache, convert_source, dequantized, fp8_rules, fused, gone, handmade, live_room_by_call, reader_of,
                             use_parts, watch_regions,
                             load_checked, spec_file, stacked, synth)
from planc.face import cli  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import AdmissionError, FingerprintError, PlancError, ReadError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.pipeline.events import CopyIssued  # noqa: E402
from planc.execute.pipeline.parts import Parts  # noqa: E402
from planc.execute.io.reader import Reader  # noqa: E402
from planc.execute.pipeline.verify import verify_model  # noqa: E402
from planc.plan.codec import encode, load_plan, save_plan  # noqa: E402


@pytest.fixture
def load():
    """compile + execute(verify=True) + the plan's totals checked (execute_support.load_checked);
    every model is freed at teardown."""
    models = []
    yield lambda spec_path, **kw: load_checked(spec_path, models, **kw)
    for m in models:
        m.free()


@pytest.fixture
def dense(tmp_path):
    return synth(tmp_path, "dense", layers=1)


def _no_allocation(monkeypatch):
    """Every part that allocates (regions: device memory and the pinned ring; the reader; the pool;
    the warmer) refuses to be built: a load that gets past admission fails the test."""
    def refuse(*a, **k):
        raise AssertionError("allocated although the plan was refused")

    use_parts(monkeypatch, regions=refuse, reader=refuse, pool=refuse, warmer=refuse)


# ------------------------------------------------------------------------------------------
# pure copies and the I/O shape


def test_pure_copies_dense(tmp_path, load):
    path, want = synth(tmp_path, "dense")
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    assert plan.totals.kernels == 0 and plan.layout.landing_region_bytes == (0, 0)
    assert_model(model, want)


def test_sharded_checkpoint_with_progress(tmp_path, load):
    path, want = synth(tmp_path, "dense", layers=2, shards=3)
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO), progress=True)
    assert len(plan.to_dict()["checkpoint"]["files"]) == 3
    assert_model(model, want)
    assert sorted(model.report["files"]) == sorted(f["path"] for f in plan.to_dict()["checkpoint"]["files"])


def _odd_sizes(tmp_path):
    rng = np.random.default_rng(7)
    return handmade(tmp_path, {
        "a.small": rng.standard_normal(3).astype(np.float32),
        "b.big": rng.standard_normal(2500).astype(np.float32),  # 10,000 bytes: three 4 KiB slots
        "c.bf16": rng.standard_normal((17, 13)).astype(ml_dtypes.bfloat16),
        "d.big16": rng.standard_normal((41, 125)).astype(np.float16),  # 10,250 bytes
        "e.tail": rng.standard_normal(5).astype(np.float32),
    })


def test_tensor_larger_than_a_slot(tmp_path, load):
    path, want = _odd_sizes(tmp_path)
    rules = [{"match": "b.big", "dtype": "bfloat16"}, {"match": "d.big16", "dtype": "bfloat16"}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 2, "workers": 2}))
    reqs = [q for r in plan.to_dict()["runs"] for q in r["requests"]]
    assert all(q["length"] <= 4096 for q in reqs) and len(reqs) >= 6
    want = dict(want, **{"b.big": cast(want["b.big"], "BF16"), "d.big16": cast(want["d.big16"], "BF16")})
    assert_model(model, want)


def test_a_load_goes_through_the_device_it_is_given(tmp_path, load):
    """`execute(plan, device=...)` takes a device object: every kernel of the load is launched
    through it, one launch per kernel the plan predicts, on the grids its geometry chooses (here
    the simulator's, recorded on the way), and the model is bit-exact."""
    from planc.execute.device.geometry import SimGrid
    from planc.execute.device.seam import default_device

    path, want = _odd_sizes(tmp_path)
    rules = [{"match": "b.big", "dtype": "bfloat16"}, {"match": "d.big16", "dtype": "bfloat16"}, {"match": "*"}]
    rec = RecordingDevice(default_device())
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 2, "workers": 2}), device=rec)
    assert_model(model, dict(want, **{"b.big": cast(want["b.big"], "BF16"), "d.big16": cast(want["d.big16"], "BF16")}))
    assert len(rec.launches) == plan.totals.kernels == model.report["kernels"]["issued"] >= 2
    sim = SimGrid()
    for name, grid, block, args in rec.launches:
        assert name in ("f32_to_bf16", "f16_to_bf16") and (grid, block) == sim.map(args[-1])
    assert model.simulated == default_device().simulated


def test_landing_regions_are_aligned_for_any_element_type(tmp_path, load):
    """Run 0 lands 10 bytes of F16, run 1 lands F32 in the other region, which must start 4-byte aligned."""
    a, b = np.arange(5, dtype=np.float16) / 3, np.arange(7, dtype=np.float32) / 3
    save_file({"a": a}, str(tmp_path / "m1.safetensors"))
    save_file({"b": b}, str(tmp_path / "m2.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"a": "m1.safetensors", "b": "m2.safetensors"}}))
    rules = [{"match": "a", "dtype": "float32"}, {"match": "b", "dtype": "bfloat16"}]
    plan, model = load(spec_file(tmp_path, index, rules, io={"slot": 4096, "slots": 2, "run": 1}))
    assert plan.layout.landing_region_bytes == (10, 28)
    assert_model(model, {"a": cast(a, "F32"), "b": cast(b, "BF16")})


def test_ring_of_one_slot(tmp_path, load, dense):
    path, want = dense
    rules = [{"match": "model.layers.0.self_attn.k_proj.weight", "dtype": "float32"},
             {"match": "model.layers.0.self_attn.v_proj.weight", "dtype": "float16"}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 1, "workers": 4}))
    assert plan.layout.ring_bytes == 4096
    k, v = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
    assert_model(model, dict(want, **{k: cast(want[k], "F32"), v: cast(want[v], "F16")}))


def test_more_workers_than_parts(tmp_path, load):
    path, want = _odd_sizes(tmp_path)
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io={"workers": 32, "slot": 4096}))
    assert plan.io.workers == 32 > len(plan.to_dict()["parts"])
    assert_model(model, want)


def test_several_runs_with_kernels(tmp_path, load, dense):
    """Small runs: landing regions alternate between runs and are reused two runs later."""
    path, want = dense
    rules = [{"match": "model.layers.0.self_attn.*", "dtype": "float32"},
             {"match": "model.layers.0.*layernorm.weight", "dtype": "float16"}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules,
                                  io={"slot": 4096, "slots": 3, "run": "8KiB", "merge_gap": 0}))
    assert plan.totals.runs >= 6
    assert sum(1 for r in plan.to_dict()["runs"] if r["kernels"]) >= 3
    for name in want:
        if ".self_attn." in name:
            want[name] = cast(want[name], "F32")
        elif "layernorm" in name:
            want[name] = cast(want[name], "F16")
    assert_model(model, want)


def test_merge_gap_zero_and_large(tmp_path, load, dense):
    path, want = dense
    rules = [{"match": "*layernorm*", "skip": True}, {"match": "*"}]
    for k in [k for k in want if "layernorm" in k]:
        del want[k]
    requests = {}
    for gap in (0, "1MiB"):
        spec = spec_file(tmp_path, path, rules, io={"slot": "64KiB", "merge_gap": gap}, name=f"gap{gap}.yaml")
        plan, model = load(spec)
        assert_model(model, want)
        requests[gap] = plan.totals.requests
        assert plan.totals.requests <= plan.totals.requests_uncoalesced
        model.free()
    assert requests[0] > requests["1MiB"]


# ------------------------------------------------------------------------------------------
# conversions


@pytest.mark.parametrize("on", ["device", "host"])
@pytest.mark.parametrize("src,target", CONVERSIONS)
def test_conversion(tmp_path, load, src, target, on):
    path, want = convert_source(tmp_path, src)
    rules = [{"match": "conv.*", "dtype": target, "on": on}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 2}))
    paths = {p["tensor"]: p["path"] for p in plan.to_dict()["parts"]}
    assert paths["conv.a"] == ("host" if on == "host" else "direct")
    same_size = NP[src].itemsize == NP[TARGET[target]].itemsize
    if on == "device":
        # one conversion per tensor with elements (conv.empty has nothing to convert); tensors end to
        # end in the file and the arena share one launch
        assert sum(len(k.parts) for r in plan.runs for k in r.kernels) == 3 and 1 <= plan.totals.kernels <= 3
        assert plan.layout.landing_region_bytes == (0, 0) if same_size else sum(
            plan.layout.landing_region_bytes) > 0
    else:
        assert plan.totals.kernels == 0 and model.report["kernels"]["issued"] == 0
    t = TARGET[target]
    assert_model(model, {k: v if k == "keep.c" else cast(v, t) for k, v in want.items()})
    assert model["conv.empty"].shape == (0, 3) and model["conv.scalar"].shape == ()
    assert model["conv.a"].dtype == t and model["keep.c"].dtype == src


@pytest.mark.parametrize("rule", [{"dtype": "bfloat16"}, {"dtype": "float16"}, {"transpose": True},
                                  {"source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": "bfloat16"}])
def test_tensors_of_no_elements_on_the_device_need_no_kernel(tmp_path, load, rule):
    """An empty tensor first (its own run's start) under a size-changing conversion, a transpose or a
    dequantization on the device: the compiled plan passes the plan's own check (a saved plan read
    back) and loads; the empty tensors keep their shapes and target dtype, the others load right."""
    from planc.plan.codec import decode, encode

    fp8 = "dequantize" in rule
    src = ml_dtypes.float8_e4m3fn if fp8 else np.float32
    w = (np.arange(6 * 8, dtype=np.float32).reshape(6, 8) / 8).astype(src)
    tensors = {"a.empty": np.zeros((0, 8), src), "b.w": w, "c.empty": np.zeros((8, 0), src)}
    if fp8:
        tensors |= {"a.empty_scale_inv": np.zeros((0, 1), np.float32), "b.w_scale_inv": np.ones((1, 1), np.float32),
                    "c.empty_scale_inv": np.zeros((1, 0), np.float32)}
    path, want = handmade(tmp_path, tensors)
    rules = [{"match": "*", "on": "device", **rule}] if not fp8 else [
        {"match": "*", "on": "device", **rule}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=SMALL_IO))
    text = encode(plan)
    assert encode(decode(text)) == text  # the plan's check accepts what compile wrote
    assert plan.totals.kernels == 1
    b = want["b.w"].astype(np.float32)
    if rule.get("transpose"):
        b = np.ascontiguousarray(b.T)
        assert model["a.empty"].shape == (8, 0) and model["c.empty"].shape == (0, 8)
    else:
        assert model["a.empty"].shape == (0, 8) and model["c.empty"].shape == (8, 0)
    target = TARGET.get(rule.get("dtype"), "F32")
    assert model["a.empty"].dtype == model["b.w"].dtype == target
    assert_tensor(model, "b.w", cast(b, target))


# ------------------------------------------------------------------------------------------
# packs: fuse, stack, transpose; FP8 dequantization


def test_fuse_qkv(tmp_path, load):
    path, want = synth(tmp_path, "dense")
    plan, model = load(spec_file(tmp_path, path, [QKV, {"match": "*"}], io=SMALL_IO))
    assert model["model.layers.1.self_attn.qkv_proj.weight"].shape == (64 + 16 + 16, 64)
    assert_model(model, fused(want, 2))


@pytest.mark.parametrize("target,on", [("float16", "device"), ("float32", "host")])
def test_fuse_qkv_with_conversion(tmp_path, load, dense, target, on):
    path, want = dense
    rule = dict(QKV, dtype=target, on=on)
    plan, model = load(spec_file(tmp_path, path, [rule, {"match": "*"}], io=SMALL_IO))
    assert_model(model, fused(want, 1, TARGET[target]))


def test_stack_moe_experts(tmp_path, load):
    path, want = synth(tmp_path, "moe")
    plan, model = load(spec_file(tmp_path, path, [STACK, {"match": "*"}], io=SMALL_IO))
    assert model["model.layers.0.mlp.experts.down_proj"].shape == (8, 64, 32)
    assert_model(model, stacked(want, 2, 8))


def test_stack_moe_experts_converted_in_place(tmp_path, load):
    path, want = synth(tmp_path, "moe", layers=1)
    rule = dict(STACK, match="model.layers.{L}.mlp.experts.{E}.down_proj.weight",
                stack={"into": "model.layers.{L}.mlp.experts.down_proj", "over": "E"}, dtype="float16")
    plan, model = load(spec_file(tmp_path, path, [rule, {"match": "*"}], io=SMALL_IO))
    # eight experts converted in place, stacked end to end: one launch per run that holds them, not one per expert
    assert sum(len(k.parts) for r in plan.runs for k in r.kernels) == 8 and plan.layout.landing_region_bytes == (0, 0)
    holding = sum(1 for r in plan.runs if r.kernels)
    assert sum(len(r.kernels) for r in plan.runs) == holding < 8
    assert model.report["kernels"]["issued"] == plan.totals.kernels == holding + sum(r.scatters for r in plan.runs)
    out = {k: v for k, v in want.items() if not k.endswith(".down_proj.weight")}
    out["model.layers.0.mlp.experts.down_proj"] = cast(
        np.stack([want[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] for e in range(8)]), "F16")
    assert_model(model, out)


def test_stack_moe_experts_through_the_scatter_kernel(tmp_path, load):
    """Slots of many experts each: a request goes whole to a device staging slot and one kernel
    scatters it; the in-place conversion of the stacked tensor runs after the scatter."""
    path, want = synth(tmp_path, "moe")
    rules = [dict(STACK, match="model.layers.{L}.mlp.experts.{E}.down_proj.weight",
                  stack={"into": "model.layers.{L}.mlp.experts.down_proj", "over": "E"}, dtype="float16"),
             STACK, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=dict(SMALL_IO, slot="64KiB", slots=2)))
    assert plan.totals.scatters >= 2 and plan.layout.staging_bytes > 0
    # one staging slot, taken in turn: the stream orders each copy into it after the kernel that read it
    assert plan.layout.staging_bytes == plan.io.slot_bytes
    assert {q.staging for r in plan.runs for q in r.requests if q.scatter} == {0}
    out = stacked(want, 2, 8)
    for L in range(2):
        out[f"model.layers.{L}.mlp.experts.down_proj"] = cast(out[f"model.layers.{L}.mlp.experts.down_proj"], "F16")
    assert_model(model, out)


def test_scatter_blocks_follow_the_bytes_not_the_pieces(tmp_path, load):
    """A scattered request of a few large pieces runs on many blocks: the grid's y splits each piece
    (the table keeps one row per copy). Under the simulator each piece goes to two blocks, so a load
    through the split grid is checked bit for bit."""
    from planc.execute.kernels import dispatch
    from planc.execute.device.geometry import GpuGrid
    from planc.execute.device.seam import default_device

    path, want = synth(tmp_path, "moe")
    spec = spec_file(tmp_path, path, [STACK, {"match": "*"}], io=dict(SMALL_IO, slot="64KiB", slots=2))
    plan = compile_spec(spec)
    table, where = dispatch.scatter_table(plan)
    assert plan.totals.scatters >= 2 and len(table) == plan.layout.scatter_segments
    for (run, qi), (first, last, longest) in where.items():
        q = plan.runs[run].requests[qi]
        assert last - first == len(q.copies) and longest == max(c.nbytes for c in q.copies) // q.width
        assert dispatch.scatter_grid(last - first, longest, default_device())[1] == (2 if longest > 32 else 1)
    h200 = RecordingDevice(default_device(), grid=GpuGrid(132), forward=False)  # the GPU's geometry
    assert dispatch.scatter_grid(4, 458_752, h200) == (4, 132)  # four 3.5 MiB pieces of 8-byte words: 528 blocks
    assert dispatch.scatter_grid(600, 100, h200) == (600, 1)  # many small pieces: one block each
    assert dispatch.scatter_grid(1, 10, h200) == (1, 1)
    rec = RecordingDevice(default_device())
    plan, model = load(spec, device=rec)
    assert_model(model, stacked(want, 2, 8))
    scatters = [(grid, block) for name, grid, block, _ in rec.launches if name.startswith("scatter_")]
    assert len(scatters) == plan.totals.scatters  # one launch a scattered request, each on the simulator's grid
    for (run, qi), (first, last, longest) in where.items():
        assert (dispatch.scatter_grid(last - first, longest, default_device()), 32) in scatters


@pytest.mark.parametrize("target", ["float16", "float32"])
def test_a_slow_read_does_not_hold_up_the_reads_after_it_but_runs_stay_in_order(tmp_path, monkeypatch, load,
                                                                                 target):
    """The first request of every run is read slowly: the requests after it in its run are sent on
    as their reads finish, before it; no request of a run that lands in a landing region (float32:
    converted from one) is sent on before every request of the run before it (it may land in a region
    whose kernels have not run yet), while a run that writes only its arena bytes (float16: converted
    in place) is sent on as its reads finish, overtaking the slow read of the run before. Bit-exact."""
    import threading
    import time as _time

    from planc.execute.pipeline.loader import unordered

    path, want = synth(tmp_path, "dense")
    rules = [{"match": "model.layers.*.mlp.*_proj.weight", "dtype": target}, {"match": "*"}]
    spec = spec_file(tmp_path, path, rules, io=dict(SMALL_IO, slots=4, workers=4))
    plan = compile_spec(spec)
    free = [unordered(r) for r in plan.runs]
    assert all(free) if target == "float16" else not any(free[1:]), free
    firsts = {(r.index, 0) for r in plan.runs if len(r.requests) > 2}
    slow = {(r.requests[0].file, r.requests[0].offset) for r in plan.runs if len(r.requests) > 2}
    assert len(firsts) >= 2
    order, lock = [], threading.Lock()

    class SlowReader(Reader):
        def read_into(self, rel, offset, length, buf, needed):
            if (rel, offset) in slow:  # the same plan compiled again: requests are equal, not the same
                _time.sleep(0.3)
            return super().read_into(rel, offset, length, buf, needed)

        def read_strided(self, rel, offset, *a):
            if (rel, offset) in slow:
                _time.sleep(0.3)
            return super().read_strided(rel, offset, *a)

    def observe(event):  # each request sent on to the device, in the order the pipeline sends them
        if isinstance(event, CopyIssued) and event.request is not None:
            with lock:
                order.append((event.run, event.request))

    _, model = load(spec, parts=Parts(reader=reader_of(SlowReader)), observer=observe)
    assert sorted(order) == sorted((r.index, qi) for r in plan.runs for qi in range(len(r.requests)))
    assert any(order.index((run, 0)) > order.index((run, 1)) for run, _ in firsts)  # overtaken
    runs = [run for run, _ in order]
    if target == "float32":
        assert runs == sorted(runs), runs  # runs in plan order
    else:
        assert runs != sorted(runs), runs  # a later run's reads overtook an earlier run's slow one
    want = {k: cast(v, TARGET[target]) if ".mlp." in k and k.endswith("_proj.weight") else v for k, v in want.items()}
    assert_model(model, want)


def test_runs_through_landing_regions_and_in_place_runs_mixed_keep_their_order_where_it_matters(tmp_path, load):
    """MLP weights to float32 (through a landing region) and attention weights to float16 (in place):
    runs of both kinds, each run's first read slow. A run through a landing region is sent on only
    after every request of every run before it; the in-place runs between them may overtake; every
    value bit-exact."""
    import threading
    import time as _time

    from planc.execute.pipeline.loader import unordered

    path, want = synth(tmp_path, "dense")
    rules = [{"match": "model.layers.*.mlp.*_proj.weight", "dtype": "float32"},
             {"match": "model.layers.*.self_attn.*_proj.weight", "dtype": "float16"}, {"match": "*"}]
    spec = spec_file(tmp_path, path, rules, io=dict(SMALL_IO, slots=4, workers=4))
    plan = compile_spec(spec)
    free = [unordered(r) for r in plan.runs]
    assert any(free) and not all(free), free
    slow = {(r.requests[0].file, r.requests[0].offset) for r in plan.runs if r.requests}
    order, lock = [], threading.Lock()

    class SlowReader(Reader):
        def read_into(self, rel, offset, length, buf, needed):
            if (rel, offset) in slow:
                _time.sleep(0.05)
            return super().read_into(rel, offset, length, buf, needed)

    def observe(event):
        if isinstance(event, CopyIssued) and event.request is not None:
            with lock:
                order.append(event.run)

    _, model = load(spec, parts=Parts(reader=reader_of(SlowReader)), observer=observe)
    for r in plan.runs:
        if not free[r.index] and r.requests:
            first = order.index(r.index)
            assert all(run >= r.index for run in order[first:]), (r.index, order)  # all before it were sent
    want = {k: cast(v, "F32") if ".mlp." in k and k.endswith("_proj.weight") else
            cast(v, "F16") if ".self_attn." in k and k.endswith("_proj.weight") else v for k, v in want.items()}
    assert_model(model, want)


@pytest.mark.parametrize("on,target", [("device", "keep"), ("host", "keep"), ("host", "float32")])
def test_transpose(tmp_path, load, dense, on, target):
    path, want = dense
    name = "model.layers.0.mlp.down_proj.weight"  # [64, 160]
    rules = [{"match": name, "transpose": True, "on": on, "dtype": target}, {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io=SMALL_IO))
    t = np.ascontiguousarray(want[name].T)
    want[name] = cast(t, "F32") if target == "float32" else t
    assert model[name].shape == (160, 64)
    assert_model(model, want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_dequantize_fp8_on_host(tmp_path, load, target):
    path, want = synth(tmp_path, "fp8", layers=1)
    plan, model = load(spec_file(tmp_path, path, fp8_rules(target, "host"), io=SMALL_IO))
    assert plan.totals.kernels == 0
    assert_model(model, dequantized(want, TARGET[target]))
    assert model["model.layers.0.mlp.up_proj.weight"].dtype == TARGET[target]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_dequantize_fp8_on_device(tmp_path, load, target):
    """Attention weights only (the simulator is slow); the MLP weights load as raw FP8 + scales."""
    path, want = synth(tmp_path, "fp8", layers=1)
    rules = fp8_rules(target, "device", match="*.self_attn.*")
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 4, "run": "12KiB"}))
    assert plan.totals.kernels == 4 and plan.totals.runs > 1
    assert_model(model, dequantized(want, TARGET[target], lambda n: ".self_attn." in n))
    assert model["model.layers.0.mlp.up_proj.weight"].dtype == "F8_E4M3"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mixed_plan_through_a_one_slot_ring(tmp_path, load):
    """Host-path and device-path parts interleaved in small runs, all staged through one slot."""
    path, want = synth(tmp_path, "fp8", layers=1)
    rules = [{"match": "*.self_attn.[qk]_proj.weight", "source_dtype": ["F8_E4M3"], "dequantize": {}},
             {"match": "*", "source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": "float16", "on": "host"},
             {"match": "*layernorm.weight", "dtype": "float32"},
             {"match": "lm_head.weight", "transpose": True, "on": "host"},
             {"match": "*"}]
    plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 1, "run": "16KiB", "workers": 3}))
    paths = {p["path"] for p in plan.to_dict()["parts"]}
    assert paths == {"direct", "host"} and plan.totals.runs > 3 and plan.layout.ring_bytes == 4096
    qk = lambda n: ".self_attn.q_proj" in n or ".self_attn.k_proj" in n  # noqa: E731
    out = dequantized(want, "F16", lambda n: not qk(n))
    out.update({k: v for k, v in dequantized(want, "BF16", qk).items() if qk(k)})
    out = {k: v for k, v in out.items() if not k.endswith("_scale_inv")}
    for k in out:
        if k.endswith("layernorm.weight"):
            out[k] = cast(out[k], "F32")
    out["lm_head.weight"] = np.ascontiguousarray(want["lm_head.weight"].T)
    assert_model(model, out)


def test_verify_finds_a_corrupted_tensor(tmp_path, load, dense):
    path, want = dense
    plan, model = load(spec_file(tmp_path, path, [QKV, {"match": "*"}], io=SMALL_IO))
    name = "model.layers.0.self_attn.qkv_proj.weight"
    host = model[name].raw.copy_to_host()
    host[777] ^= 1
    model[name].raw.copy_to_device(host)
    rep = verify_model(plan, model)
    assert not rep["ok"] and len(rep["mismatches"]) == 1 and name in rep["mismatches"][0]


# ------------------------------------------------------------------------------------------
# refusals, changed files, failed reads


def test_refused_plan_raises_before_allocating(tmp_path, dense, monkeypatch):
    path, _ = dense
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], host="64KiB",
                                   io={"slot": "64KiB", "slots": 4}))
    assert not plan.fits
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.exit_code == 3 and ei.value.code == "host-budget"
    assert ei.value.refusal.needed_bytes > ei.value.refusal.allowed_bytes == 64 * 1024


def test_live_room_refusal(tmp_path, dense, monkeypatch):
    path, _ = dense
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    assert plan.fits
    monkeypatch.setenv("PLANC_HOST_RESERVE", "100TiB")
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.exit_code == 3 and ei.value.code == "live-room"
    assert ei.value.refusal.allowed_bytes == 0 and ei.value.refusal.needed_bytes == plan.peak.host_bytes + plan.layout.device_bytes  # simulated device memory is host memory
    # the reserve alone holds the room back: the message names it as the knob, not the plan's ring
    msg = ei.value.message
    assert "lower the reserve (host_reserve, PLANC_HOST_RESERVE)" in msg and "io.slots" not in msg
    assert "100.00 TiB" in msg and "None" not in msg


def _host_path_plan(tmp_path, dense):
    path, _ = dense
    rules = [{"match": "*.mlp.*", "dtype": "float32", "on": "host"}, {"match": "*"}]
    plan = compile_spec(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 2, "run": "8KiB"}))
    assert sum(1 for r in plan.to_dict()["runs"] if r["host_bytes"]) >= 2
    return plan


def test_run_waits_for_live_room(tmp_path, load, dense, monkeypatch):
    plan = _host_path_plan(tmp_path, dense)
    calls = live_room_by_call(monkeypatch, lambda k: 0 if k == 1 else 2**40)  # short of room once, then plenty
    model = execute(plan, verify=True)
    try:
        assert model.report["verify"]["ok"] and model.report["run_waits"] == 1 and len(calls) >= 2
    finally:
        model.free()


def test_run_refused_by_live_room_mid_load(tmp_path, dense, monkeypatch):
    plan = _host_path_plan(tmp_path, dense)
    first = next(r for r in plan.to_dict()["runs"] if r["host_bytes"])
    live_room_by_call(monkeypatch, lambda k: 0)
    seen = _watch_allocations(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.code == "live-room" and ei.value.exit_code == 3
    r = ei.value.refusal
    assert (r.run, r.needed_bytes, r.allowed_bytes) == (first["index"], first["host_bytes"], 0)
    from planc.plan.admission import dominant_step

    assert r.code == "live-room" and r.step == dominant_step(plan, r.run)[0]
    assert f"run {first['index']}" in ei.value.message
    gc.collect()
    rec, = seen
    assert gone(rec, "ring") and gone(rec, "arena")


@pytest.mark.parametrize("change", ["mtime", "append", "remove"])
def test_changed_file_after_compile(tmp_path, dense, monkeypatch, change):
    path, _ = dense
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    st = os.stat(path)
    if change == "mtime":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "append":
        with open(path, "ab") as f:
            f.write(b"\0")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the size alone must give it away
    else:
        os.remove(path)
    _no_allocation(monkeypatch)
    with pytest.raises(FingerprintError) as ei:
        execute(plan)
    assert ei.value.exit_code == 2
    assert ei.value.code == ("file-removed" if change == "remove" else "file-changed")
    assert str(path) in ei.value.message


def _watch_allocations(monkeypatch) -> list:
    """Weak references to what each execute() allocated (`execute_support.watch_regions`)."""
    return watch_regions(monkeypatch)


def test_read_failing_mid_load_releases_everything(tmp_path, dense, load, monkeypatch):
    path, want = dense
    spec = spec_file(tmp_path, path, [{"match": "model.norm.weight", "dtype": "float32"}, {"match": "*"}],
                      io={"slot": 4096, "slots": 2, "workers": 2})
    plan = compile_spec(spec)
    assert plan.totals.requests > 4
    seen = _watch_allocations(monkeypatch)
    calls, readers = [], []

    class FailingReader(Reader):  # fails on its 2nd planned read
        def __post_init__(self):
            super().__post_init__()
            readers.append(weakref.ref(self))

        def read_into(self, rel, offset, length, buf, needed):
            calls.append(offset)
            if len(calls) == 2:
                raise ReadError(f"{rel}: injected failure at offset {offset}", code="read-failed")
            return super().read_into(rel, offset, length, buf, needed)

    with pytest.raises(ReadError) as ei:
        execute(plan, parts=Parts(regions=parts_mod.DEFAULT.regions, reader=reader_of(FailingReader)))
    assert isinstance(ei.value, PlancError) and ei.value.code == "read-failed" and ei.value.exit_code == 2
    gc.collect()
    rec, = seen
    regions = rec["regions"]()
    if regions is not None:  # still reachable from the traceback: it must hold nothing
        assert regions.ring is None and regions.arena is None and regions.landing is None
        del regions
    reader = readers[0]()
    if reader is not None:
        assert all(f.fd < 0 for f in reader.files.values())
        del reader
    # Released while the error is still held (a caller may keep it, or retry with a smaller plan).
    assert gone(rec, "ring"), "the pinned ring outlived the failed load"
    assert gone(rec, "arena"), "the device arena outlived the failed load"
    del ei

    _, model = load(spec)
    want["model.norm.weight"] = cast(want["model.norm.weight"], "F32")
    assert_model(model, want)


def test_short_file_is_refused_before_the_load(tmp_path, dense, monkeypatch):
    """A file cut short behind the fingerprint's back (size and mtime faked) fails as a ReadError."""
    path, _ = dense
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    real_stat = os.stat
    size = real_stat(path).st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5000)

    class Faked:  # the file's stat, with the size and mtime the plan recorded
        def __init__(self, st):
            self._st = st
            self.st_size, self.st_mtime_ns = size, plan.to_dict()["checkpoint"]["files"][0]["mtime_ns"]

        def __getattr__(self, name):
            return getattr(self._st, name)

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: Faked(real_stat(p, *a, **k)) if str(p) == path
                        else real_stat(p, *a, **k))
    # The checkpoint's header, read again before the load (check_against_headers), finds the data
    # region short: refused before anything is allocated (a read that comes back short during the
    # load is a ReadError: tests/test_reader.py).
    from planc.base.errors import ManifestError

    with pytest.raises(ManifestError) as ei:
        execute(plan)
    assert ei.value.code == "data-short" and path in ei.value.message


# ------------------------------------------------------------------------------------------
# io.direct


def _is_direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def test_direct_off(tmp_path, load, dense):
    path, want = dense
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="off")))
    assert model.report["files"] == {"model.safetensors": {"direct": False, "why": "io.direct is off"}}
    assert_model(model, want)


def test_direct_on_works_or_is_refused_by_name(tmp_path, load, dense):
    path, want = dense
    spec = spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="on"))
    try:
        plan, model = load(spec)
    except ReadError as e:
        assert e.code == "direct-refused", e
        return
    assert model.report["files"]["model.safetensors"]["direct"] is True
    assert_model(model, want)


def test_direct_auto_reports_its_choice(tmp_path, load, dense):
    path, want = dense
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="auto")))
    mode = model.report["files"]["model.safetensors"]
    assert mode["why"] and isinstance(mode["direct"], bool)
    assert_model(model, want)


def test_direct_auto_falls_back_when_the_file_system_refuses(tmp_path, load, dense, monkeypatch):
    path, want = dense
    refuse_direct_open(monkeypatch)
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="auto")))
    assert model.report["files"]["model.safetensors"] == {"direct": False, "why": "file system refuses O_DIRECT"}
    assert_model(model, want)


def test_direct_on_refused_by_the_file_system(tmp_path, dense, monkeypatch):
    path, _ = dense
    refuse_direct_open(monkeypatch)
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="on")))
    with pytest.raises(ReadError) as ei:
        execute(plan)
    assert ei.value.code == "direct-refused" and ei.value.exit_code == 2


def _refuse_direct_reads(monkeypatch):
    real_preadv = os.preadv

    def fake_preadv(fd, bufs, offset, *a):
        if _is_direct(fd):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset, *a)

    monkeypatch.setattr(os, "preadv", fake_preadv)
    cold_page_cache(monkeypatch)


def test_direct_auto_falls_back_when_a_direct_read_is_refused(tmp_path, load, dense, monkeypatch):
    path, want = dense
    _refuse_direct_reads(monkeypatch)
    plan, model = load(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="auto")))
    assert model.report["files"]["model.safetensors"] == {"direct": False, "why": "O_DIRECT read refused: buffered"}
    assert_model(model, want)


def test_direct_on_read_refused_is_named(tmp_path, dense, monkeypatch):
    path, _ = dense
    _refuse_direct_reads(monkeypatch)
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="on")))
    with pytest.raises(ReadError) as ei:
        execute(plan)
    assert ei.value.code == "direct-refused"


# ------------------------------------------------------------------------------------------
# the LoadedModel, the report, plans from JSON, the CLI


def test_loaded_model_matches_the_plan(tmp_path, load, dense):
    path, want = dense
    plan, model = load(spec_file(tmp_path, path, [QKV, {"match": "*.mlp.*", "dtype": "float32"},
                                                   {"match": "*"}], io=SMALL_IO))
    assert len(model) == len(plan.to_dict()["tensors"]) == plan.totals.tensors
    assert list(model) == sorted(t["name"] for t in plan.to_dict()["tensors"])
    for t in plan.to_dict()["tensors"]:
        d = model[t["name"]]
        assert (d.dtype, d.shape, d.nbytes, d.offset_bytes) == (t["dtype"], tuple(t["shape"]), t["nbytes"],
                                                                t["offset_bytes"])
        assert d.array.shape == tuple(t["shape"]) and d.array.dtype == d.storage
        assert d.storage.itemsize == NP[t["dtype"]].itemsize
    rep = model.report
    assert rep["simulator"] is True and rep["device"] == "cuda:0"
    assert rep["wall_seconds"] > 0 and rep["gb_per_s"] > 0
    assert rep["payload_bytes"] == plan.totals.payload_bytes
    assert rep["bytes_read"]["predicted"] == plan.totals.read_bytes
    assert plan.totals.payload_bytes <= rep["bytes_read"]["measured"] <= plan.totals.read_bytes
    h = rep["host"]
    assert h["pinned_bytes"] == plan.layout.ring_bytes and h["predicted_peak_bytes"] == plan.peak.host_bytes
    assert h["growth_bytes"] == h["hwm_bytes"] - h["baseline_rss_bytes"] and h["baseline_rss_bytes"] > 0
    assert h["rss_after_bytes"] > 0 and h["live_room_bytes"] > 0
    assert rep["device_memory"]["arena_bytes"] == plan.layout.arena_bytes
    assert rep["verify"]["bytes"] == plan.totals.resident_bytes
    json.dumps(rep.as_json())  # the report's JSON is plain data
    model.free()
    assert len(model) == 0 and model._arena is None
    model.free()  # twice is harmless


def test_plan_from_json_loads_the_same(tmp_path, load, dense):
    path, want = dense
    plan = compile_spec(spec_file(tmp_path, path, [QKV, {"match": "*"}], io=SMALL_IO))
    save_plan(plan, tmp_path / "plan.json")
    again = load_plan(tmp_path / "plan.json")
    assert encode(again) == encode(plan)
    model = execute(again, verify=True)
    try:
        assert model.report["verify"]["ok"]
        assert_model(model, fused(want, 1))
    finally:
        model.free()


def test_cli_run_json_verify(tmp_path, capsys, dense):
    path, _ = dense
    spec = spec_file(tmp_path, path, [QKV, {"match": "*.mlp.*", "dtype": "float16"}, {"match": "*"}], io=SMALL_IO)
    assert cli.main(["run", str(spec), "--json", "--verify"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verify"]["ok"] is True and rep["simulator"] is True
    assert rep["requests"]["issued"] == rep["requests"]["predicted"]
    assert rep["copies"]["issued"] == rep["copies"]["predicted"]
    assert rep["kernels"]["issued"] == rep["kernels"]["predicted"] > 0


def test_cli_run_exit_codes(tmp_path, capsys, dense):
    path, _ = dense
    refused = spec_file(tmp_path, path, [{"match": "*"}], host="64KiB", io={"slot": "64KiB"}, name="refused.yaml")
    assert cli.main(["run", str(refused), "--json"]) == 3
    assert "refused" in capsys.readouterr().err
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    save_plan(plan, tmp_path / "plan.json")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert cli.main(["run", str(tmp_path / "plan.json"), "--json"]) == 2
    assert "changed since the plan was compiled" in capsys.readouterr().err


class _CompilingWarmer:
    """Stands in for the kernel warmer's thread: still compiling until the loader joins it."""

    def __init__(self):
        self.joins = 0

    def is_alive(self):
        return self.joins == 0

    def join(self):
        self.joins += 1


@pytest.mark.parametrize("case", ["convert", "dequantize"])
def test_kernels_deferred_while_the_warmer_compiles(tmp_path, load, dense, monkeypatch, case):
    """Kernels of runs loaded while the warmer still compiles are launched later, on the same stream;
    a run that reuses a landing region its deferred kernels read launches them first."""
    warmers = []
    use_parts(monkeypatch, warmer=lambda plan, dev: warmers.append(_CompilingWarmer()) or warmers[-1])
    if case == "convert":
        path, want = dense
        rules = [{"match": "model.layers.0.self_attn.*", "dtype": "float32"},
                 {"match": "model.layers.0.*layernorm.weight", "dtype": "float16"}, {"match": "*"}]
        plan, model = load(spec_file(tmp_path, path, rules,
                                      io={"slot": 4096, "slots": 3, "run": "8KiB", "merge_gap": 0}))
        for name in want:
            if ".self_attn." in name:
                want[name] = cast(want[name], "F32")
            elif "layernorm" in name:
                want[name] = cast(want[name], "F16")
    else:
        path, want = synth(tmp_path, "fp8", layers=1)
        rules = fp8_rules("bfloat16", "device", match="*.self_attn.*")
        plan, model = load(spec_file(tmp_path, path, rules, io={"slot": 4096, "slots": 4, "run": "12KiB"}))
        want = dequantized(want, "BF16", lambda n: ".self_attn." in n)
    with_kernels = [r for r in plan.to_dict()["runs"] if r["kernels"]]
    assert len(with_kernels) >= 2
    assert warmers and warmers[0].joins == 1
    assert "wait_warm" in model.report["timings"]
    assert_model(model, want)


def test_page_cache_fraction_sees_resident_and_evicted_pages(tmp_path):
    """The O_DIRECT choice rests on this probe: a file just written is resident; after fsync and
    POSIX_FADV_DONTNEED it is not (a file larger than the sampled pages, so windows are sampled)."""
    from planc.execute.io.reader import page_cache_fraction

    mounts = [line.split()[1:3] for line in open("/proc/mounts")]
    fs = max((m for m in mounts if str(tmp_path).startswith(m[0])), key=lambda m: len(m[0]))[1]
    if fs in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"{fs} keeps its pages: nothing to evict")
    path = tmp_path / "big.bin"
    size = 64 << 20
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * 64)
    assert page_cache_fraction(str(path), size) > 0.9
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert page_cache_fraction(str(path), size) < 0.5
    assert page_cache_fraction(str(tmp_path / "missing.bin"), size) is None


def test_simulated_arena_larger_than_host_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    """Under the simulator device memory is host memory: a 93 GiB arena is a live-room refusal (exit 3),
    not a MemoryError halfway through allocating."""
    n = 93 * 2**30 // 4
    header = json.dumps({"big": {"dtype": "F32", "shape": [n], "data_offsets": [0, n * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    ck = tmp_path / "big.safetensors"
    with open(ck, "wb") as f:  # a sparse file: the header, then a hole of 93 GiB
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n * 4)
    plan = compile_spec(spec_file(tmp_path, ck, [{"match": "*"}], io=SMALL_IO))
    assert plan.fits and plan.layout.arena_bytes == n * 4
    _no_allocation(monkeypatch)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    assert ei.value.exit_code == 3 and ei.value.code == "live-room"
    assert "simulated device regions" in ei.value.message


@pytest.mark.parametrize("how", ["symlink-loop", "folder", "name-too-long"])
def test_a_checkpoint_file_that_cannot_be_stat_ed_is_a_typed_fingerprint_error(tmp_path, dense, how):
    """A shard that became a symlink loop or a folder, or a root whose names grew too long: exit 2
    with the file named, never an 'unexpected error'."""
    import dataclasses
    import shutil

    from planc.base.errors import FingerprintError
    from planc.plan.codec import decode, encode_bytes

    path, _ = dense
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO))
    if how == "name-too-long":
        ck = plan.checkpoint
        plan = decode(encode_bytes(dataclasses.replace(plan, checkpoint=ck._replace(root=ck.root + "/" + "x" * 300))))
    else:
        os.remove(path)
        if how == "symlink-loop":
            os.symlink(path, path)
        else:
            os.mkdir(path)
    try:
        with pytest.raises(FingerprintError) as ei:
            execute(plan)
        assert ei.value.exit_code == 2 and ei.value.code in ("file-unreadable", "file-changed", "file-removed")
    finally:
        if how == "folder":
            shutil.rmtree(path)




def test_a_saved_plan_whose_empty_tensor_has_an_in_place_kernel_still_loads(tmp_path, load):
    """Plans compiled before empty tensors went without a kernel gave a same-size conversion of one an
    in-place kernel merged with its neighbour's: a kernel over nothing, still a valid plan."""
    import json as _json

    from planc.plan.codec import decode, encode

    path, _ = handmade(tmp_path, {"a.empty": np.zeros((0, 8), np.float16),
                                  "b.w": np.arange(48, dtype=np.float16).reshape(6, 8)})
    plan, _ = load(spec_file(tmp_path, path, [{"match": "*", "on": "device", "dtype": "bfloat16"}], io=SMALL_IO))
    doc = _json.loads(encode(plan))
    (kernel,), = [r[2] for r in doc["runs"]]
    assert kernel[0] == 1 and kernel[12] == []  # b.w's alone
    kernel[0], kernel[12] = 0, [1]  # as such a plan had it: a.empty's kernel, b.w's merged into it
    old = decode(_json.dumps(doc))
    model = execute(old, verify=True)
    try:
        assert model.report["verify"]["ok"] and model.report["kernels"]["issued"] == 1
        assert_tensor(model, "b.w", cast(np.arange(48, dtype=np.float16).reshape(6, 8), "BF16"))
    finally:
        model.free()

"""The Python API under the CUDA simulator: planc.load, LoadedModel.state_dict, planc.load_into.

The shipped serving layouts are loaded and compared bit for bit with numpy arrays built from the
tensors the test wrote (rename, fuse, fuse inside a stack, FP8 dequantized into a fused tensor).
The torch hand-off tests run when torch is installed (skipped otherwise): under the simulator,
state_dict() copies to host tensors, so a tiny module built on the meta device is filled on the CPU.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import dataclasses  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

import families  # noqa: E402
import planc  # noqa: E402
from execute_support import bits, dequant  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import BindError, HandoffError  # noqa: E402
from planc.plan.codec import save_plan  # noqa: E402
from test_layouts import shipped  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture
def loaded():
    models = []

    def load(*a, **kw):
        m = planc.load(*a, **kw)
        models.append(m)
        return m

    yield load
    for m in models:
        m.free()


def assert_loaded(model, want: dict) -> None:
    assert sorted(model.keys()) == sorted(want)
    for name, arr in want.items():
        got = model[name].to_host()
        assert got.shape == arr.shape, name
        assert np.array_equal(bits(got), bits(arr)), name


def mixtral_experts(src: dict, gate_up: str, down: str, prefix: str = "block_sparse_moe") -> dict:
    out = {}
    for L in range(families.LAYERS):
        q = f"model.layers.{L}.block_sparse_moe.experts"
        out[f"model.layers.{L}.{prefix}.experts.{gate_up}"] = np.stack(
            [np.concatenate([src[f"{q}.{e}.w1.weight"], src[f"{q}.{e}.w3.weight"]]) for e in range(families.E)])
        out[f"model.layers.{L}.{prefix}.experts.{down}"] = np.stack(
            [src[f"{q}.{e}.w2.weight"] for e in range(families.E)])
    return out


def qkv(src: dict) -> dict:
    out = {}
    for L in range(families.LAYERS):
        a = f"model.layers.{L}.self_attn"
        out[f"{a}.qkv_proj.weight"] = np.concatenate([src[f"{a}.{p}_proj.weight"] for p in ("q", "k", "v")])
    return out


def test_transformers_mixtral_bit_exact(tmp_path, loaded):
    """rename (the router) and fuse inside a stack (gate_up_proj [E, 2I, H]), byte for byte."""
    src = families.mixtral()
    model = loaded(shipped(tmp_path, "transformers-mixtral", src), verify=True)
    assert model.report["verify"]["ok"]
    want = {n: a for n, a in src.items() if ".block_sparse_moe." not in n}
    for L in range(families.LAYERS):
        want[f"model.layers.{L}.mlp.gate.weight"] = src[f"model.layers.{L}.block_sparse_moe.gate.weight"]
    want.update(mixtral_experts(src, "gate_up_proj", "down_proj", prefix="mlp"))
    assert_loaded(model, want)


def test_vllm_mixtral_bit_exact(tmp_path, loaded):
    src = families.mixtral(seed=1)
    model = loaded(shipped(tmp_path, "vllm-mixtral", src, shards=2))
    want = {n: a for n, a in src.items() if ".experts." not in n and not re.search(r"\.[qkv]_proj\.", n)}
    want.update(qkv(src))
    want.update(mixtral_experts(src, "w13_weight", "w2_weight"))
    assert_loaded(model, want)


def test_vllm_llama_bit_exact(tmp_path, loaded):
    src = families.llama(seed=2)
    model = loaded(shipped(tmp_path, "vllm-llama", src))
    want = {n: a for n, a in src.items() if not re.search(r"\.([qkv]|gate|up)_proj\.", n)}
    want.update(qkv(src))
    for L in range(families.LAYERS):
        m = f"model.layers.{L}.mlp"
        want[f"{m}.gate_up_proj.weight"] = np.concatenate([src[f"{m}.gate_proj.weight"], src[f"{m}.up_proj.weight"]])
    assert_loaded(model, want)


def test_deepseek_v3_fp8_dequantized_into_fused_layout(tmp_path, loaded):
    src = families.deepseek_v3()
    model = loaded(shipped(tmp_path, "deepseek-v3-fp8", src))

    def dq(name):
        return dequant(src[name], src[f"{name}_scale_inv"], "BF16")

    p = "model.layers.1"
    for L in (0, 1):
        a = f"model.layers.{L}.self_attn"
        want = np.concatenate([dq(f"{a}.q_a_proj.weight"), dq(f"{a}.kv_a_proj_with_mqa.weight")])
        assert np.array_equal(bits(model[f"{a}.fused_qkv_a_proj.weight"].to_host()), bits(want))
        assert np.array_equal(bits(model[f"{a}.kv_b_proj.weight"].to_host()), bits(dq(f"{a}.kv_b_proj.weight")))
    w13 = np.stack([np.concatenate([dq(f"{p}.mlp.experts.{e}.gate_proj.weight"), dq(f"{p}.mlp.experts.{e}.up_proj.weight")])
                    for e in range(families.DS["experts"])])
    assert np.array_equal(bits(model[f"{p}.mlp.experts.w13_weight"].to_host()), bits(w13))
    w2 = np.stack([dq(f"{p}.mlp.experts.{e}.down_proj.weight") for e in range(families.DS["experts"])])
    assert np.array_equal(bits(model[f"{p}.mlp.experts.w2_weight"].to_host()), bits(w2))
    bias = f"{p}.mlp.gate.e_score_correction_bias"
    assert np.array_equal(model[bias].to_host(), src[bias])


def test_load_takes_a_plan_file_and_a_plan(tmp_path, loaded):
    src = families.llama()
    spec = shipped(tmp_path, "transformers-llama", src)
    plan = compile_spec(spec)
    save_plan(plan, tmp_path / "plan.json")
    for target in (tmp_path / "plan.json", str(tmp_path / "plan.json"), plan):
        model = loaded(target)
        assert_loaded(model, src)
        assert model.report["copies"]["issued"] == plan.totals.copies
    with pytest.raises(BindError) as info:
        planc.load(plan, rank=1)
    assert info.value.code == "bad-rank"


def test_tensor_parallel_spec_needs_a_rank(tmp_path, monkeypatch, loaded):
    src = families.llama()
    spec = shipped(tmp_path, "vllm-llama", src)
    doc = yaml.safe_load(spec.read_text())
    doc["tensor_parallel"] = {"size": 2}
    spec.write_text(yaml.safe_dump(doc))
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(BindError) as info:
        planc.load(spec)
    assert info.value.code == "bad-rank" and "tensor_parallel.size is 2" in info.value.message
    for bad in ("one", "-1", "²", ""):  # a launcher variable that is not a rank: typed, naming RANK
        monkeypatch.setenv("RANK", bad)
        with pytest.raises(BindError, match="RANK=") as info:
            planc.load(spec)
        assert info.value.code == "bad-rank"
    monkeypatch.setenv("RANK", "1")
    model = loaded(spec)  # replicated tensors only: every rank loads them whole
    assert model.report["tensor_parallel"] == {"rank": 1, "size": 2}
    assert_loaded(model, {n: a for n, a in src.items() if "layers" not in n or "norm" in n or "down_proj" in n
                          or "o_proj" in n} | qkv(src) | {
        f"model.layers.{L}.mlp.gate_up_proj.weight": np.concatenate(
            [src[f"model.layers.{L}.mlp.gate_proj.weight"], src[f"model.layers.{L}.mlp.up_proj.weight"]])
        for L in range(families.LAYERS)})


def test_json_spec_is_compiled(tmp_path, loaded):
    src = families.llama()
    spec = shipped(tmp_path, "transformers-llama", src)
    js = tmp_path / "spec.json"
    import json

    js.write_text(json.dumps(yaml.safe_load(spec.read_text())))
    assert_loaded(loaded(js), src)


# ------------------------------------------------------------------------------------------
# torch hand-off (skipped without torch)


def test_state_dict_true_dtypes(tmp_path, loaded):
    torch = pytest.importorskip("torch")
    src = families.deepseek_v3()
    spec = shipped(tmp_path, "deepseek-v3-fp8", src)
    doc = yaml.safe_load(spec.read_text())
    doc["rules"] = [{"match": "*"}]  # FP8 kept as stored
    spec.write_text(yaml.safe_dump(doc))
    sd = loaded(spec).state_dict()
    assert sorted(sd) == sorted(src)
    name = "model.layers.0.self_attn.q_a_proj.weight"
    assert sd[name].dtype == torch.float8_e4m3fn and tuple(sd[name].shape) == src[name].shape
    assert np.array_equal(sd[name].view(torch.uint8).numpy(), bits(src[name]).reshape(src[name].shape))
    emb = "model.embed_tokens.weight"
    assert sd[emb].dtype == torch.bfloat16
    assert np.array_equal(sd[emb].view(torch.int16).numpy().view(np.uint16), src[emb].view(np.uint16))
    assert sd["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def _tiny_llama(torch, tie: bool):
    """A hand-made Llama-shaped module with a rotary embedding (non-persistent inv_freq built from a
    config, as transformers' is) and, optionally, tied embeddings."""
    nn = torch.nn

    class Config:
        head_dim, theta = 8, 10000.0

    class Rotary(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            inv = 1.0 / (config.theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim))
            self.register_buffer("inv_freq", inv, persistent=False)

    class Counter(nn.Module):  # a non-persistent buffer its own reset_parameters() fills
        def __init__(self):
            super().__init__()
            self.register_buffer("steps", torch.empty(3), persistent=False)

        def reset_parameters(self):
            self.steps.fill_(7.0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(32, 32, bias=False)
            self.k_proj = nn.Linear(32, 16, bias=False)
            self.v_proj = nn.Linear(32, 16, bias=False)
            self.o_proj = nn.Linear(32, 32, bias=False)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(32, 24, bias=False)
            self.up_proj = nn.Linear(32, 24, bias=False)
            self.down_proj = nn.Linear(24, 32, bias=False)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.RMSNorm(32)
            self.self_attn = Attn()
            self.post_attention_layernorm = nn.RMSNorm(32)
            self.mlp = MLP()

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(40, 32)
            self.layers = nn.ModuleList([Layer() for _ in range(2)])
            self.norm = nn.RMSNorm(32)
            self.rotary_emb = Rotary(Config())
            self.counter = Counter()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = nn.Linear(32, 40, bias=False)
            if tie:
                self.lm_head.weight = self.model.embed_tokens.weight

    with torch.device("meta"):
        return Model()


def test_load_into_meta_module(tmp_path):
    torch = pytest.importorskip("torch")
    src = families.llama()
    module = _tiny_llama(torch, tie=False)
    res = planc.load_into(module, shipped(tmp_path, "transformers-llama", src))
    try:
        assert res.missing_keys == [] and res.unexpected_keys == [] and res.uninitialized_buffers == []
        assert res.rebuilt_buffers == ["model.counter.steps", "model.rotary_emb.inv_freq"]
        assert res.report["copies"]["issued"] == res.report["copies"]["predicted"]
        sd = module.state_dict()
        for name, arr in src.items():
            assert sd[name].dtype == torch.bfloat16
            assert np.array_equal(sd[name].view(torch.int16).numpy().view(np.uint16), arr.view(np.uint16)), name
        want_inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
        assert torch.equal(module.model.rotary_emb.inv_freq, want_inv)
        assert torch.equal(module.model.counter.steps, torch.full((3,), 7.0))
        assert not any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))
        assert isinstance(module.lm_head.weight, torch.nn.Parameter)
        x = torch.tensor([[1, 2, 3]])
        h = module.model.embed_tokens(x)
        assert torch.equal(module.lm_head(h), h @ module.lm_head.weight.T)  # the module runs
    finally:
        res.model.free()


def test_load_into_keeps_tied_weights_tied(tmp_path):
    torch = pytest.importorskip("torch")
    src = families.llama()
    del src["lm_head.weight"]  # a tied checkpoint stores the embedding once
    module = _tiny_llama(torch, tie=True)
    res = planc.load_into(module, shipped(tmp_path, "transformers-llama", src))
    try:
        assert res.missing_keys == [] and res.tied == [["lm_head.weight", "model.embed_tokens.weight"]]
        assert module.lm_head.weight is module.model.embed_tokens.weight
        assert not module.lm_head.weight.is_meta
    finally:
        res.model.free()


def test_load_into_strict_names_missing_and_unexpected_keys(tmp_path):
    torch = pytest.importorskip("torch")
    src = families.llama()
    spec = shipped(tmp_path, "vllm-llama", src)  # fused names: the transformers module has none of them
    module = _tiny_llama(torch, tie=False)
    with pytest.raises(HandoffError) as info:
        planc.load_into(module, spec)
    e = info.value
    assert e.code == "keys-mismatch"
    assert "model.layers.0.self_attn.q_proj.weight" in e.message and "model.layers.0.self_attn.qkv_proj.weight" in e.message
    assert all(p.is_meta for p in module.parameters())  # nothing was assigned
    res = planc.load_into(module, spec, strict=False)
    try:
        assert "model.layers.0.mlp.gate_proj.weight" in res.missing_keys
        assert "model.layers.1.mlp.gate_up_proj.weight" in res.unexpected_keys
        assert not module.model.norm.weight.is_meta and module.model.layers[0].mlp.gate_proj.weight.is_meta
    finally:
        res.model.free()


def test_load_into_shape_mismatch_and_unbuildable_buffer(tmp_path):
    torch = pytest.importorskip("torch")
    src = families.llama()
    src["model.norm.weight"] = np.zeros(31, src["model.norm.weight"].dtype)
    module = _tiny_llama(torch, tie=False)
    with pytest.raises(HandoffError) as info:
        planc.load_into(module, shipped(tmp_path, "transformers-llama", src))
    assert info.value.code == "shape-mismatch" and "model.norm.weight: loaded [31], module [32]" in info.value.message

    class Opaque(torch.nn.Module):  # a buffer nothing can rebuild
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.zeros(2), persistent=False)

    module = _tiny_llama(torch, tie=False)
    with torch.device("meta"):
        module.model.opaque = Opaque()
    src = families.llama()
    spec = shipped(tmp_path / "b", "transformers-llama", src)
    with pytest.raises(HandoffError) as info:
        planc.load_into(module, spec)
    assert info.value.code == "buffers-uninitialized" and "model.opaque.table" in info.value.message
    res = planc.load_into(module, spec, strict=False)
    try:
        assert res.uninitialized_buffers == ["model.opaque.table"]
    finally:
        res.model.free()


# ------------------------------------------------------------------------------------------
# docs/python.md: every python block runs, in order, in one namespace


def test_python_doc_examples_run(tmp_path, monkeypatch):
    text = (DOCS / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    ran = 0
    for code in blocks:
        if "torch" in code and not has_torch:
            continue
        exec(compile(code, "docs/python.md", "exec"), ns)
        ran += 1
    assert ran >= (len(blocks) if has_torch else 1)
    for v in list(ns.values()):
        if hasattr(v, "free") and hasattr(v, "report"):
            v.free()


def test_settings_passed_as_arguments_hold_for_the_call_only(tmp_path, loaded, monkeypatch):
    from planc.base import settings
    from planc.base.errors import AdmissionError

    src = families.llama()
    plan = compile_spec(shipped(tmp_path, "transformers-llama", src))
    monkeypatch.setenv("PLANC_HOST_RESERVE", "1MiB")
    # a reserve larger than the machine leaves no live room: the argument, not the variable, decides
    with pytest.raises(AdmissionError) as info:
        planc.load(plan, settings={"host_reserve": 1 << 50})
    assert info.value.code == "live-room"
    assert settings.host_reserve_bytes() == 1 << 20  # the variable again once the call is over
    assert_loaded(loaded(plan, settings={"host_reserve": "1MiB", "raw_launch": False}), src)
    assert settings.raw_launch()
    with pytest.raises(settings.SettingError, match="unknown setting 'host_reserv'"):
        planc.load(plan, settings={"host_reserv": "1GiB"})
    with pytest.raises(settings.SettingError, match="PLANC_HOST_RESERVE"):
        planc.load(plan, settings={"host_reserve": "lots"})


def test_bad_arguments_are_typed_errors_before_anything_is_loaded(tmp_path, monkeypatch):
    """What a caller may pass wrong: the target, the rank, the device, the module. Each is a typed
    error naming the argument, raised before anything is allocated."""
    from planc.base.errors import SpecError
    from planc.execute.device import seam

    src = families.llama()
    spec = shipped(tmp_path, "transformers-llama", src)
    plan = tmp_path / "plan.json"
    save_plan(compile_spec(spec), plan)
    monkeypatch.setattr(seam, "select", lambda *a: pytest.fail("a bad argument reached the device"))
    for target in (5, None, b"spec.yaml"):
        with pytest.raises(SpecError, match="spec_or_plan must be") as info:
            planc.load(target)
        assert info.value.code == "spec-missing"
    from planc.plan.codec import load_plan

    for rank in ("1", -1, True, 1.0):
        for target in (plan, load_plan(plan)):  # a path and a Plan alike
            with pytest.raises(BindError, match="rank must be an integer") as info:
                planc.load(target, rank=rank)
            assert info.value.code == "bad-rank"
    with pytest.raises(SpecError, match="device must be") as info:  # checked before the spec is read
        planc.load(tmp_path / "nope.yaml", device="gpu")
    assert info.value.code == "bad-device"
    for device in ("cpu", "cuda:abc", 0, "cuda:1:2", ""):
        with pytest.raises(SpecError, match="device must be cuda or cuda:N") as info:
            planc.load(plan, device=device)
        assert info.value.code == "bad-device"
    torch = pytest.importorskip("torch")
    with pytest.raises(HandoffError, match="needs a torch.nn.Module") as info:
        planc.load_into(object(), plan)
    assert info.value.code == "not-a-module" and torch.__name__ == "torch"


def test_two_loads_at_once_each_see_their_own_settings(tmp_path):
    """Settings are a value resolved once per load and passed down it, never a process-global: two
    loads in two threads, both in flight at once, each see their own host_reserve and pin (in the
    load's own threads too), and the one that ends first takes nothing from the other."""
    import threading

    from planc.base import settings
    from planc.execute import execute
    from planc.execute.pipeline.allocation import Regions
    from planc.execute.pipeline.events import RunStarted
    from planc.execute.device.memory import live_room
    from planc.execute.pipeline.parts import Parts

    plan = compile_spec(shipped(tmp_path, "transformers-llama", families.llama()))
    both_in_flight = threading.Barrier(2, timeout=60)
    a_done = threading.Event()
    seen = {"a": [], "b": []}

    def view(who, where):
        seen[who].append((where, settings.host_reserve_bytes(), settings.pin()))

    def parts_of(who):
        class Watched(Regions):
            def _allocate_device(self):  # on the load's allocation thread
                view(who, "alloc-thread")
                super()._allocate_device()

        def room(reserve, run=None):
            if run is None:
                seen[who].append(("admission", reserve, None))
            return live_room(reserve, run)

        return Parts(regions=Watched.start, live_room=room)

    def observer_of(who):
        def observe(event):
            if isinstance(event, RunStarted) and event.run == 0:
                both_in_flight.wait()
                view(who, "in flight")
                if who == "b":  # still loading when A's load has ended
                    assert a_done.wait(60)
                    view(who, "after a")
        return observe

    wanted = {"a": {"host_reserve": "3MiB", "pin": "alloc"}, "b": settings.Settings.resolve({"host_reserve": 5 << 20})}
    errors, models = [], {}

    def run(who):
        try:
            models[who] = execute(plan, settings=wanted[who], parts=parts_of(who), observer=observer_of(who))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            both_in_flight.abort()
        finally:
            if who == "a":
                a_done.set()

    threads = [threading.Thread(target=run, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    try:
        assert sorted(seen["a"], key=str) == sorted([("admission", 3 << 20, None), ("alloc-thread", 3 << 20, "alloc"),
                                                     ("in flight", 3 << 20, "alloc")], key=str), seen["a"]
        assert sorted(seen["b"], key=str) == sorted([("admission", 5 << 20, None), ("alloc-thread", 5 << 20, "register"),
                                                     ("in flight", 5 << 20, "register"),
                                                     ("after a", 5 << 20, "register")], key=str), seen["b"]
        room_a, room_b = (models[w].report["host"]["live_room_bytes"] for w in ("a", "b"))
        assert room_a > 0 and room_b > 0
    finally:
        for m in models.values():
            m.free()
    assert settings.host_reserve_bytes() == settings.Settings.from_env().host_reserve  # nothing left in force


def test_settings_are_checked_strictly(tmp_path):
    """What a caller may pass as `settings=`: a mapping of known names to values of their type, or a
    Settings; anything else is a SettingError before anything is read."""
    from planc.base import settings

    plan = compile_spec(shipped(tmp_path, "transformers-llama", families.llama()))
    for bad, match in ((["pin"], "expected a mapping"), ({"host_reserve": True}, "expected a byte size"),
                       ({"host_reserve": -1}, "cannot be negative"), ({"debug": "yes"}, "expected a bool"),
                       ({"pin": 3}, "expected one of register, alloc"), ({"nope": 1}, "unknown setting 'nope'"),
                       ({"kernel_dir": 7}, "expected a path")):
        with pytest.raises(settings.SettingError, match=match):
            planc.load(plan, settings=bad)
    s = settings.Settings.resolve({"debug": False, "raw_launch": "0", "host_reserve": "2MiB", "probe": "off"})
    assert s.debug is False and s.raw_launch is False and s.host_reserve == 2 << 20 and s.probe is None
    assert settings.Settings.resolve({"debug": True}).debug is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.debug = True


def test_a_plan_value_edited_by_the_caller_is_checked_before_anything_is_allocated(tmp_path):
    """`planc.load(Plan)` and `execute(Plan)` hold a Plan value to the plan file's checks: an edited
    budget is refused by admission's replay, an edited layout by the field checks."""
    import dataclasses

    import planc
    from planc.compiler.compile import compile_spec
    from planc.base.errors import PlanFormatError
    from planc.execute import execute

    from conftest import write_spec, write_st

    write_st(tmp_path / "m.safetensors", {"a": np.ones((8, 64), np.float32), "b": np.ones(64, np.float16)})
    plan = compile_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"},
                                              "io": {"slot": 4096, "slots": 2, "run": 2048}, "rules": [{"match": "*"}]}))
    with pytest.raises(PlanFormatError) as e:
        planc.load(plan.with_budget(host_bytes=1, device_bytes=1))
    assert "replay" in str(e.value)
    lay = plan.layout
    edited = dataclasses.replace(plan, layout=lay._replace(arena_bytes=lay.arena_bytes // 2))
    with pytest.raises(PlanFormatError):
        execute(edited)
    with pytest.raises(PlanFormatError):
        execute("not a plan")
    model = planc.load(plan)  # the compiled value itself is taken as it is
    assert len(model) == len(plan.tensors)
    model.free()


def test_a_plan_whose_offsets_disagree_with_the_headers_is_refused(tmp_path):
    """Two tensors' source offsets swapped in a plan file pass the plan's own checks, but not the
    checkpoint's headers: refused before anything is allocated, naming the tensor."""
    from conftest import write_spec, write_st

    from planc.compiler.compile import compile_spec
    from planc.base.errors import PlanFormatError
    from planc.plan.codec import encode_bytes, load_plan

    write_st(tmp_path / "m.safetensors", {"a": np.full((4, 16), 1, np.float16), "b": np.full((4, 16), 2, np.float16)})
    plan = compile_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"},
                                              "io": {"slot": 4096, "slots": 2, "merge_gap": 0},
                                              "rules": [{"match": "*"}]}))
    pa, pb = plan.parts
    ia, ib = pa.inputs[0], pb.inputs[0]
    # Each part now names the other tensor as its source while reading its own bytes: every field is in
    # range and the requests still match the parts, so only the checkpoint's headers can tell.
    swapped = dataclasses.replace(plan, parts=(pa._replace(inputs=(ia._replace(tensor=ib.tensor),)),
                                               pb._replace(inputs=(ib._replace(tensor=ia.tensor),))))
    (tmp_path / "swapped.json").write_bytes(encode_bytes(swapped))
    edited = load_plan(tmp_path / "swapped.json")  # every field in range: the plan alone cannot tell
    with pytest.raises(PlanFormatError) as e:
        planc.load(edited)
    assert e.value.code == "plan-header-mismatch" and "reads 'b'" in str(e.value)
    import subprocess
    import sys

    rc = subprocess.run([sys.executable, "-m", "planc", "run", str(tmp_path / "swapped.json")], capture_output=True,
                        text=True, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})
    assert rc.returncode == 2 and "[plan-header-mismatch]" in rc.stderr and len(rc.stderr.strip().splitlines()) == 1


def test_a_header_rewritten_under_the_same_size_and_mtime_is_checked_again(tmp_path):
    """A plan whose reads were found where the headers put them is not checked again on its next
    load, but only while the files are the same: two tensors' names swapped in the header, the size
    and mtime put back, and the same Plan value is refused on its next load."""
    import time

    from conftest import write_spec, write_st

    from planc.base.errors import PlanFormatError
    from planc.compiler.compile import compile_spec

    f = tmp_path / "m.safetensors"
    write_st(f, {"a": np.full((4, 16), 1, np.float16), "b": np.full((4, 16), 2, np.float16)})
    plan = compile_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"},
                                              "io": {"slot": 4096, "slots": 2, "merge_gap": 0},
                                              "rules": [{"match": "*"}]}))
    for _ in range(2):
        planc.load(plan).free()  # found where the headers put them, then taken as checked
    st = os.stat(f)
    raw = f.read_bytes()
    assert raw.count(b'"a"') == raw.count(b'"b"') == 1
    f.write_bytes(raw.replace(b'"a"', b'"X"').replace(b'"b"', b'"a"').replace(b'"X"', b'"b"'))
    for _ in range(200):  # put the mtime back; a file system with coarse times: until the ctime moved
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        if os.stat(f).st_ctime_ns != st.st_ctime_ns:
            break
        time.sleep(0.01)
    with pytest.raises(PlanFormatError) as e:
        planc.load(plan)
    assert e.value.code == "plan-header-mismatch"


def test_the_same_plan_over_settled_files_reads_their_headers_once(tmp_path, monkeypatch):
    """Files written more than `RACY_NS` ago: the second load of the same Plan reads no header; a
    file written just now: every load reads it."""
    from conftest import write_spec, write_st

    import planc.manifest
    from planc.compiler.compile import compile_spec
    from planc.execute.pipeline import run

    write_st(tmp_path / "m.safetensors", {"a": np.full((4, 16), 1, np.float16)})
    plan = compile_spec(write_spec(tmp_path, {"checkpoint": "m.safetensors", "budget": {"host": "1MiB"},
                                              "io": {"slot": 4096, "slots": 2}, "rules": [{"match": "*"}]}))
    reads = []
    real = planc.manifest.read_manifest
    monkeypatch.setattr(planc.manifest, "read_manifest", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    for settle, want in ((10**12, [1, 1]), (0, [1, 0])):  # just written; settled
        monkeypatch.setattr(run, "RACY_NS", settle)
        got = []
        for _ in range(2):
            n = len(reads)
            planc.load(plan).free()
            got.append(len(reads) - n)
        assert got == want, (settle, got)


@pytest.mark.parametrize("verify", ["yes", 1.5, None, "Digest", 1, 0, 1.0])
def test_load_refuses_a_verify_it_does_not_know(tmp_path, verify):
    """`verify=` other than False, True or "digest" is a typed spec error naming the value, before anything loads."""
    from planc.base.errors import SpecError

    with pytest.raises(SpecError, match="verify must be") as e:
        planc.load(tmp_path / "absent.yaml", verify=verify)
    assert e.value.code == "bad-verify"

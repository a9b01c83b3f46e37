"""Helpers shared by tests/test_execute.py (CUDA simulator) and tests/test_execute_gpu.py (a GPU).

Importing this module never imports numba (`planc.execute` imports it lazily), so each test
module decides first whether numba runs under the simulator.

Expected values are built here from the arrays the tests wrote, with numpy and ml_dtypes alone,
never with the executor's own host reference (`planc.execute.kernels.refconv`).
"""

from __future__ import annotations

import errno
import os

import ml_dtypes
import numpy as np
import yaml
from safetensors.numpy import save_file

from planc.compiler.compile import compile_spec
from planc.execute import execute
from planc.tools.synth import layout, tensor_data, write_checkpoint

NP = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
      "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn)}
TARGET = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
SMALL_IO = {"workers": 4, "slot": "16KiB", "slots": 4, "run": "64KiB", "merge_gap": "64KiB"}
CONVERSIONS = [("F32", "bfloat16"), ("F32", "float16"), ("BF16", "float32"), ("F16", "float32"),
               ("BF16", "float16"), ("F16", "bfloat16")]

QKV = {"match": "model.layers.{L}.self_attn.{P}.weight",
       "fuse": {"into": "model.layers.{L}.self_attn.qkv_proj.weight", "over": "P",
                "order": ["q_proj", "k_proj", "v_proj"]}}
STACK = {"match": "model.layers.{L}.mlp.experts.{E}.{W}.weight",
         "stack": {"into": "model.layers.{L}.mlp.experts.{W}", "over": "E"}}


# ------------------------------------------------------------------------------------------
# checkpoints and specs


def synth(tmp_path, family: str, **kw) -> tuple[str, dict]:
    """Write a synthetic checkpoint; returns its path and {name: array} of what was written."""
    res = write_checkpoint(tmp_path / family, family, **kw)
    lay = layout(family, size_bytes=kw.get("size_bytes"), layers=kw.get("layers"), dtype=kw.get("dtype", "BF16"),
                 experts=kw.get("experts"))
    return res.path, {t.name: tensor_data(t, kw.get("seed", 0)) for t in lay.tensors}


def handmade(tmp_path, tensors: dict, name: str = "hand.safetensors") -> tuple[str, dict]:
    """Write `tensors` (numpy / ml_dtypes arrays, 0-d ones too) with the safetensors package."""
    path = tmp_path / name
    save_file({k: np.asarray(v, order="C") for k, v in tensors.items()}, str(path))
    return str(path), dict(tensors)


def spec_file(tmp_path, checkpoint, rules: list, io: dict | None = None, host: str = "64MiB",
              name: str = "spec.yaml", device: str | None = None):
    """Write a placement spec for `checkpoint` into `tmp_path`; returns its path."""
    doc = {"checkpoint": str(checkpoint), "device": "cuda:0", "budget": {"host": host}, "rules": rules}
    if device:
        doc["budget"]["device"] = device
    if io:
        doc["io"] = io
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def convert_source(tmp_path, src: str, n: int = 1200):
    """Tensors of one dtype with edge values: signed zeros, infinities, subnormals of every type,
    values past the float16 range and between two representable ones; an empty and a 0-d tensor."""
    rng = np.random.default_rng(11)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.5, 65504.0, 65520.0, 1e5, -3e38, 2.0**-24, 2.0**-25,
                     1.5 * 2.0**-25, 2.0**-133, 2.0**-149, 1.0 + 2.0**-8, 1.0 + 2.0**-11, 3.0e-41], np.float32)
    a = np.concatenate([edge, rng.standard_normal(n).astype(np.float32) * np.float32(3)])
    b = (rng.standard_normal((23, 37)) * 0.02).astype(np.float32)
    keep = rng.standard_normal(9).astype(np.float32)
    with np.errstate(over="ignore"):
        return handmade(tmp_path, {"conv.a": a.astype(NP[src]), "conv.b": b.astype(NP[src]),
                                   "conv.empty": np.zeros((0, 3), NP[src]), "conv.scalar": np.array(-2.75, NP[src]),
                                   "keep.c": keep.astype(NP[src])})


def fp8_rules(target: str, on: str, match: str = "*") -> list:
    return [{"match": match, "source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": target, "on": on},
            {"match": "*"}]


# ------------------------------------------------------------------------------------------
# expected values


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def cast(a: np.ndarray, target: str) -> np.ndarray:
    """Through float32, as the executor converts (a direct BF16 -> F16 cast differs on NaN only)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(np.float32).astype(NP[target])


def dequant(w: np.ndarray, scale: np.ndarray, target: str, block: int = 128) -> np.ndarray:
    rows, cols = w.shape
    s = np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[:rows, :cols]
    with np.errstate(over="ignore", invalid="ignore"):
        return (w.astype(np.float32) * s.astype(np.float32)).astype(NP[target])


def fused(want: dict, layers: int, target: str | None = None) -> dict:
    out = {k: v for k, v in want.items() if not any(f".self_attn.{p}_proj." in k for p in "qkv")}
    for L in range(layers):
        qkv = np.concatenate([want[f"model.layers.{L}.self_attn.{p}_proj.weight"] for p in "qkv"], axis=0)
        out[f"model.layers.{L}.self_attn.qkv_proj.weight"] = cast(qkv, target) if target else qkv
    return out


def stacked(want: dict, layers: int, experts: int, target: str | None = None) -> dict:
    out = {k: v for k, v in want.items() if ".mlp.experts." not in k}
    for L in range(layers):
        for w in ("gate_proj", "up_proj", "down_proj"):
            s = np.stack([want[f"model.layers.{L}.mlp.experts.{e}.{w}.weight"] for e in range(experts)])
            out[f"model.layers.{L}.mlp.experts.{w}"] = cast(s, target) if target else s
    return out


def dequantized(want: dict, target: str, which=lambda name: True) -> dict:
    """`want` with each FP8 weight that `which` selects dequantized and its scale consumed."""
    out = {}
    for name, arr in want.items():
        if name.endswith("_scale_inv"):
            if not which(name[:-len("_scale_inv")]):
                out[name] = arr
            continue
        out[name] = dequant(arr, want[name + "_scale_inv"], target) if arr.dtype == NP["F8_E4M3"] and which(name) \
            else arr
    return out


# ------------------------------------------------------------------------------------------
# checks


def assert_tensor(model, name: str, want: np.ndarray) -> None:
    got = model[name].to_host()
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, want {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, want {want.shape}"
    if not np.array_equal(bits(got), bits(want)):
        bad = np.flatnonzero(bits(got) != bits(want))
        raise AssertionError(f"{name}: {bad.size} bytes differ, first at byte {bad[0]}")


def assert_model(model, want: dict) -> None:
    assert sorted(model.keys()) == sorted(want), "loaded tensor names differ from the expected ones"
    for name, arr in want.items():
        assert_tensor(model, name, arr)


def load_checked(spec_path, models: list, **kw):
    """compile + execute(verify=True), appending the model to `models` (freed by the caller).

    Checks the executor's own verification, and that the requests, copies and kernels it issued
    equal the plan's totals."""
    plan = compile_spec(spec_path)
    assert plan.fits, plan.refusal
    model = execute(plan, verify=True, **kw)
    models.append(model)
    rep, tot = model.report, plan.to_dict()["totals"]
    assert rep["verify"]["ok"], rep["verify"]["mismatches"]
    assert rep["verify"]["parts"] == tot["source_tensors"]
    for k in ("requests", "copies", "kernels"):
        assert rep[k]["issued"] == tot[k] == rep[k]["predicted"], (k, rep[k], tot[k])
    return plan, model


def refuse_direct_open(monkeypatch) -> None:
    """A file system that refuses O_DIRECT at open (EINVAL), with the page cache seen as cold."""
    real_open = os.open

    def fake_open(p, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    cold_page_cache(monkeypatch)


def cold_page_cache(monkeypatch) -> None:
    """Every load from now reads through a reader that sees the page cache as cold (io.direct: auto
    then chooses O_DIRECT)."""
    from planc.execute.io.reader import Reader

    class ColdCache(Reader):
        def cache_fraction(self, path, size):
            return 0.0

    use_parts(monkeypatch, reader=reader_of(ColdCache))


# ------------------------------------------------------------------------------------------
# faults shared by the simulator and GPU fault tests


def fail_read_at(monkeypatch, n: int) -> list:
    """`os.preadv` raises EIO on its n-th call from now; returns the list of calls (clear it to re-arm)."""
    real, calls = os.preadv, []

    def preadv(fd, bufs, offset, *a):
        calls.append(offset)
        if len(calls) == n:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset, *a)

    monkeypatch.setattr(os, "preadv", preadv)
    return calls


def use_parts(monkeypatch, **fields):
    """Every load from now (the command line's and the API's included) composed of these parts
    (`planc.execute.pipeline.parts.Parts` fields) over the ones in use; an `observer` joins those in use."""
    import dataclasses

    from planc.execute.pipeline import parts as parts_mod
    from planc.execute.pipeline.events import fanout

    now = parts_mod.DEFAULT
    if "observer" in fields:
        fields["observer"] = fanout(now.observer, fields["observer"])
    new = dataclasses.replace(now, **fields)
    monkeypatch.setattr(parts_mod, "DEFAULT", new)
    return new


def live_room_by_call(monkeypatch, rooms) -> list:
    """The loader's per-run live room: `rooms(call number)` bytes (the first call is admission's,
    before anything is allocated); returns the list of calls."""
    from planc.execute.device.memory import LiveRoom
    from planc.execute.device.memory import live_room as real

    calls = []

    def live_room(reserve=None, run=None):
        if run is None:  # the plan's admission, before anything is allocated: the machine's room
            return real(reserve)
        calls.append(1)
        n = rooms(len(calls))
        return LiveRoom(n, None, 0, n)

    use_parts(monkeypatch, live_room=live_room)
    return calls


def watch_regions(monkeypatch) -> list:
    """Record, for each load from now, weak references to what its regions allocated: a dict with
    `regions` (the `Regions` value), `ring` (the pinned ring's owners) and `arena` (once allocated)."""
    import weakref

    from planc.execute.pipeline.allocation import Regions
    from planc.execute.pipeline import parts as parts_mod

    seen = []
    base = parts_mod.DEFAULT.regions

    class Watched(Regions):
        def __init__(self, *a, **k):
            self._seen = {}
            seen.append(self._seen)
            self._seen["regions"] = weakref.ref(self)
            super().__init__(*a, **k)

        def pin_ring(self):
            super().pin_ring()
            self._seen["ring"] = weakref.ref(self.ring_owner)

        def _allocate_device(self):
            super()._allocate_device()
            self._seen["arena"] = weakref.ref(self.arena)

    assert base == Regions.start, "watch_regions stacks on the real regions only"
    use_parts(monkeypatch, regions=Watched.start)
    return seen


def gone(rec: dict, key: str) -> bool:
    """Whether what `watch_regions` recorded under `key` was freed (or never allocated)."""
    ref = rec.get(key)
    return ref is None or ref() is None


def reader_of(cls):
    """The reader part that opens a `cls` (a subclass of `planc.execute.io.reader.Reader`)."""
    from planc.execute.pipeline.allocation import open_reader

    return lambda plan: open_reader(plan, cls)


def record_events(monkeypatch) -> list:
    """Every event of every load from now, in the order the observer is told of them."""
    got = []
    use_parts(monkeypatch, observer=got.append)
    return got


def holds_open(pid: int, paths) -> bool:
    """Whether process `pid` has one of `paths` (a path or a set of them) open."""
    paths = {paths} if isinstance(paths, str) else set(paths)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in paths:
                return True
        except OSError:
            pass
    return False


def one_line(err: str) -> str:
    """The one `planc: ...` line a failed command writes to stderr (no traceback)."""
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("planc: ")
    return lines[0]


def cli_run(capsys, *args) -> tuple[int, str, str]:
    """`planc ARGS` in process: (exit code, stdout, stderr) of that command alone."""
    from planc.face import cli

    capsys.readouterr()
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def interrupt_at(monkeypatch, n: int) -> list:
    """Ctrl-C in the middle of the pipeline: the n-th read sent on to the device from now (its copy
    issued) raises KeyboardInterrupt on the pipeline's thread; returns the list of calls (clear it to
    re-arm)."""
    from planc.execute.pipeline.events import CopyIssued

    calls = []

    def observe(event):
        if isinstance(event, CopyIssued) and event.request is not None:
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt

    use_parts(monkeypatch, observer=observe)
    return calls


class RecordingDevice:
    """A device (`planc.execute.device.seam.Device`) that records every kernel launch as (name, grid,
    block, args) in `launches` and hands it on to `inner`, the real device (`forward=False`: records
    only, for geometry a simulator could not run in a test's time). `grid`: the launch geometry to
    choose with (`planc.execute.device.geometry.GpuGrid(132)` for an H200's; default: `inner`'s). Passed
    to `execute(plan, device=...)` or to a dispatcher's `dev=`; nothing in the executor is patched."""

    def __init__(self, inner, grid=None, forward: bool = True):
        self.inner, self.forward = inner, forward
        self.grid = inner.grid if grid is None else grid
        self.launches: list = []

    def __getattr__(self, name):  # memory, streams, copies, capabilities: the inner device's
        return getattr(self.inner, name)

    def launch(self, name: str, grid, block, stream, *args, kernel=None) -> None:
        self.launches.append((name, grid, block, args))
        if self.forward:
            self.inner.launch(name, grid, block, stream, *args, kernel=kernel)


def gguf_llama_want(path) -> dict:
    """transformers name -> (GGUF name, float32 values) of every tensor of a Llama GGUF that the shipped
    spec loads: the stored values, quantized ones as the `gguf` package dequantizes them, q and k
    rows put back in transformers' order (`unpermute_rows`)."""
    import gguf

    from planc.manifest import read_manifest
    from planc.manifest.gguf_names import permuted_heads, transformers_name, unpermute_rows

    man = read_manifest(path)
    meta = dict(man.shards[0].metadata)
    out = {}
    for t in man.tensors:
        name = transformers_name(t.name)
        if name is None:
            continue
        with open(path, "rb") as f:
            f.seek(t.start)
            raw = np.frombuffer(f.read(t.nbytes), np.uint8)
        if t.dtype in ("F32", "F16"):
            want = raw.view({"F32": np.float32, "F16": np.float16}[t.dtype]).astype(np.float32).reshape(t.shape)
        else:
            rows = int(np.prod(t.shape[:-1]))
            want = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[t.dtype])
            want = want.astype(np.float32).reshape(t.shape)
        n_head = permuted_heads(t.name, meta)
        if n_head:
            want = unpermute_rows(want, n_head)
        out[name] = (t.name, np.ascontiguousarray(want, np.float32))
    return out


def llamacpp_want(path, dtype="float32") -> dict:
    """{name: the `gguf` package's dequantization of each tensor of a GGUF, as `dtype`}."""
    import gguf
    import ml_dtypes

    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            v = data.astype(np.float32)
        else:
            v = gguf.quants.dequantize(data, t.tensor_type)
        out[t.name] = v.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    return out

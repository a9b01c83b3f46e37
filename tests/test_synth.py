"""Synthetic checkpoints: layout, bytes, shards, sparse files, determinism."""

from __future__ import annotations

import json
import math
import os
import struct
import time

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from planc.base.dtypes import DTYPES
from planc.tools.synth import (
    FP8_BLOCK,
    INDEX_NAME,
    SINGLE_NAME,
    SynthResult,
    describe,
    layout,
    main,
    shard_name,
    split_balanced,
    tensor_data,
    write_checkpoint,
    write_safetensors,
)


def read_header(path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def read_raw(path, name: str) -> np.ndarray:
    """A tensor read straight from the file (works for dtypes safetensors' numpy side lacks)."""
    n, head = read_header(path)
    meta = head[name]
    begin, end = meta["data_offsets"]
    with open(path, "rb") as f:
        f.seek(8 + n + begin)
        raw = f.read(end - begin)
    return np.frombuffer(raw, dtype=DTYPES[meta["dtype"]].numpy).reshape(meta["shape"])


def expected_names(family: str, layers: int, experts: int = 8) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for L in range(layers):
        p = f"model.layers.{L}"
        attn = [f"{p}.self_attn.{x}_proj.weight" for x in "qkvo"]
        if family == "moe":
            mlp = [f"{p}.mlp.gate.weight"] + [
                f"{p}.mlp.experts.{e}.{x}_proj.weight" for e in range(experts) for x in ("gate", "up", "down")
            ]
        else:
            mlp = [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        if family == "fp8":
            attn = [n for a in attn for n in (a, f"{a}_scale_inv")]
            mlp = [n for m in mlp for n in (m, f"{m}_scale_inv")]
        names += [f"{p}.input_layernorm.weight", *attn, f"{p}.post_attention_layernorm.weight", *mlp]
    return names + ["model.norm.weight", "lm_head.weight"]


# --------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize("family", ["dense", "moe", "fp8"])
def test_tiny_model_reads_back(tmp_path, family):
    res = write_checkpoint(tmp_path, family)
    assert isinstance(res, SynthResult)
    assert res.path == str(tmp_path / SINGLE_NAME) and res.files == (res.path,)
    assert not (tmp_path / INDEX_NAME).exists()
    assert res.total_bytes == os.path.getsize(res.path) < 2**20
    assert 20 <= res.tensors <= 80

    lay = layout(family)
    assert [t.name for t in lay.tensors] == expected_names(family, lay.layers)
    h, kv, i, v = lay.dims.hidden, lay.dims.kv, lay.dims.intermediate, lay.dims.vocab
    assert (h, kv, v) == (64, 16, 256) and kv == h // 4

    with safe_open(res.path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "writer": "planc synth"}  # transformers reads the format; the writer marks it as synth's
        keys = set(f.keys())
        assert keys == {t.name for t in lay.tensors} and len(keys) == res.tensors
        for t in lay.tensors:
            sl = f.get_slice(t.name)
            assert tuple(sl.get_shape()) == t.shape
            assert sl.get_dtype() == t.dtype

    shapes = {t.name: t.shape for t in lay.tensors}
    p = "model.layers.1"
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (v, h)
    assert shapes[f"{p}.self_attn.q_proj.weight"] == shapes[f"{p}.self_attn.o_proj.weight"] == (h, h)
    assert shapes[f"{p}.self_attn.k_proj.weight"] == shapes[f"{p}.self_attn.v_proj.weight"] == (kv, h)
    if family == "moe":
        assert shapes[f"{p}.mlp.gate.weight"] == (lay.dims.experts, h)
        assert shapes[f"{p}.mlp.experts.3.gate_proj.weight"] == (i, h)
        assert shapes[f"{p}.mlp.experts.3.up_proj.weight"] == (i, h)
        assert shapes[f"{p}.mlp.experts.3.down_proj.weight"] == (h, i)
    else:
        assert shapes[f"{p}.mlp.gate_proj.weight"] == shapes[f"{p}.mlp.up_proj.weight"] == (i, h)
        assert shapes[f"{p}.mlp.down_proj.weight"] == (h, i)

    if family != "fp8":  # BF16 loads through safetensors' numpy side
        loaded = load_file(res.path)
        for t in lay.tensors:
            assert loaded[t.name].dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(loaded[t.name].view(np.uint16),
                                          tensor_data(t).view(np.uint16))


def test_tiny_fp8_dtypes_scales_and_values(tmp_path):
    res = write_checkpoint(tmp_path, "fp8")
    lay = layout("fp8")
    _, head = read_header(res.path)
    weights = [t for t in lay.tensors if t.dtype == "F8_E4M3"]
    assert len(weights) == 7 * lay.layers
    for t in lay.tensors:
        if t.name.endswith("_scale_inv"):
            assert t.dtype == "F32"
        elif "norm" in t.name or "embed" in t.name or t.name == "lm_head.weight":
            assert t.dtype == "BF16"
    rows_cols = set()
    deq = []
    for w in weights:
        assert head[w.name]["dtype"] == "F8_E4M3"
        rows, cols = w.shape
        rows_cols |= {rows, cols}
        scale_name = f"{w.name}_scale_inv"
        expect = [math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)]
        assert head[scale_name] == {**head[scale_name], "dtype": "F32", "shape": expect}
        q = read_raw(res.path, w.name).astype(np.float32)
        s = read_raw(res.path, scale_name)
        assert np.isfinite(q).all() and np.abs(q).max() <= 448
        assert np.isfinite(s).all() and (s > 0).all()
        blocks = np.repeat(np.repeat(s, FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
        deq.append((q * blocks).ravel())
    assert any(d % FP8_BLOCK for d in rows_cols)  # partial edge blocks
    assert any(math.ceil(d / FP8_BLOCK) > 1 for d in rows_cols)  # and more than one block
    std = np.concatenate(deq).std()
    assert 0.01 < std < 0.04  # dequantized weights look like N(0, 0.02)


def test_fp8_scale_shapes_ceil_divided_at_every_size():
    for size in (None, 30 * 10**6, 2 * 10**9):
        lay = layout("fp8", size_bytes=size)
        specs = {t.name: t for t in lay.tensors}
        n = 0
        for t in lay.tensors:
            if t.dtype == "F8_E4M3":
                s = specs[f"{t.name}_scale_inv"]
                assert s.shape == tuple(-(-d // 128) for d in t.shape)
                n += 1
        assert n == 7 * lay.layers
    assert layout("fp8", size_bytes=30 * 10**6).dims.intermediate % 128  # small preset: partial


@pytest.mark.parametrize("dtype,np_dtype", [("F16", np.float16), ("F32", np.float32)])
def test_dtype_option(tmp_path, dtype, np_dtype):
    res = write_checkpoint(tmp_path, "dense", dtype=dtype)
    loaded = load_file(res.path)
    assert {a.dtype for a in loaded.values()} == {np.dtype(np_dtype)}
    allv = np.concatenate([a.ravel() for a in loaded.values()]).astype(np.float64)
    assert np.isfinite(allv).all() and 0.015 < allv.std() < 0.025


# --------------------------------------------------------------------------- the byte layout


def pieces(raw: bytes, n: int):
    for j in range(0, len(raw), n):
        yield raw[j:j + n]


def test_streamed_writer_is_byte_identical_to_save_file(tmp_path):
    rng = np.random.default_rng(7)
    tensors = {
        "z.bf16": rng.standard_normal((5, 3)).astype(ml_dtypes.bfloat16),
        "a.f32": rng.standard_normal((7,)).astype(np.float32),
        "m.fp8": rng.standard_normal((3, 129)).astype(ml_dtypes.float8_e4m3fn),
        "b.f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "i64": np.arange(3, dtype=np.int64),
        "u8": np.arange(5, dtype=np.uint8),
        "flag": np.array([True, False, True]),
        "a.f32.second": rng.standard_normal((1, 3)).astype(np.float32),
    }
    names = {np.dtype(d.numpy): d.name for d in DTYPES.values() if d.numpy is not None}
    # (safetensors writes several metadata keys in hash order, so compare with one key at most)
    for metadata in (None, {"format": "pt"}):
        ref, ours = tmp_path / "ref.safetensors", tmp_path / "ours.safetensors"
        save_file(tensors, str(ref), metadata=metadata)
        # Sources as arrays, as bytes, and as several chunks.
        items = []
        for k, (name, a) in enumerate(tensors.items()):
            raw = a.tobytes()
            src = [a, raw, pieces(raw, 5)][k % 3]
            items.append((name, names[a.dtype], a.shape, src))
        size = write_safetensors(ours, items, metadata)
        assert ours.read_bytes() == ref.read_bytes()
        assert size == os.path.getsize(ours)
        n, _ = read_header(ours)
        assert n % 8 == 0


def test_streamed_writer_checks_lengths(tmp_path):
    with pytest.raises(ValueError, match="expected 8"):
        write_safetensors(tmp_path / "x.safetensors", [("a", "F32", (2,), b"\0" * 4)])


@pytest.mark.parametrize("family", ["dense", "moe", "fp8"])
def test_streamed_and_save_file_paths_agree(tmp_path, family):
    a = write_checkpoint(tmp_path / "a", family, stream=False)
    b = write_checkpoint(tmp_path / "b", family, stream=True)
    assert open(a.path, "rb").read() == open(b.path, "rb").read()


def test_tensors_larger_than_the_random_block_agree(tmp_path):
    # ~20 MB: the embeddings hold more elements than the pool, so the block repeats.
    a = write_checkpoint(tmp_path / "a", "dense", size_bytes=20 * 10**6, stream=False)
    b = write_checkpoint(tmp_path / "b", "dense", size_bytes=20 * 10**6, stream=True)
    assert a.total_bytes == b.total_bytes and abs(a.data_bytes - 20 * 10**6) < 2 * 10**6
    assert open(a.path, "rb").read() == open(b.path, "rb").read()
    emb = load_file(a.path)["model.embed_tokens.weight"].astype(np.float32)
    assert np.isfinite(emb).all()


def test_deterministic_for_a_seed(tmp_path):
    a = write_checkpoint(tmp_path / "a", "moe", seed=3)
    b = write_checkpoint(tmp_path / "b", "moe", seed=3)
    c = write_checkpoint(tmp_path / "c", "moe", seed=4)
    ab, bb, cb = (open(r.path, "rb").read() for r in (a, b, c))
    assert ab == bb
    assert ab != cb and len(ab) == len(cb)
    t = load_file(a.path)
    q0 = t["model.layers.0.self_attn.q_proj.weight"].view(np.uint16)
    q1 = t["model.layers.1.self_attn.q_proj.weight"].view(np.uint16)
    assert not np.array_equal(q0, q1)  # tensors differ from one another


# --------------------------------------------------------------------------- shards


def test_shards_balanced_and_index_consistent(tmp_path):
    res = write_checkpoint(tmp_path, "dense", layers=8, shards=3)
    lay = layout("dense", layers=8)
    assert res.path == str(tmp_path / INDEX_NAME)
    assert [os.path.basename(f) for f in res.files] == [shard_name(i, 3) for i in (1, 2, 3)]
    assert shard_name(1, 3) == "model-00001-of-00003.safetensors"
    assert not (tmp_path / SINGLE_NAME).exists()

    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == lay.data_bytes == res.data_bytes
    wm = index["weight_map"]
    assert set(wm) == {t.name for t in lay.tensors}

    in_file = {}
    per_shard = []
    for f in res.files:
        with safe_open(f, framework="numpy") as sf:
            keys = list(sf.keys())
        in_file.update({k: os.path.basename(f) for k in keys})
        per_shard.append(sum(t.nbytes for t in lay.tensors if t.name in set(keys)))
    assert in_file == wm
    assert sum(per_shard) == lay.data_bytes
    assert res.total_bytes == sum(os.path.getsize(f) for f in res.files)

    # Contiguous in the model's natural order.
    order = [wm[t.name] for t in lay.tensors]
    assert order == sorted(order)
    biggest = max(t.nbytes for t in lay.tensors)
    for b in per_shard:
        assert abs(b - lay.data_bytes / 3) <= biggest


def test_split_balanced():
    assert split_balanced([1] * 10, 1) == [0]
    assert split_balanced([1] * 10, 2) == [0, 5]
    assert split_balanced([1] * 3, 3) == [0, 1, 2]
    assert split_balanced([100, 1, 1, 1], 3) == [0, 1, 2]  # every shard keeps a tensor
    sizes = list(np.random.default_rng(0).integers(1, 100, 500))
    starts = split_balanced(sizes, 7) + [len(sizes)]
    parts = [sum(sizes[a:b]) for a, b in zip(starts, starts[1:])]
    assert all(abs(p - sum(sizes) / 7) <= max(sizes) for p in parts)
    with pytest.raises(ValueError):
        split_balanced([1, 2], 3)


# --------------------------------------------------------------------------- sizes and sparse files


def test_sparse_50gb_moe_is_fast_and_takes_no_disk(tmp_path):
    t0 = time.perf_counter()
    res = write_checkpoint(tmp_path, "moe", size_bytes=50 * 10**9, sparse=True, shards=4)
    assert time.perf_counter() - t0 < 5
    assert abs(res.total_bytes - 50 * 10**9) < 0.1 * 50 * 10**9
    assert res.total_bytes == sum(os.path.getsize(f) for f in res.files)
    for f in res.files:
        n, _ = read_header(f)
        assert os.stat(f).st_blocks * 512 <= 8 + n + 2**20
    with safe_open(res.files[-1], framework="numpy") as sf:
        assert sf.get_tensor("model.norm.weight").astype(np.float32).tolist() == [0.0] * res.dims.hidden
    assert "sparse" in describe(res)


def test_sparse_moe_1gb_has_over_10000_tensors(tmp_path):
    res = write_checkpoint(tmp_path, "moe", size_bytes=10**9, sparse=True)
    assert res.tensors > 10_000
    assert abs(res.total_bytes - 10**9) < 0.1 * 10**9
    assert res.dims.experts == 64
    with safe_open(res.path, framework="numpy") as sf:
        assert len(list(sf.keys())) == res.tensors


def test_sparse_header_equals_real_header(tmp_path):
    a = write_checkpoint(tmp_path / "a", "fp8", shards=2)
    b = write_checkpoint(tmp_path / "b", "fp8", shards=2, sparse=True)
    for fa, fb in zip(a.files, b.files):
        assert read_header(fa) == read_header(fb)
        assert os.path.getsize(fa) == os.path.getsize(fb)
    assert (tmp_path / "a" / INDEX_NAME).read_text() == (tmp_path / "b" / INDEX_NAME).read_text()


@pytest.mark.parametrize("family", ["dense", "moe", "fp8"])
@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_size_lands_within_ten_percent(family, dtype):
    for size in (2 * 10**6, 37 * 10**6, 300 * 10**6, 10**9, 5 * 2**30, 20 * 10**9, 300 * 10**9):
        lay = layout(family, size_bytes=size, dtype=dtype)
        assert abs(lay.data_bytes - size) <= 0.1 * size, (family, dtype, size, lay.dims)


def test_presets():
    big = layout("dense", size_bytes=16 * 10**9)
    assert (big.dims.hidden, big.dims.intermediate, big.dims.vocab, big.dims.kv) == (4096, 14336, 128256, 1024)
    assert layout("dense", size_bytes=3 * 10**6).dims.hidden == 64
    assert layout("dense", layers=5).dims == layout("dense").dims and layout("dense", layers=5).layers == 5
    both = layout("moe", size_bytes=10**9, layers=20)
    assert both.layers == 20 and abs(both.data_bytes - 10**9) < 0.1 * 10**9
    assert layout("moe", experts=4).dims.experts == 4


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="family"):
        write_checkpoint(tmp_path, "rnn")
    with pytest.raises(ValueError, match="dtype"):
        write_checkpoint(tmp_path, "dense", dtype="F8_E4M3")
    with pytest.raises(ValueError, match="shards"):
        write_checkpoint(tmp_path, "dense", shards=1000)
    write_checkpoint(tmp_path, "dense", shards=2)
    with pytest.raises(ValueError, match="empty folder"):
        write_checkpoint(tmp_path, "dense")
    write_checkpoint(tmp_path, "dense", shards=2, seed=1)  # same files again: overwritten


def test_describe(tmp_path):
    text = describe(write_checkpoint(tmp_path, "fp8", shards=2))
    assert "fp8" in text and "35 tensors in 2 files" in text and "H=64" in text and "F8_E4M3" in text


def test_cli(tmp_path, capsys):
    assert main([str(tmp_path), "--family", "moe", "--size", "2MB", "--shards", "2", "--sparse"]) == 0
    out = capsys.readouterr().out
    assert "moe checkpoint" in out and (tmp_path / INDEX_NAME).exists()

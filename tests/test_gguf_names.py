"""GGUF names -> transformers', against the `gguf` package's own name map; the q/k row order."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from planc.manifest.gguf_names import permute_rows, permuted_heads, source_rows, transformers_name, unpermute_rows
from planc.manifest import read_manifest  # noqa: E402
from planc.tools.synth_gguf import write_gguf  # noqa: E402


def test_every_name_of_a_llama_file_maps_back_through_ggufs_table(tmp_path):
    res = write_gguf(tmp_path, quant="Q4_K_M", layers=2)
    names = [t.name for t in read_manifest(res.path).tensors]
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    seen = set()
    for g in names:
        hf = transformers_name(g)
        assert hf is not None and hf not in seen, g
        seen.add(hf)
        base, suffix = hf.rsplit(".", 1)
        assert f"{table.get_name(base)}.{suffix}" == g, (g, hf)
    assert transformers_name("blk.1.attn_q.weight") == "model.layers.1.self_attn.q_proj.weight"
    assert transformers_name("rope_freqs.weight") is None
    with pytest.raises(KeyError):
        transformers_name("blk.0.attn_qkv.weight")
    with pytest.raises(ValueError):
        transformers_name("token_embd.weight", "phi3")


def _llama_cpp_permute(w, n_head, n_head_kv):  # convert_hf_to_gguf.py, LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize("n_head,hd,cols", [(1, 4, 3), (4, 8, 5), (2, 64, 16)])
def test_rows_unpermuted_to_transformers_order(n_head, hd, cols):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_head * hd, cols)).astype(np.float32)
    stored = _llama_cpp_permute(w, n_head, None)
    assert np.array_equal(permute_rows(w, n_head), stored)
    assert np.array_equal(unpermute_rows(stored, n_head), w)
    assert np.array_equal(stored[source_rows(n_head * hd, n_head)], w)
    if n_head > 1:
        assert not np.array_equal(stored, w)


def test_one_head_by_hand():
    # transformers' rows (j, i) of a head of dim 4: 0=(0,0) 1=(0,1) 2=(1,0) 3=(1,1); stored as (i, j)
    assert permute_rows(np.arange(4), 1).tolist() == [0, 2, 1, 3]
    assert source_rows(4, 1).tolist() == [0, 2, 1, 3]
    with pytest.raises(ValueError):
        unpermute_rows(np.zeros((6, 2)), 4)


def test_head_counts_from_the_files_metadata(tmp_path):
    res = write_gguf(tmp_path, quant="Q8_0", layers=1)
    meta = dict(read_manifest(res.path).shards[0].metadata)
    assert permuted_heads("blk.0.attn_q.weight", meta) == res.dims.heads
    assert permuted_heads("blk.0.attn_k.weight", meta) == res.dims.kv_heads
    assert permuted_heads("blk.0.attn_v.weight", meta) is None
    with pytest.raises(KeyError):
        permuted_heads("blk.0.attn_q.weight", {})


def test_a_quantized_tensors_rows_move_as_whole_blocks(tmp_path):
    from planc.execute.kernels.gguf_dequant import dequantize

    res = write_gguf(tmp_path, quant="Q4_K_M", layers=1)
    t = {x.name: x for x in read_manifest(res.path).tensors}["blk.0.attn_q.weight"]
    with open(res.path, "rb") as f:
        f.seek(t.start)
        raw = np.frombuffer(f.read(t.nbytes), np.uint8).reshape(t.shape[0], -1)  # rows of whole blocks
    heads = res.dims.heads
    moved = dequantize(np.ascontiguousarray(unpermute_rows(raw, heads)), t.dtype, t.shape)
    assert np.array_equal(moved, unpermute_rows(dequantize(raw, t.dtype, t.shape), heads))

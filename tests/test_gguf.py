"""GGUF: the reader against files the gguf package writes, a hostile corpus, dequantization
(host numpy and the device kernels under the simulator) against gguf's own numpy reference."""

from __future__ import annotations

import os
import struct

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba is first imported, as tests/test_kernels.py

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from planc.base.errors import ManifestError  # noqa: E402
from planc.execute.kernels.gguf_dequant import dequantize  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402
from planc.manifest.ggml_types import GGML_TYPES  # noqa: E402
from planc.tools.synth_gguf import write_gguf  # noqa: E402

T = gguf.GGMLQuantizationType


def test_type_table_matches_gguf():
    for t in T:
        ours = GGML_TYPES[t.value]
        assert (ours.block, ours.block_bytes) == gguf.GGML_QUANT_SIZES[t], t.name


def test_synth_takes_the_preset_of_a_width(tmp_path):
    """`hidden` picks the preset of that width (its layers fitting the size); an unknown width is refused."""
    from planc.tools.synth_gguf import _choose, gguf_layout

    d, n = _choose("Q6_K", 2 << 30, None, 4096)
    assert d.hidden == 4096 and n >= 1
    size = sum(t.nbytes for t in gguf_layout("Q6_K", d, n))
    per = size - sum(t.nbytes for t in gguf_layout("Q6_K", d, n - 1))
    assert abs(size - (2 << 30)) <= per  # the layers that come nearest the size
    assert _choose("Q6_K", 2 << 30, None)[0].hidden == 2048  # without it, the largest of which 8 layers fit
    r = write_gguf(tmp_path / "a", quant="Q8_0", layers=1, hidden=1024)
    assert r.dims.hidden == 1024 and r.layers == 1
    with pytest.raises(ValueError, match="no preset of hidden size 3000"):
        write_gguf(tmp_path / "b", quant="Q8_0", layers=1, hidden=3000)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M", "Q4_0", "Q6_K", "F16", "BF16", "F32"])
def test_reader_matches_gguf_reader(tmp_path, quant):
    r = write_gguf(tmp_path, quant=quant, layers=2)
    m = read_manifest(r.path)
    assert m.format == "gguf"
    theirs = {t.name: t for t in gguf.GGUFReader(r.path).tensors}
    assert len(theirs) == len(m.tensors)
    for t in m.tensors:
        g = theirs[t.name]
        assert t.shape == tuple(int(d) for d in reversed(g.shape))
        assert t.start == int(g.data_offset) and t.nbytes == int(g.n_bytes)
    meta = dict(m.shards[0].metadata)
    assert meta["general.architecture"] == "llama" and meta["llama.context_length"] == "4096"


def _write(path, version=3, alignment=None, tensors=(("a", (64,), T.F32),)):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for name, shape, t in tensors:
        w.add_tensor(name, np.zeros(shape, np.float32) if t == T.F32 else
                     gguf.quants.quantize(np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape), t),
                     raw_dtype=None if t == T.F32 else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        b = bytearray(path.read_bytes())
        b[4:8] = struct.pack("<I", version)
        path.write_bytes(bytes(b))
    return path


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("alignment", [None, 64, 128])
def test_versions_and_alignments(tmp_path, version, alignment):
    p = _write(tmp_path / "m.gguf", version, alignment,
               (("a", (3, 64), T.Q8_0), ("b", (5,), T.F32), ("c", (2, 32), T.Q4_0)))
    m = read_manifest(p)
    assert [t.name for t in m.tensors] == ["a", "b", "c"]
    assert all((t.start - m.shards[0].data_start) % (alignment or 32) == 0 for t in m.tensors)
    assert m.tensor("a").shape == (3, 64)


def _hostile(tmp_path, mutate):
    p = _write(tmp_path / "m.gguf", tensors=(("a", (2, 64), T.Q8_0), ("b", (64,), T.F32)))
    b = bytearray(p.read_bytes())
    b = mutate(b)
    p.write_bytes(bytes(b))
    with pytest.raises(ManifestError) as e:
        read_manifest(p)
    assert "m.gguf" in str(e.value)
    return e.value.code


def _find(b, s):
    return bytes(b).index(s)


def test_hostile_corpus(tmp_path):
    assert _hostile(tmp_path, lambda b: b"GGUX" + b[4:]) == "gguf-bad-magic"
    assert _hostile(tmp_path, lambda b: b[:4] + struct.pack("<I", 1) + b[8:]) == "gguf-bad-version"
    assert _hostile(tmp_path, lambda b: b[:30]) in ("gguf-truncated", "gguf-count-past-eof")
    assert _hostile(tmp_path, lambda b: b[:-40]) == "data-short"
    assert _hostile(tmp_path, lambda b: b[:8] + struct.pack("<Q", 1 << 60) + b[16:]) == "gguf-count-past-eof"
    assert _hostile(tmp_path, lambda b: b[:16] + struct.pack("<Q", 1 << 60) + b[24:]) == "gguf-count-past-eof"
    # a string length past the file: the first key's length
    assert _hostile(tmp_path, lambda b: b[:24] + struct.pack("<Q", 1 << 40) + b[32:]) in (
        "gguf-truncated", "gguf-bad-string")

    def tensor_field(b, name, field):
        at = _find(b, b"\x01\x00\x00\x00\x00\x00\x00\x00" + name) + 9  # name's length, then name
        n_dims = struct.unpack_from("<I", b, at)[0]
        after = at + 4 + 8 * n_dims
        return {"dims": at + 4, "type": after, "offset": after + 4}[field]

    def set_u(b, at, fmt, v):
        struct.pack_into(fmt, b, at, v)
        return b

    assert _hostile(tmp_path, lambda b: set_u(b, tensor_field(b, b"a", "type"), "<I", 4)) == "unknown-dtype"
    assert _hostile(tmp_path, lambda b: set_u(b, tensor_field(b, b"b", "offset"), "<Q", 0)) == "overlap"
    assert _hostile(tmp_path, lambda b: set_u(b, tensor_field(b, b"b", "offset"), "<Q", 1 << 20)) == "hole"
    assert _hostile(tmp_path, lambda b: set_u(b, tensor_field(b, b"b", "dims"), "<Q", 1 << 40)) in (
        "gguf-size-past-eof", "data-short")
    assert _hostile(tmp_path, lambda b: set_u(b, tensor_field(b, b"a", "dims"), "<Q", 33)) == "gguf-bad-shape"
    assert _hostile(tmp_path, lambda b: b + b"\x00" * 64) == "trailing-bytes"


def test_hostile_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 50, 0))
    r = subprocess.run([sys.executable, "-m", "planc", "inspect", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.gguf" in r.stderr


QTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


def _blocks(tmp_path, qtype, rows=2, cols=256):
    from planc.tools.synth_gguf import GGUFTensor, tensor_bytes

    return tensor_bytes(GGUFTensor(f"t.{qtype}", qtype, (rows, cols)))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("out", ["F32", "F16", "BF16"])
def test_host_dequant_bit_exact(tmp_path, qtype, out):
    raw = _blocks(tmp_path, qtype, rows=4)
    ref = gguf.quants.dequantize(raw.reshape(4, -1), T[qtype])
    got = dequantize(raw, qtype, (4, 256), out)
    want = {"F32": ref, "F16": ref.astype(np.float16)}.get(out)
    if want is None:
        import ml_dtypes

        want = ref.astype(ml_dtypes.bfloat16)
    assert got.shape == (4, 256) and got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("qtype", QTYPES)
def test_device_dequant_bit_exact_under_simulator(qtype):
    from numba import cuda

    from planc.base import simulation

    if not simulation.simulated() and not cuda.is_available():
        pytest.skip("no simulator and no GPU")
    from planc.execute.device.seam import default_device
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf
    from planc.tools.synth_gguf import GGUFTensor, tensor_bytes

    raw = tensor_bytes(GGUFTensor(f"k.{qtype}", qtype, (1, 256)))
    ref = gguf.quants.dequantize(raw.reshape(1, -1), T[qtype]).reshape(-1)
    import ml_dtypes

    for out, dt, want in (("F32", np.uint32, ref.view(np.uint32)),
                          ("BF16", np.uint16, ref.astype(ml_dtypes.bfloat16).view(np.uint16)),
                          ("F16", np.uint16, ref.astype(np.float16).view(np.uint16))):
        src = cuda.to_device(raw)
        dst = cuda.to_device(np.zeros(256, dt))
        dequantize_gguf(src, dst, qtype, out, 256, dev=default_device())
        np.testing.assert_array_equal(dst.copy_to_host(), want, err_msg=f"{qtype}->{out}")


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q6_K", "Q4_K", "Q8_0"])
def test_device_dequant_unpermutes_heads_bit_exact(qtype):
    """A q / k weight's kernel (`hd` > 0) writes stored row h*hd + 2i + j to row h*hd + j*hd/2 + i, for the
    four-value kernels (`signatures.QUADS`: a thread's four values share a row) as for the others; rows of
    512 values, two blocks a row for the K-quants, so a thread's block is not its row's first."""
    from numba import cuda

    from planc.base import simulation

    if not simulation.simulated() and not cuda.is_available():
        pytest.skip("no simulator and no GPU")
    from planc.execute.device.seam import default_device
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf
    from planc.manifest.gguf_names import unpermute_rows
    from planc.tools.synth_gguf import GGUFTensor, tensor_bytes

    rows, row, hd = 8, 512, 4  # two heads of four rows
    raw = tensor_bytes(GGUFTensor(f"q.{qtype}", qtype, (rows, row)))
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), T[qtype]).reshape(rows, row)
    want = unpermute_rows(ref, rows // hd).reshape(-1).view(np.uint32)
    dst = cuda.to_device(np.zeros(rows * row, np.uint32))
    dequantize_gguf(cuda.to_device(raw), dst, qtype, "F32", rows * row, dev=default_device(), row=row, hd=hd)
    np.testing.assert_array_equal(dst.copy_to_host(), want, err_msg=qtype)


def test_four_value_kernels_refuse_values_that_are_not_whole_blocks_of_their_rows():
    from planc.execute.device.seam import default_device
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf

    with pytest.raises(ValueError, match="not whole blocks of 256"):
        dequantize_gguf(None, None, "Q2_K", "F32", 384, dev=default_device())
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        dequantize_gguf(None, None, "Q6_K", "F32", 2048, dev=default_device(), row=128, hd=4)


@pytest.mark.parametrize("qtype", QTYPES)
def test_kernel_values_typed_by_numba_match_gguf(qtype):
    """The kernels' per-element (for `QUADS`, four-value) functions compiled by numba's CPU target,
    whose typing is the GPU's: the simulator runs any Python, so code numba cannot type (a device
    function reached through a namespace object) or integer widths it types otherwise pass there and
    fail on the GPU."""
    import numba

    from planc.execute.kernels.gguf_kernels import _value_fns
    from planc.execute.kernels.kernels import _scalar_ops
    from planc.execute.kernels.signatures import QUADS
    from planc.tools.synth_gguf import GGUFTensor, tensor_bytes

    ops = _scalar_ops(numba.njit)
    fn = _value_fns(numba.njit, ops.f16_to_f32, lambda a, b: np.float32(a * b))[qtype]

    size = QUADS.get(qtype, 0)

    @numba.njit
    def run(src, dst):
        if size:  # four values a call: quant byte m of half h of each block
            for t in range(dst.size // 4):
                b, h, m = t // 64, (t % 64) // 32, t % 32
                v = fn(src, b * size, h, m)
                for s in range(4):
                    dst[b * 256 + h * 128 + m + 32 * s] = v[s]
        else:
            for i in range(dst.size):
                dst[i] = fn(src, i)

    raw = tensor_bytes(GGUFTensor(f"n.{qtype}", qtype, (2, 256)))
    ref = gguf.quants.dequantize(raw.reshape(2, -1), T[qtype]).reshape(-1)
    got = np.zeros(512, np.float32)
    run(raw, got)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_cli_synth_inspect_and_compile(tmp_path):
    import json
    import subprocess
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "planc", *a], capture_output=True, text=True)  # noqa: E731
    r = run("synth", str(tmp_path / "q"), "--family", "gguf", "--quant", "Q4_K_M", "--json")
    assert r.returncode == 0, r.stderr
    path = json.loads(r.stdout)["path"]
    d = json.loads(run("inspect", path, "--json").stdout)
    assert d["gguf"]["architecture"] == "llama" and d["gguf"]["context_length"] == "4096"
    assert set(d["by_dtype"]) == {"F32", "Q4_K", "Q6_K"}
    # a plain F16 GGUF compiles like a safetensors file; a quantized one too: its blocks kept (no dtype),
    # or dequantized (a float dtype); a type planc cannot dequantize is refused by name
    r = run("synth", str(tmp_path / "h"), "--family", "gguf", "--quant", "F16", "--json")
    for k, (ckpt, dtype) in enumerate(((json.loads(r.stdout)["path"], None), (path, None), (path, "bfloat16"))):
        spec = tmp_path / f"s{k}.yaml"
        rule = f"  - match: '*'\n" + (f"    dtype: {dtype}\n" if dtype else "")
        spec.write_text(f"checkpoint: {ckpt}\nbudget: {{host: 1GiB}}\nrules:\n{rule}")
        r = run("compile", str(spec), "-o", str(tmp_path / f"p{k}.json"), "--json")
        assert r.returncode == 0, r.stderr


def _read(path, r):
    with open(path, "rb") as f:
        parts = []
        for k in range(r.count):
            f.seek(r.start + k * r.stride)
            parts.append(f.read(r.seg))
    return np.frombuffer(b"".join(parts), np.uint8)


@pytest.mark.parametrize("name,dim,world", [("blk.0.ffn_gate.weight", 0, 4), ("blk.0.attn_k.weight", 0, 2),
                                            ("blk.0.ffn_down.weight", 1, 2), ("blk.0.ffn_down.weight", 0, 2)])
def test_rank_slices_of_quantized_tensors_are_whole_blocks(tmp_path, name, dim, world):
    """A rank's rows (or whole-block columns) of a Q4_K / Q6_K tensor, read from the file by the
    ranges `planc.compiler.split` computes, dequantize to that rank's slice of the whole tensor."""
    from planc.compiler.split import Slice, rank_range, ranged

    res = write_gguf(tmp_path, quant="Q4_K_M", layers=1)
    t = {x.name: x for x in read_manifest(res.path).tensors}[name]
    whole = dequantize(_read(res.path, ranged(t.start, t.shape, t.dtype, None)), t.dtype, t.shape)
    for rank in range(world):
        a, b, _ = rank_range(t.shape[dim], world, rank, False, name, dim)
        r = ranged(t.start, t.shape, t.dtype, Slice(dim, a, b))
        got = dequantize(_read(res.path, r), t.dtype, r.shape)
        want = whole[a:b] if dim == 0 else whole[:, a:b]
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, dim, rank)


def test_a_split_cutting_a_quantization_block_is_refused_with_the_reason(tmp_path):
    from planc.base.errors import BindError
    from planc.compiler.split import Slice, ranged

    res = write_gguf(tmp_path, quant="Q4_K_M", layers=1)
    t = {x.name: x for x in read_manifest(res.path).tensors}["blk.0.ffn_down.weight"]  # Q6_K [256, 512]
    with pytest.raises(BindError) as e:
        ranged(t.start, t.shape, t.dtype, Slice(1, 128, 256))  # 4 ranks: 128 columns each, half a block
    assert e.value.code == "split-gguf-block"
    assert "Q6_K block (256 elements" in str(e.value) and "divides 2" in str(e.value)

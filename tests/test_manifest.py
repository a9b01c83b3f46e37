"""The strict safetensors manifest reader: real checkpoints, literal-byte failures, fuzzing."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from planc.base.dtypes import DTYPES
from planc.base.errors import ManifestError
from planc.manifest import Manifest, ShardInfo, TensorEntry, read_manifest
from planc.manifest.safetensors import HEADER_CAP


def raw(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file as bytes: u64 LE header length, header, data."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def ent(dtype: str, shape, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def expect(path, code: str, *names: str) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        read_manifest(path)
    err = info.value
    assert type(err) is ManifestError
    assert err.code == code, str(err)
    for name in names:
        assert name in str(err), (name, str(err))
    return err


def check_layout(m: Manifest) -> None:
    """Invariants of every manifest the reader returns."""
    assert [s.path for s in m.shards] == sorted(s.path for s in m.shards)
    assert list(m.tensors) == sorted(m.tensors, key=lambda t: ([s.path for s in m.shards].index(t.file), t.start))
    shards = {s.path: s for s in m.shards}
    for s in m.shards:
        assert s.data_start == 8 + s.header_bytes
        ts = [t for t in m.tensors if t.file == s.path]
        cursor = s.data_start
        for t in ts:
            assert t.start == cursor
            assert t.nbytes == DTYPES[t.dtype].nbytes(t.numel)
            cursor = t.end
        assert cursor == s.size_bytes
    assert all(t.file in shards for t in m.tensors)
    assert len({t.name for t in m.tensors}) == len(m.tensors)


# --------------------------------------------------------------------------- good checkpoints


def test_single_file_from_save_file(tmp_path):
    arrays = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.zeros(5, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float16),
        "flag": np.array([True, False]),
    }
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "np", "a": "b"})

    m = read_manifest(path)
    assert m.root == str(tmp_path)
    assert m.source == str(path)
    assert len(m.shards) == 1
    shard = m.shards[0]
    st_ = os.stat(path)
    assert shard == ShardInfo(
        path="model.safetensors",
        size_bytes=st_.st_size,
        mtime_ns=st_.st_mtime_ns,
        header_bytes=shard.header_bytes,
        data_start=8 + shard.header_bytes,
        metadata=(("a", "b"), ("format", "np")),
    )
    assert {t.name for t in m.tensors} == set(arrays)
    blob = path.read_bytes()
    for name, arr in arrays.items():
        t = m.tensor(name)
        assert t.shape == arr.shape
        assert t.nbytes == arr.nbytes
        assert blob[t.start : t.end] == arr.tobytes()
    assert m.total_bytes == sum(a.nbytes for a in arrays.values())
    check_layout(m)


def test_str_path_and_symlinked_file(tmp_path):
    save_file({"x": np.ones(3, np.uint8)}, str(tmp_path / "real.safetensors"))
    (tmp_path / "link.safetensors").symlink_to("real.safetensors")
    m = read_manifest(str(tmp_path / "link.safetensors"))
    assert m.shards[0].path == "link.safetensors"
    assert m.tensor("x").nbytes == 3


def test_tensors_sorted_by_offset_not_header_order(tmp_path):
    header = {
        "z": ent("U8", [4], 0, 4),
        "__metadata__": {"k": "v"},
        "a": ent("U8", [2, 2], 4, 8),
        "m": ent("F32", [], 8, 12),
    }
    p = write(tmp_path / "t.safetensors", raw(header, bytes(12)))
    m = read_manifest(p)
    assert [t.name for t in m.tensors] == ["z", "a", "m"]
    h = len(json.dumps(header).encode())
    assert [t.start for t in m.tensors] == [8 + h, 12 + h, 16 + h]
    assert m.tensor("m").shape == ()
    assert m.shards[0].metadata == (("k", "v"),)


def test_zero_size_tensors_and_padding(tmp_path):
    header = {
        "first": ent("F32", [0], 0, 0),
        "mid": ent("U8", [2], 0, 2),
        "alsomid": ent("BF16", [3, 0], 2, 2),
        "last": ent("I64", [0, 7], 2, 2),
    }
    h = json.dumps(header).encode() + b"     "  # space padding after the object is valid
    p = write(tmp_path / "z.safetensors", raw(h, b"ab"))
    m = read_manifest(p)
    assert [t.name for t in m.tensors] == ["first", "mid", "alsomid", "last"]
    assert [t.nbytes for t in m.tensors] == [0, 2, 0, 0]
    check_layout(m)


def test_header_only_file_with_no_tensors(tmp_path):
    p = write(tmp_path / "none.safetensors", raw(b"{}"))
    m = read_manifest(p)
    assert m.tensors == () and m.shards[0].size_bytes == 10


def test_sub_byte_dtypes(tmp_path):
    header = {"f4": ent("F4", [2, 3], 0, 3), "f6": ent("F6_E2M3", [4], 3, 6)}
    m = read_manifest(write(tmp_path / "s.safetensors", raw(header, bytes(6))))
    assert [t.nbytes for t in m.tensors] == [3, 3]


def test_folder_of_shards(tmp_path):
    save_file({"b.w": np.ones((2, 2), np.float32)}, str(tmp_path / "b.safetensors"))
    save_file({"a.w": np.ones(3, np.float16), "a.b": np.ones(1, np.int8)}, str(tmp_path / "a.safetensors"))
    (tmp_path / "sub").mkdir()
    save_file({"deep": np.ones(1, np.int8)}, str(tmp_path / "sub" / "c.safetensors"))
    write(tmp_path / ".hidden.safetensors", b"junk")  # dotfiles are skipped like a shell glob
    write(tmp_path / "notes.txt", b"hello")
    m = read_manifest(tmp_path)
    assert m.root == str(tmp_path) and m.source == str(tmp_path)
    assert [s.path for s in m.shards] == ["a.safetensors", "b.safetensors"]
    assert [t.file for t in m.tensors] == ["a.safetensors", "a.safetensors", "b.safetensors"]
    assert not m.has("deep")
    check_layout(m)


def _hf_checkpoint(folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"embed": np.zeros((4, 2), np.float32), "l0.w": np.ones(3, np.float16)},
              str(folder / "model-00001-of-00002.safetensors"))
    save_file({"l1.w": np.ones(5, np.int8), "head": np.zeros(2, np.float64)},
              str(folder / "model-00002-of-00002.safetensors"))
    index = {
        "metadata": {"total_size": 32 + 6 + 5 + 16},
        "weight_map": {
            "embed": "model-00001-of-00002.safetensors",
            "l0.w": "./model-00001-of-00002.safetensors",
            "l1.w": "model-00002-of-00002.safetensors",
            "head": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def test_index_file_and_folder_with_index(tmp_path):
    _hf_checkpoint(tmp_path)
    # A stray consolidated file next to the index is not part of the indexed checkpoint.
    save_file({"embed": np.zeros(1, np.int8)}, str(tmp_path / "consolidated.safetensors"))
    by_index = read_manifest(tmp_path / "model.safetensors.index.json")
    by_folder = read_manifest(tmp_path)
    assert by_index.tensors == by_folder.tensors
    assert by_index.shards == by_folder.shards
    assert by_index.source.endswith("model.safetensors.index.json")
    assert by_folder.source == str(tmp_path)
    assert by_index.root == str(tmp_path)
    assert [s.path for s in by_index.shards] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert by_index.total_bytes == 59
    check_layout(by_index)


def test_index_with_shards_in_subfolder_and_symlink_inside(tmp_path):
    (tmp_path / "sub").mkdir()
    save_file({"a": np.ones(2, np.int8)}, str(tmp_path / "sub" / "a.safetensors"))
    save_file({"b": np.ones(2, np.int8)}, str(tmp_path / "real.safetensors"))
    (tmp_path / "alias.safetensors").symlink_to(tmp_path / "real.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "sub/a.safetensors", "b": "alias.safetensors"}})
    )
    m = read_manifest(tmp_path / "m.safetensors.index.json")
    assert [s.path for s in m.shards] == ["alias.safetensors", "sub/a.safetensors"]


def test_fingerprint_tracks_stat(tmp_path):
    p = tmp_path / "f.safetensors"
    save_file({"x": np.ones(4, np.float32)}, str(p))
    os.utime(p, ns=(1_000_000_000_123, 2_000_000_000_456))
    s = read_manifest(p).shards[0]
    assert s.mtime_ns == 2_000_000_000_456 == os.stat(p).st_mtime_ns
    assert s.size_bytes == os.path.getsize(p)


# --------------------------------------------------------------------------- sparse files


def test_sparse_file_of_hundreds_of_gb_reads_headers_only(tmp_path):
    big = 300 * 2**30
    header = {"huge": ent("BF16", [big // 2], 0, big), "tail": ent("U8", [8], big, big + 8)}
    h = json.dumps(header).encode()
    p = tmp_path / "sparse.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + big + 8)
    t0 = time.perf_counter()
    m = read_manifest(p)
    assert time.perf_counter() - t0 < 1.0
    assert m.total_bytes == big + 8
    assert m.tensor("tail").start == 8 + len(h) + big
    assert os.stat(p).st_blocks * 512 < 1 << 20  # still a hole: nothing was written

    with open(p, "r+b") as f:
        f.truncate(8 + len(h) + big + 7)
    expect(p, "data-short", "sparse.safetensors", "1 bytes short")


def _sparse_shard(path: Path, names: list[str], per: int) -> None:
    header = {}
    off = 0
    for n in names:
        header[n] = {"dtype": "F16", "shape": [per // 2048, 1024], "data_offsets": [off, off + per]}
        off += per
    h = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)


def test_twenty_thousand_tensor_sparse_checkpoint(tmp_path):
    shards, per_shard, per = 5, 4000, 4 * 2**20
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"layers.{s}.{i}.weight" for i in range(per_shard)]
        _sparse_shard(tmp_path / fname, names, per)
        weight_map.update(dict.fromkeys(names, fname))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    t0 = time.perf_counter()
    m = read_manifest(tmp_path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, elapsed
    assert len(m.shards) == shards
    assert len(m.tensors) == shards * per_shard
    assert m.total_bytes == shards * per_shard * per
    assert m.tensor("layers.3.17.weight").shape == (2048, 1024)
    assert sum(s.size_bytes - s.data_start for s in m.shards) == m.total_bytes


# --------------------------------------------------------------------------- one file, literal bytes

BAD_FILES = [
    ("empty", b"", "empty"),
    ("seven", b"\x02\x00\x00\x00\x00\x00\x00", "short-file"),
    ("cap-plus-one", struct.pack("<Q", HEADER_CAP + 1) + b"{}", "header-too-large"),
    ("u64-max", b"\xff" * 8 + b"{}", "header-too-large"),
    ("at-cap-past-eof", struct.pack("<Q", HEADER_CAP) + b"{}", "header-past-eof"),
    ("past-eof", raw(b"{}", length=3), "header-past-eof"),
    ("prefix-only", struct.pack("<Q", 1), "header-past-eof"),
    ("not-utf8", raw(b'{"\xff\xfe": 1}'), "header-not-utf8"),
    ("truncated-json", raw(b'{"a":'), "header-not-json"),
    ("zero-length-header", raw(b""), "header-not-json"),
    ("nan", raw(b'{"a": NaN}'), "header-not-json"),
    ("garbage-after", raw(b"{} x"), "header-not-json"),
    ("bom", raw(b"\xef\xbb\xbf{}"), "header-not-json"),
    ("deep", raw(b"[" * 200_000 + b"]" * 200_000), "header-not-json"),
    ("huge-int", raw(b'{"a": ' + b"9" * 5000 + b"}"), "header-not-json"),
    ("array", raw(b"[]"), "header-not-object"),
    ("string", raw(b'"x"'), "header-not-object"),
    ("null", raw(b"null"), "header-not-object"),
    (
        "dup-key",
        raw(b'{"a": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}, '
            b'"a": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}}', b"x"),
        "header-duplicate-key",
    ),
    ("meta-str", raw({"__metadata__": "x"}), "bad-metadata"),
    ("meta-null", raw({"__metadata__": None}), "bad-metadata"),
    ("meta-int-value", raw({"__metadata__": {"k": 1}}), "bad-metadata"),
    ("meta-nested", raw({"__metadata__": {"k": {"a": "b"}}}), "bad-metadata"),
    ("entry-int", raw({"t": 1}), "bad-entry"),
    ("entry-list", raw({"t": ["U8", [1], [0, 1]]}, b"x"), "bad-entry"),
    ("entry-missing-key", raw({"t": {"dtype": "U8", "shape": [1]}}, b"x"), "bad-entry"),
    ("entry-extra-key", raw({"t": {**ent("U8", [1], 0, 1), "x": 1}}, b"x"), "bad-entry"),
    ("dtype-not-str", raw({"t": ent(8, [1], 0, 1)}, b"x"), "bad-entry"),
    ("dtype-unknown", raw({"t": ent("F128", [1], 0, 16)}, bytes(16)), "unknown-dtype"),
    ("dtype-lowercase", raw({"t": ent("f32", [1], 0, 4)}, bytes(4)), "unknown-dtype"),
    ("shape-str", raw({"t": ent("U8", "1", 0, 1)}, b"x"), "bad-shape"),
    ("shape-negative", raw({"t": ent("U8", [-1], 0, 1)}, b"x"), "bad-shape"),
    ("shape-bool", raw({"t": ent("U8", [True], 0, 1)}, b"x"), "bad-shape"),
    ("shape-float", raw({"t": ent("U8", [1.0], 0, 1)}, b"x"), "bad-shape"),
    ("shape-null", raw({"t": ent("U8", None, 0, 1)}, b"x"), "bad-shape"),
    ("offsets-one", raw({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"x"), "bad-offsets"),
    ("offsets-three", raw({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 1]}}, b"x"),
     "bad-offsets"),
    ("offsets-negative", raw({"t": ent("U8", [1], -1, 0)}, b"x"), "bad-offsets"),
    ("offsets-bool", raw({"t": ent("U8", [1], False, True)}, b"x"), "bad-offsets"),
    ("offsets-float", raw({"t": ent("U8", [1], 0, 1.0)}, b"x"), "bad-offsets"),
    ("offsets-reversed", raw({"t": ent("U8", [0], 4, 0)}, bytes(4)), "bad-offsets"),
    ("offsets-object", raw({"t": {"dtype": "U8", "shape": [1], "data_offsets": {"0": 1}}}, b"x"),
     "bad-offsets"),
    ("f4-odd", raw({"t": ent("F4", [3], 0, 2)}, bytes(2)), "partial-byte"),
    ("f6-one", raw({"t": ent("F6_E3M2", [1], 0, 1)}, bytes(1)), "partial-byte"),
    ("size-small", raw({"t": ent("F32", [2], 0, 4)}, bytes(4)), "size-mismatch"),
    ("size-large", raw({"t": ent("F32", [2], 0, 12)}, bytes(12)), "size-mismatch"),
    ("size-huge-shape", raw({"t": ent("U8", [10**30, 10**30, 10**30], 0, 1)}, b"x"), "size-mismatch"),
    ("size-many-dims", raw({"t": ent("U8", [2] * 5000, 0, 1)}, b"x"), "size-mismatch"),
    (
        "overlap",
        raw({"a": ent("U8", [4], 0, 4), "b": ent("U8", [4], 2, 6)}, bytes(6)),
        "overlap",
    ),
    (
        "overlap-same-span",
        raw({"a": ent("U8", [4], 0, 4), "b": ent("U8", [4], 0, 4)}, bytes(4)),
        "overlap",
    ),
    (
        "zero-size-inside",
        raw({"a": ent("U8", [4], 0, 4), "b": ent("U8", [0], 2, 2)}, bytes(4)),
        "overlap",
    ),
    ("hole-at-start", raw({"a": ent("U8", [4], 4, 8)}, bytes(8)), "hole"),
    (
        "hole-between",
        raw({"a": ent("U8", [4], 0, 4), "b": ent("U8", [4], 6, 10)}, bytes(10)),
        "hole",
    ),
    ("data-short", raw({"a": ent("U8", [8], 0, 8)}, bytes(4)), "data-short"),
    ("data-none", raw({"a": ent("U8", [8], 0, 8)}), "data-short"),
    ("trailing", raw({"a": ent("U8", [4], 0, 4)}, bytes(8)), "trailing-bytes"),
    ("trailing-no-tensors", raw({}, b"x"), "trailing-bytes"),
]


@pytest.mark.parametrize("content,code", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_file(tmp_path, content, code):
    name = f"bad_{code}.safetensors"
    p = write(tmp_path / name, content)
    expect(p, code, name)
    # The same file found through a folder fails the same way.
    expect(tmp_path, code, name)


def test_messages_name_tensor_and_figures(tmp_path):
    p = write(tmp_path / "m.safetensors", raw({"w.q": ent("F32", [3, 5], 0, 56)}, bytes(56)))
    err = expect(p, "size-mismatch", "m.safetensors", "'w.q'", "60", "56", "[3, 5]")
    assert str(err).endswith("[size-mismatch]")

    p = write(tmp_path / "h.safetensors", raw({"a": ent("U8", [2], 0, 2), "b": ent("U8", [1], 5, 6)},
                                              bytes(6)))
    expect(p, "hole", "h.safetensors", "'b'", "'a'", "3 bytes")

    p = write(tmp_path / "cap.safetensors", struct.pack("<Q", 123_456_789_012) + b"{}")
    expect(p, "header-too-large", "cap.safetensors", "123456789012", str(HEADER_CAP))

    p = write(tmp_path / "eof.safetensors", raw(b"{}", length=40))
    expect(p, "header-past-eof", "eof.safetensors", "40", "10 bytes")

    p = write(tmp_path / "d.safetensors", raw({"x": ent("BF16", [2], 0, 4)}, bytes(9)))
    expect(p, "trailing-bytes", "d.safetensors", "5 trailing bytes")


# --------------------------------------------------------------------------- paths


def test_missing_path(tmp_path):
    expect(tmp_path / "nope.safetensors", "missing", "nope.safetensors")
    expect(tmp_path / "nope.safetensors.index.json", "missing", "nope.safetensors.index.json")
    write(tmp_path / "file", b"x")
    expect(tmp_path / "file" / "below.safetensors", "missing", "below.safetensors")


def test_unusable_path(tmp_path):
    expect(str(tmp_path / "nul\x00.safetensors"), "bad-path", "nul")
    with pytest.raises(ManifestError) as info:
        read_manifest(None)
    assert info.value.code == "bad-path"


def test_broken_symlink(tmp_path):
    (tmp_path / "dead.safetensors").symlink_to(tmp_path / "gone.safetensors")
    err = expect(tmp_path / "dead.safetensors", "missing", "dead.safetensors")
    assert "broken symlink" in str(err)
    expect(tmp_path, "missing", "dead.safetensors")


def test_symlink_loops(tmp_path):
    (tmp_path / "a.safetensors").symlink_to("b.safetensors")
    (tmp_path / "b.safetensors").symlink_to("a.safetensors")
    expect(tmp_path / "a.safetensors", "symlink-loop", "a.safetensors")
    expect(tmp_path, "symlink-loop", "a.safetensors")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "s.safetensors").symlink_to("s.safetensors")
    expect(tmp_path / "self", "symlink-loop", "s.safetensors")


def test_not_a_regular_file(tmp_path):
    (tmp_path / "d.safetensors").mkdir()
    expect(tmp_path, "not-a-file", "d.safetensors")
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "pipe.safetensors")
    expect(fifo_dir / "pipe.safetensors", "not-a-file", "pipe.safetensors")
    expect(fifo_dir, "not-a-file", "pipe.safetensors")


def test_folder_without_shards(tmp_path):
    expect(tmp_path, "no-shards", str(tmp_path))
    write(tmp_path / "model.bin", b"x")
    write(tmp_path / "sub" / "x.safetensors", raw({}))
    expect(tmp_path, "no-shards", str(tmp_path))


def test_folder_duplicate_tensor(tmp_path):
    save_file({"x": np.ones(1, np.int8), "y": np.ones(1, np.int8)}, str(tmp_path / "a.safetensors"))
    save_file({"x": np.ones(2, np.int8)}, str(tmp_path / "b.safetensors"))
    expect(tmp_path, "duplicate-tensor", "'x'", "a.safetensors", "b.safetensors")


def test_folder_with_two_indexes(tmp_path):
    _hf_checkpoint(tmp_path)
    (tmp_path / "other.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    expect(tmp_path, "index-ambiguous", "other.safetensors.index.json", "model.safetensors.index.json")


# --------------------------------------------------------------------------- indexes


def _index(folder: Path, doc, name: str = "model.safetensors.index.json") -> Path:
    p = folder / name
    p.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return p


@pytest.mark.parametrize(
    "doc",
    [
        b"{",
        b"\xff{}",
        b'{"weight_map": {"a": NaN}}',
        b"[]",
        b'"weight_map"',
        b"{}",
        b'{"weight_map": []}',
        b'{"weight_map": {"a": 1}}',
        b'{"weight_map": {"a": null}}',
        b'{"weight_map": {"a": ""}}',
        b'{"weight_map": {"a": "."}}',
        b'{"weight_map": {"a": "x\\u0000.safetensors"}}',
        b'{"metadata": [], "weight_map": {"a": "x.safetensors"}}',
    ],
    ids=["truncated", "not-utf8", "nan", "array", "string", "no-weight-map", "map-list",
         "shard-int", "shard-null", "shard-empty", "shard-dot", "shard-nul", "metadata-list"],
)
def test_index_bad(tmp_path, doc):
    p = _index(tmp_path, doc)
    expect(p, "index-bad", "model.safetensors.index.json")
    expect(tmp_path, "index-bad", "model.safetensors.index.json")


def test_index_duplicate_key(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s.safetensors"))
    p = _index(tmp_path, b'{"weight_map": {"a": "s.safetensors", "a": "s.safetensors"}}')
    expect(p, "index-duplicate", "model.safetensors.index.json", "'a'")


def test_index_empty_weight_map(tmp_path):
    p = _index(tmp_path, {"metadata": {}, "weight_map": {}})
    expect(p, "no-shards", "model.safetensors.index.json")


def test_index_missing_shard(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    expect(p, "index-missing-shard", "model.safetensors.index.json", "s2.safetensors")
    (tmp_path / "s2.safetensors").symlink_to("nowhere.safetensors")
    expect(p, "index-missing-shard", "s2.safetensors")


def test_index_tensor_missing_from_shard(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})
    expect(p, "index-tensor-missing", "model.safetensors.index.json", "'ghost'", "s1.safetensors")


def test_index_unlisted_tensor(tmp_path):
    save_file({"a": np.ones(1, np.int8), "extra": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors"}})
    expect(p, "index-mismatch", "model.safetensors.index.json", "'extra'", "s1.safetensors")


def test_index_tensor_in_wrong_shard(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    save_file({"b": np.ones(1, np.int8)}, str(tmp_path / "s2.safetensors"))
    p = _index(tmp_path, {"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors"}})
    err = expect(p, "index-mismatch", "'a'", "s1.safetensors", "s2.safetensors")
    assert "indexed to" in str(err)
    # A shard the index never names is not read; its tensor is simply missing where indexed.
    p = _index(tmp_path, {"weight_map": {"a": "s2.safetensors", "b": "s2.safetensors"}})
    expect(p, "index-tensor-missing", "'a'", "s2.safetensors")


def test_index_tensor_in_two_shards(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    save_file({"a": np.ones(1, np.int8), "b": np.ones(1, np.int8)}, str(tmp_path / "s2.safetensors"))
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    expect(p, "duplicate-tensor", "'a'", "s1.safetensors", "s2.safetensors")


def test_index_bad_shard_file(tmp_path):
    write(tmp_path / "s1.safetensors", raw({"a": ent("U8", [2], 0, 2)}, b"x"))
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors"}})
    expect(p, "data-short", "s1.safetensors")


def test_index_path_escape(tmp_path):
    inside = tmp_path / "ckpt"
    inside.mkdir()
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "outside.safetensors"))
    save_file({"a": np.ones(1, np.int8)}, str(inside / "ok.safetensors"))

    for target in ["../outside.safetensors", "sub/../../outside.safetensors", "./../outside.safetensors",
                   "..\\outside.safetensors", "sub\\..\\..\\outside.safetensors",
                   str(tmp_path / "outside.safetensors"), "/etc/passwd", "\\etc\\passwd"]:
        p = _index(inside, {"weight_map": {"a": target}})
        expect(p, "path-escape", "model.safetensors.index.json", target.replace("\\", "\\\\"))
        expect(inside, "path-escape", "model.safetensors.index.json")

    # '..' that normalises away stays inside; the shard is recorded by its normalised name.
    for target in ["sub/../ok.safetensors", "./ok.safetensors", "a/b/../../ok.safetensors"]:
        _index(inside, {"weight_map": {"a": target}})
        m = read_manifest(inside)
        assert [s.path for s in m.shards] == ["ok.safetensors"] and m.has("a")

    # A symlinked checkpoint folder is fine: names are judged against the index's folder.
    _index(inside, {"weight_map": {"a": "ok.safetensors"}})
    (tmp_path / "ckpt-link").symlink_to(inside, target_is_directory=True)
    m = read_manifest(tmp_path / "ckpt-link")
    assert m.root == str(tmp_path / "ckpt-link") and m.has("a")


def test_index_names_symlinks_pointing_anywhere(tmp_path):
    """The check is lexical: a name inside the folder may be a symlink to a file (or through a
    folder) elsewhere, and the file it resolves to is read under the name the index gives."""
    inside = tmp_path / "ckpt"
    inside.mkdir()
    save_file({"a": np.ones(3, np.int8)}, str(tmp_path / "outside.safetensors"))
    (inside / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    p = _index(inside, {"weight_map": {"a": "link.safetensors"}})
    m = read_manifest(p)
    assert [s.path for s in m.shards] == ["link.safetensors"] and m.tensor("a").nbytes == 3
    assert m.shards[0].size_bytes == os.path.getsize(tmp_path / "outside.safetensors")

    (inside / "link.safetensors").unlink()
    (inside / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    p = _index(inside, {"weight_map": {"a": "dirlink/outside.safetensors"}})
    assert [s.path for s in read_manifest(p).shards] == ["dirlink/outside.safetensors"]
    assert read_manifest(inside).tensors == read_manifest(p).tensors


def test_index_symlinked_shard_loops_and_dangling(tmp_path):
    save_file({"a": np.ones(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    (tmp_path / "s2.safetensors").symlink_to("s3.safetensors")
    (tmp_path / "s3.safetensors").symlink_to("s2.safetensors")
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    expect(p, "symlink-loop", "s2.safetensors")
    (tmp_path / "loopdir").symlink_to("loopdir")
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "b": "loopdir/x.safetensors"}})
    expect(p, "symlink-loop", "loopdir")
    (tmp_path / "blob").symlink_to(tmp_path / "blobs" / "gone")
    p = _index(tmp_path, {"weight_map": {"a": "s1.safetensors", "b": "blob"}})
    expect(p, "index-missing-shard", "'blob'")


def _hf_cache(cache: Path, tensors: dict[str, dict[str, np.ndarray]], *, index: bool = True) -> Path:
    """A Hugging Face hub cache entry: every file of snapshots/<rev>/ links to ../../blobs/<sha>."""
    import hashlib

    repo = cache / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")

    def put(name: str, path: Path) -> None:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        path.rename(blobs / sha)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / sha)

    weight_map = {}
    for name, arrays in tensors.items():
        save_file(arrays, str(repo / "tmp"))
        put(name, repo / "tmp")
        weight_map.update({t: name for t in arrays})
    if index:
        (repo / "tmp").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        put("model.safetensors.index.json", repo / "tmp")
    return snap


def test_hugging_face_cache_snapshot(tmp_path):
    shards = {
        "model-00001-of-00002.safetensors": {"embed": np.arange(12, dtype=np.float32).reshape(3, 4)},
        "model-00002-of-00002.safetensors": {"head": np.ones((2, 4), np.float16),
                                             "norm": np.ones(4, np.float32)},
    }
    snap = _hf_cache(tmp_path, shards)
    for f in snap.iterdir():
        assert f.is_symlink() and os.readlink(f).startswith("../../blobs/")
    by_folder = read_manifest(snap)
    by_index = read_manifest(snap / "model.safetensors.index.json")
    assert by_folder.tensors == by_index.tensors and by_folder.shards == by_index.shards
    assert by_index.root == str(snap)
    assert [s.path for s in by_index.shards] == sorted(shards)
    assert {t.name: (t.dtype, t.shape, t.file) for t in by_index.tensors} == {
        "embed": ("F32", (3, 4), "model-00001-of-00002.safetensors"),
        "head": ("F16", (2, 4), "model-00002-of-00002.safetensors"),
        "norm": ("F32", (4,), "model-00002-of-00002.safetensors"),
    }
    for s in by_index.shards:  # the fingerprint is the blob's, reached through the link
        blob = os.stat(snap / s.path)
        assert (s.size_bytes, s.mtime_ns) == (blob.st_size, blob.st_mtime_ns)
    # The bytes at each tensor's offsets are the tensor's, read through the symlink.
    t = by_index.tensor("embed")
    with open(snap / t.file, "rb") as f:
        f.seek(t.start)
        assert f.read(t.nbytes) == shards[t.file]["embed"].tobytes()
    check_layout(by_index)

    # A single-file snapshot (no index) reads the same way.
    single = _hf_cache(tmp_path / "one", {"model.safetensors": {"w": np.ones(5, np.int8)}}, index=False)
    m = read_manifest(single)
    assert [s.path for s in m.shards] == ["model.safetensors"] and m.tensor("w").nbytes == 5
    assert read_manifest(single / "model.safetensors").tensors == m.tensors


# --------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
dims = st.integers(-2, 9) | st.booleans() | st.just(1.0)
entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([*DTYPES, "F128", "", 3]),
        "shape": st.lists(dims, max_size=4) | json_values,
        "data_offsets": st.lists(st.integers(-2, 80) | st.booleans(), min_size=0, max_size=3) | json_values,
    },
    optional={"extra": json_values},
)
headers = st.dictionaries(
    st.text(max_size=6),
    entries | json_values,
    max_size=6,
).flatmap(
    lambda h: st.one_of(
        st.just(h),
        st.dictionaries(st.text(max_size=4), st.text(max_size=4) | json_values, max_size=3).map(
            lambda m: {**h, "__metadata__": m}
        ),
    )
)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fuzz_file(folder: Path, content: bytes) -> Path:
    return write(folder / "fuzz.safetensors", content)


def _read_or_manifest_error(path: Path) -> None:
    try:
        m = read_manifest(path)
    except ManifestError as err:
        assert err.code and err.code != "manifest"
        assert "fuzz.safetensors" in str(err)
        return
    check_layout(m)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=st.binary(max_size=64) | st.builds(lambda n, b: struct.pack("<Q", n) + b,
                                                  st.integers(0, 2**64 - 1) | st.integers(0, 64),
                                                  st.binary(max_size=64)))
def test_fuzz_arbitrary_bytes(fuzz_dir, content):
    _read_or_manifest_error(_fuzz_file(fuzz_dir, content))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=st.one_of(headers, headers, json_values), data_len=st.integers(0, 96), pad=st.sampled_from([b"", b"  ", b"\n"]))
def test_fuzz_json_headers(fuzz_dir, header, data_len, pad):
    content = raw(json.dumps(header).encode() + pad, bytes(data_len))
    _read_or_manifest_error(_fuzz_file(fuzz_dir, content))


@st.composite
def near_valid(draw):
    """A valid layout, then at most one small perturbation of a figure."""
    n = draw(st.integers(0, 6))
    header, off = {}, 0
    for i in range(n):
        dt = draw(st.sampled_from(sorted(DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = DTYPES[dt].nbytes(numel)
        if nbytes is None:  # packed sub-byte type: four more elements make whole bytes
            shape = [*shape, 4]
            nbytes = DTYPES[dt].nbytes(numel * 4)
        header[f"t{i}"] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    data_len = off
    kind = draw(st.sampled_from(["none", "begin", "end", "shift", "data", "shape"]))
    if header and kind != "none":
        victim = header[draw(st.sampled_from(sorted(header)))]
        delta = draw(st.sampled_from([-1, 1, 2]))
        if kind == "begin":
            victim["data_offsets"][0] += delta
        elif kind == "end":
            victim["data_offsets"][1] += delta
        elif kind == "shift":
            victim["data_offsets"] = [x + delta for x in victim["data_offsets"]]
        elif kind == "shape":
            victim["shape"] = [*victim["shape"], 2]
    if kind == "data":
        data_len = max(0, data_len + draw(st.sampled_from([-1, 1])))
    order = draw(st.permutations(list(header.items())))
    return dict(order), data_len, kind


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=near_valid())
def test_fuzz_near_valid_layouts(fuzz_dir, case):
    header, data_len, kind = case
    path = _fuzz_file(fuzz_dir, raw(header, bytes(data_len)))
    if kind == "none":
        m = read_manifest(path)
        check_layout(m)
        assert len(m.tensors) == len(header)
    else:
        _read_or_manifest_error(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"weight_map": st.dictionaries(
                st.text(max_size=4),
                st.sampled_from(["fuzz.safetensors", "./fuzz.safetensors", "other.safetensors",
                                 "..", "/", "sub/../x", "\\x", "."]) | json_values,
                max_size=4,
            )},
            optional={"metadata": json_values},
        ),
    )
)
def test_fuzz_index(fuzz_dir, doc):
    _fuzz_file(fuzz_dir, raw({"a": ent("U8", [1], 0, 1)}, b"x"))
    p = fuzz_dir / "fuzz.safetensors.index.json"
    p.write_text(json.dumps(doc))
    try:
        m = read_manifest(p)
    except ManifestError as err:
        assert err.code and err.code != "manifest"
        assert "fuzz.safetensors" in str(err)
        return
    check_layout(m)
    assert [t.name for t in m.tensors] == ["a"]


def test_public_api():
    import planc.manifest as pm

    assert set(pm.__all__) == {"read_manifest", "Manifest", "ShardInfo", "TensorEntry"}
    assert pm.TensorEntry is TensorEntry


def test_a_sub_byte_tensor_does_not_transpose(tmp_path):
    """Packed F4 elements have no byte of their own to move: the compile says so, naming the tensor."""
    import yaml

    from planc.compiler.compile import compile_spec
    from planc.base.errors import BindError

    write(tmp_path / "m.safetensors", raw({"f4": ent("F4", [2, 4], 0, 4)}, bytes(4)))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                                    "rules": [{"match": "f4", "transpose": True}]}))
    with pytest.raises(BindError) as ei:
        compile_spec(spec)
    assert ei.value.code == "bad-transpose" and "f4" in ei.value.message and "F4" in ei.value.message

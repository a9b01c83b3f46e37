"""Hostile and careless GGUF checkpoints (written with the gguf package): head counts of another type,
split sets whose names and split keys disagree, a folder of GGUF files. Each is one typed error line
(exit 2), never a traceback and never a part of a model loaded as if whole."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import write_spec  # noqa: E402
from execute_support import cli_run, one_line  # noqa: E402
from planc.base.errors import BindError, ManifestError  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402

QK = (("blk.0.attn_q.weight", (8, 32)), ("blk.0.attn_k.weight", (4, 32)))
UNPERMUTE = [{"match": "blk.{L}.attn_q.weight", "unpermute": True},
             {"match": "blk.{L}.attn_k.weight", "unpermute": True}, {"match": "*"}]


def _write(path, meta=(), tensors=QK, split=None):
    w = gguf.GGUFWriter(str(path), "llama")
    for kind, key, value in meta:
        getattr(w, "add_" + kind)(key, value)
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
    for name, shape in tensors:
        w.add_tensor(name, np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _spec(folder, ckpt, rules=UNPERMUTE):
    return write_spec(folder, {"checkpoint": str(ckpt), "budget": {"host": "64MiB"},
                               "io": {"slot": "64KiB", "slots": 4}, "rules": rules})


@pytest.mark.parametrize("kind,value", [("float32", 2.5), ("float32", 2.0), ("string", "two"), ("array", [2, 2]),
                                        ("bool", True), ("float32", float("nan"))])
def test_a_head_count_that_is_not_an_integer_is_bad_unpermute(tmp_path, capsys, kind, value):
    ck = _write(tmp_path / "m.gguf", [(kind, "llama.attention.head_count", value)])
    spec = _spec(tmp_path, ck)
    with pytest.raises(BindError) as e:
        compile_spec(spec)
    assert e.value.code == "bad-unpermute" and "llama.attention.head_count" in str(e.value)
    rc, out, err = cli_run(capsys, "explain", spec)
    assert rc == 2 and "[bad-unpermute]" in one_line(err) and "blk.0.attn_q.weight" in err


def test_a_head_count_of_the_right_integer_unpermutes(tmp_path):
    ck = _write(tmp_path / "m.gguf", [("uint32", "llama.attention.head_count", 2)])  # no head_count_kv: 2 too
    assert compile_spec(_spec(tmp_path, ck)).refusal is None


def test_a_file_named_as_one_of_a_split_set_without_split_keys_is_refused(tmp_path, capsys):
    """Named 1 of 3 with its two siblings beside it, and no split.count: loading it alone would load a
    third of the model."""
    _write(tmp_path / "m-00001-of-00003.gguf", tensors=QK[:1])
    _write(tmp_path / "m-00002-of-00003.gguf", tensors=QK[1:], split=(1, 3))
    _write(tmp_path / "m-00003-of-00003.gguf", tensors=(("blk.0.attn_v.weight", (4, 32)),), split=(2, 3))
    with pytest.raises(ManifestError) as e:
        read_manifest(tmp_path / "m-00001-of-00003.gguf")
    assert e.value.code == "gguf-split" and "split.count" in str(e.value)
    rc, out, err = cli_run(capsys, "inspect", tmp_path / "m-00001-of-00003.gguf")
    assert rc == 2 and "[gguf-split]" in one_line(err)


def test_the_first_file_of_a_split_set_must_say_it_is_the_first(tmp_path):
    _write(tmp_path / "m-00001-of-00002.gguf", tensors=QK[:1], split=(1, 2))
    _write(tmp_path / "m-00002-of-00002.gguf", tensors=QK[1:], split=(1, 2))
    with pytest.raises(ManifestError) as e:
        read_manifest(tmp_path / "m-00001-of-00002.gguf")
    assert e.value.code == "gguf-split" and "split.no" in str(e.value)


def test_a_whole_split_set_reads(tmp_path):
    _write(tmp_path / "m-00001-of-00002.gguf", tensors=QK[:1], split=(0, 2))
    _write(tmp_path / "m-00002-of-00002.gguf", tensors=QK[1:], split=(1, 2))
    m = read_manifest(tmp_path / "m-00001-of-00002.gguf")
    assert len(m.shards) == 2 and len(m.tensors) == 2


def test_a_folder_of_gguf_files_says_to_name_the_file(tmp_path, capsys):
    _write(tmp_path / "model.gguf")
    rc, out, err = cli_run(capsys, "inspect", tmp_path)
    line = one_line(err)
    assert rc == 2 and "[no-shards]" in line and "model.gguf" in line

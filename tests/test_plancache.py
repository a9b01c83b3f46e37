"""The plan cache: a hit when every key matches, a miss when one does not; corrupt entries replaced;
atomic writes from concurrent processes; off when PLANC_PLAN_CACHE=off."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import planc  # noqa: E402
from conftest import write_spec, write_st  # noqa: E402
from planc.base import settings  # noqa: E402
from planc.face.cli import main  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.plan.codec import encode_bytes  # noqa: E402
from planc.compiler.plancache import cached_compile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PLANC_PLAN_CACHE", str(d))
    return d


def _spec(folder, size=1, host="1MiB", name="spec.yaml"):
    doc = {"checkpoint": "m.safetensors", "budget": {"host": host}, "io": {"slot": 4096, "slots": 2, "run": 4096},
           "rules": [{"match": "a", "split": {"dim": 0}}, {"match": "*"}] if size > 1 else [{"match": "*"}]}
    if size > 1:
        doc["tensor_parallel"] = {"size": size}
    return write_spec(folder, doc, name)


@pytest.fixture
def ckpt(tmp_path):
    write_st(tmp_path / "m.safetensors", {"a": np.arange(16 * 64, dtype=np.float32).reshape(16, 64),
                                          "b": np.ones(64, np.float32)})
    return tmp_path


def entries(cache):
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_hit_when_every_key_matches(cache, ckpt):
    path = _spec(ckpt)
    first = cached_compile(path)
    assert first.note("source") == "compiled" and len(entries(cache)) == 1
    again = cached_compile(path)
    assert again.note("source") == "cache" and again.note("cache_entry") == str(cache / entries(cache)[0])
    assert encode_bytes(again) == encode_bytes(first) == encode_bytes(compile_spec(path))
    assert not any(n.startswith(".tmp-") for n in entries(cache))


def test_miss_when_the_spec_is_edited(cache, ckpt):
    cached_compile(_spec(ckpt))
    edited = cached_compile(_spec(ckpt, host="2MiB"))
    assert edited.note("source") == "compiled" and edited.budget.host_bytes == 2 << 20
    assert len(entries(cache)) == 2


def test_miss_when_a_checkpoint_file_is_touched(cache, ckpt):
    path = _spec(ckpt)
    cached_compile(path)
    f = ckpt / "m.safetensors"
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    again = cached_compile(path)
    assert again.note("source") == "compiled" and again.checkpoint.files[0].mtime_ns == st.st_mtime_ns + 1_000_000
    assert cached_compile(path).note("source") == "cache"


def test_miss_when_the_checkpoint_is_rewritten_under_an_entry(cache, ckpt):
    # The key holds the file's stat: a rewritten file with another size cannot hit the old entry,
    # and an entry whose fingerprints no longer match (planted under today's key) is not taken either.
    path = _spec(ckpt)
    cached_compile(path)
    (name,) = entries(cache)
    old = (cache / name).read_bytes()
    write_st(ckpt / "m.safetensors", {"a": np.ones((16, 64), np.float32), "b": np.ones(64, np.float32),
                                      "c": np.ones(8, np.float32)})
    fresh = cached_compile(path)
    assert fresh.note("source") == "compiled" and fresh.totals.tensors == 3
    new = [n for n in entries(cache) if n != name][0]
    (cache / new).write_bytes(old)  # yesterday's plan under today's key: its fingerprints disagree
    assert cached_compile(path).note("source") == "compiled" and cached_compile(path).totals.tensors == 3


def test_miss_when_the_version_differs(cache, ckpt, monkeypatch):
    path = _spec(ckpt)
    cached_compile(path)
    monkeypatch.setattr(planc, "__version__", "9.9.9")
    assert cached_compile(path).note("source") == "compiled"
    assert len(entries(cache)) == 2


def test_miss_when_the_compiler_code_differs(cache, ckpt, monkeypatch):
    """A plan compiled by other code of the same version (an edited checkout) is another entry."""
    from planc.compiler import plancache

    path = _spec(ckpt)
    cached_compile(path)
    assert cached_compile(path).note("source") == "cache"
    monkeypatch.setattr(plancache, "_code", ["0" * 64])
    assert cached_compile(path).note("source") == "compiled"
    assert len(entries(cache)) == 2


def test_the_code_digest_covers_the_compiler_source():
    from planc.compiler import plancache

    d = plancache.code_digest()
    assert len(d) == 64 and d == plancache.code_digest()
    root = Path(plancache.__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in ("base", "compiler", "manifest", "plan", "spec"):
        for f in sorted((root / sub).rglob("*.py")):
            if not f.name.startswith("."):
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    assert h.hexdigest() == d


def test_the_code_digest_skips_what_is_not_a_source_file(tmp_path, monkeypatch):
    """An editor's lock file (a dangling link named .#bind.py) or a folder named x.py is no source:
    the digest is that of the sources, and a compile goes on."""
    import shutil

    from planc.compiler import plancache

    root = Path(plancache.__file__).resolve().parent.parent
    copy = tmp_path / "planc"
    for sub in ("base", "compiler", "manifest", "plan", "spec"):
        shutil.copytree(root / sub, copy / sub, ignore=shutil.ignore_patterns("__pycache__"))
    fake = copy / "compiler" / "plancache.py"
    monkeypatch.setattr(plancache, "__file__", str(fake))
    monkeypatch.setattr(plancache, "_code", [])
    clean = plancache.code_digest()
    (copy / "compiler" / ".#bind.py").symlink_to(tmp_path / "nowhere")
    (copy / "plan" / "x.py").mkdir()
    monkeypatch.setattr(plancache, "_code", [])
    assert plancache.code_digest() == clean


def test_miss_when_the_rank_differs(cache, ckpt):
    path = _spec(ckpt, size=2)
    r0 = cached_compile(path, 0)
    r1 = cached_compile(path, 1)
    assert r1.note("source") == "compiled" and r1.tensor_parallel.rank == 1
    assert cached_compile(path, 0).note("source") == "cache" and cached_compile(path, 1).note("source") == "cache"
    assert encode_bytes(cached_compile(path, 0)) == encode_bytes(r0)


def test_miss_when_the_costs_differ(cache, ckpt, monkeypatch, tmp_path):
    path = _spec(ckpt)
    cached_compile(path)
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-10, "request_s": 1e-4}))
    monkeypatch.setenv("PLANC_PROBE", str(probe))
    p = cached_compile(path)
    assert p.note("source") == "compiled" and p.costs.source == str(probe)


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"kind": "planc-plan", "format": 3}', "truncate"])
def test_corrupt_entry_ignored_and_replaced(cache, ckpt, damage):
    path = _spec(ckpt)
    good = encode_bytes(cached_compile(path))
    (name,) = entries(cache)
    (cache / name).write_bytes(good[: len(good) // 2] if damage == "truncate" else damage)
    p = cached_compile(path)
    assert p.note("source") == "compiled" and encode_bytes(p) == good
    assert (cache / name).read_bytes() == good  # replaced
    assert cached_compile(path).note("source") == "cache"


def test_entry_that_is_not_a_regular_file_is_never_read(cache, ckpt, tmp_path):
    path = _spec(ckpt)
    cached_compile(path)
    (name,) = entries(cache)
    (cache / name).unlink()
    os.mkfifo(cache / name)  # a reader that opened it would block
    assert cached_compile(path).note("source") == "compiled"
    assert (cache / name).is_file()  # the FIFO was replaced by the entry, nothing written through it


def test_disabled(ckpt, monkeypatch, tmp_path):
    monkeypatch.setenv("PLANC_PLAN_CACHE", "off")
    assert settings.plan_cache_dir() is None
    path = _spec(ckpt)
    assert cached_compile(path).note("source") == "compiled" and cached_compile(path).note("cache_entry") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PLANC_PLAN_CACHE")
    assert settings.plan_cache_dir() == tmp_path / "xdg" / "planc" / "plans"


def test_unwritable_cache_costs_a_compile_not_an_error(ckpt, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("PLANC_PLAN_CACHE", str(blocker / "below"))  # a folder under a file cannot be made
    p = cached_compile(_spec(ckpt))
    assert p.fits and p.note("source") == "compiled" and p.note("cache_entry") == ""


_WRITER = """
import sys
from planc.compiler.plancache import cached_compile
from planc.plan.codec import encode_bytes
out = set()
for _ in range(int(sys.argv[2])):
    out.add(encode_bytes(cached_compile(sys.argv[1])))
assert len(out) == 1, "a reader saw two different plans"
sys.stdout.write(out.pop().decode())
"""


def test_two_concurrent_writer_processes(cache, ckpt):
    path = _spec(ckpt)
    want = encode_bytes(compile_spec(path)).decode()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    for _ in range(2):
        procs.append(subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "15"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e
        assert o == want
    assert len(entries(cache)) == 1 and not any(n.startswith(".tmp-") for n in entries(cache))


def test_explain_says_it_came_from_the_cache(capsys, cache, ckpt):
    path = _spec(ckpt)
    assert main(["explain", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "compiled"
    assert main(["explain", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["source"] == "cache" and d["cache_entry"].startswith(str(cache))
    assert main(["explain", str(path)]) == 0
    assert "plan: from the plan cache" in capsys.readouterr().out


def test_run_and_load_reuse_the_entry(capsys, cache, ckpt):
    path = _spec(ckpt)
    assert main(["run", str(path), "--json"]) == 0
    capsys.readouterr()
    (name,) = entries(cache)
    before = os.stat(cache / name).st_mtime_ns
    model = planc.load(path)
    try:
        assert np.array_equal(model["a"].to_host(), np.arange(16 * 64, dtype=np.float32).reshape(16, 64))
        assert model.report["predicted"]["wall_warm_seconds"] > 0
    finally:
        model.free()
    assert os.stat(cache / name).st_mtime_ns == before and entries(cache) == [name]  # read, not written again

"""`LoadedModel.reload` and digest-verified loads under the CUDA simulator (docs/reload.md).

Real checkpoints written with the safetensors package in `tmp_path`, real reads, the real
pipeline; faults come in through the load's parts (`execute_support`). Expected values are the
arrays the tests wrote.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import contextlib  # noqa: E402
import json  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

import planc  # noqa: E402
from execute_support import (SMALL_IO, assert_model, cast, cli_run, fail_read_at, handmade, one_line,  # noqa: E402
                             record_events, spec_file, synth)
from planc.manifest import digest as dg  # noqa: E402
from planc.manifest import digestcheck as dgc  # noqa: E402
from planc.base.errors import DigestError, FingerprintError, PlanFormatError, ReadError, ReloadError, TornModelError  # noqa: E402
from planc.execute.pipeline.events import CopyIssued  # noqa: E402

EXTENT = 64 << 10  # the smallest extent: a 300 KiB checkpoint spans several


def _two(tmp_path, shards=2, size=300_000):
    """Two dense checkpoints of one layout (other weights), each with its spec; returns
    (spec_a, want_a, spec_b, want_b)."""
    a, want_a = synth(tmp_path / "a", "dense", size_bytes=size, shards=shards, seed=0)
    b, want_b = synth(tmp_path / "b", "dense", size_bytes=size, shards=shards, seed=1)
    sa = spec_file(tmp_path / "a", a, [{"match": "*"}], io=SMALL_IO)
    sb = spec_file(tmp_path / "b", b, [{"match": "*"}], io=SMALL_IO)
    return sa, want_a, sb, want_b


@pytest.fixture
def models():
    got = []
    yield got
    for m in got:
        m.free()


@pytest.fixture(params=["native", "native-scalar", "python"])
def hasher(request, monkeypatch):
    """A digest-verified load's hashing: the reader's read-and-hash loop (at its widest level, or
    its scalar one), or Python's on the reader's thread. The report's `hasher` is returned."""
    from planc.execute.io import readhash

    native = request.param.startswith("native")
    if native and readhash.load() is None:
        pytest.skip(readhash.why_not)
    monkeypatch.setenv("PLANC_DIGEST_HASH", {"native": "best", "native-scalar": "scalar"}.get(request.param, "python"))
    return "native" if native else request.param


# -- reload ----------------------------------------------------------------------------------------


def test_reload_is_bit_exact_at_the_same_addresses(tmp_path, models):
    sa, want_a, sb, want_b = _two(tmp_path)
    model = planc.load(sa)
    models.append(model)
    assert_model(model, want_a)
    arena, views = model._arena, {n: (t, t._arena, t.offset_bytes) for n, t in model.items()}
    rep = model.reload(sb, verify=True)
    assert rep["verify"]["ok"] and model.report is rep
    assert_model(model, want_b)
    assert model._arena is arena and model.torn is None
    for n, t in model.items():  # the same tensor objects, over the same memory, at the same offsets
        assert views[n] == (t, t._arena, t.offset_bytes)
    model.reload(sa)  # and back
    assert_model(model, want_a)


@pytest.mark.parametrize("change", ["shape", "dtype", "extra"])
def test_layout_mismatch_refused_before_any_write(tmp_path, models, monkeypatch, change):
    rng = np.random.default_rng(3)
    base = {"w.a": rng.standard_normal((8, 16)).astype(np.float32), "w.b": rng.standard_normal(32).astype(np.float32)}
    other = {k: v + 1 for k, v in base.items()}
    if change == "shape":
        other["w.a"] = other["w.a"].reshape(16, 8)
    elif change == "dtype":
        other["w.a"] = other["w.a"].view(np.int32)
    else:
        other["w.c"] = np.ones(4, np.float32)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pa, _ = handmade(tmp_path / "a", base)
    pb, _ = handmade(tmp_path / "b", other)
    model = planc.load(spec_file(tmp_path / "a", pa, [{"match": "*"}], io=SMALL_IO))
    models.append(model)
    events = record_events(monkeypatch)
    with pytest.raises(ReloadError) as e:
        model.reload(spec_file(tmp_path / "b", pb, [{"match": "*"}], io=SMALL_IO))
    assert e.value.code == "reload-layout" and e.value.exit_code == 2
    assert ("w.a" if change != "extra" else "w.c") in str(e.value)
    assert {"shape": "shape", "dtype": "dtype", "extra": "lacks"}[change] in str(e.value)
    assert not events  # nothing started: no read, no copy
    assert model.torn is None
    assert_model(model, base)


def test_failure_mid_reload_leaves_a_torn_model(tmp_path, models, monkeypatch):
    sa, want_a, sb, want_b = _two(tmp_path, shards=1)
    model = planc.load(sa)
    models.append(model)
    events = record_events(monkeypatch)
    fail_read_at(monkeypatch, 4)
    with pytest.raises(ReadError) as e:
        model.reload(sb)
    assert e.value.code == "read-failed"
    assert any(isinstance(ev, CopyIssued) for ev in events), "the reload failed before it wrote anything: the test would not show a torn model"
    assert model.torn and "failed while writing" in model.torn
    name = next(iter(want_a))
    with pytest.raises(TornModelError) as t:
        model[name].to_host()
    assert t.value.code == "torn" and name in str(t.value)
    with pytest.raises(TornModelError):
        model.state_dict()
    monkeypatch.undo()  # reads work again
    model.reload(sb)
    assert model.torn is None
    assert_model(model, want_b)


def test_reload_refused_by_a_changed_file_leaves_the_model_intact(tmp_path, models):
    sa, want_a, sb, want_b = _two(tmp_path, shards=1)
    from planc.compiler.compile import compile_spec

    plan_b = compile_spec(sb)
    model = planc.load(sa)
    models.append(model)
    f = plan_b.checkpoint.files[0]
    p = os.path.join(plan_b.checkpoint.root, f.path)
    os.utime(p, ns=(f.mtime_ns + 10**9, f.mtime_ns + 10**9))
    with pytest.raises(FingerprintError):
        model.reload(plan_b)
    assert model.torn is None
    assert_model(model, want_a)


def test_a_model_from_execute_reloads_a_plan_and_refuses_a_path(tmp_path, models):
    """The executor's own models take a Plan; specs and plan files are resolved by planc.load's."""
    from planc.compiler.compile import compile_spec
    from planc.execute import execute

    sa, want_a, sb, want_b = _two(tmp_path)
    model = execute(compile_spec(sa))
    models.append(model)
    with pytest.raises(PlanFormatError) as e:
        model.reload(str(sb))
    assert e.value.code == "plan-kind" and model.torn is None
    assert_model(model, want_a)
    model.reload(compile_spec(sb))
    assert_model(model, want_b)


def test_reload_through_device_conversions(tmp_path, models):
    """A plan whose kernels convert on the device (bf16 -> fp16) reloads into the same arena."""
    a, want_a = synth(tmp_path / "a", "dense", layers=1, seed=0)
    b, want_b = synth(tmp_path / "b", "dense", layers=1, seed=1)
    rules = [{"match": "*.mlp.*", "dtype": "float16"}, {"match": "*"}]
    model = planc.load(spec_file(tmp_path / "a", a, rules, io=SMALL_IO))
    models.append(model)
    arena = model._arena
    rep = model.reload(spec_file(tmp_path / "b", b, rules, io=SMALL_IO), verify=True)
    assert rep["verify"]["ok"] and rep["kernels"]["issued"] == rep["kernels"]["predicted"] > 0
    assert model._arena is arena
    assert_model(model, {k: cast(v, "F16") if ".mlp." in k else v for k, v in want_b.items()})


def test_a_freed_model_is_not_reloaded(tmp_path):
    sa, _, sb, _ = _two(tmp_path, shards=1, size=50_000)
    model = planc.load(sa)
    model.free()
    with pytest.raises(ReloadError) as e:
        model.reload(sb)
    assert e.value.code == "reload-freed"


def test_module_arena_splits_copies_at_tensor_boundaries():
    from planc.execute.pipeline.reload import ModuleArena
    from planc.execute.device.seam import split_copies

    arena = ModuleArena([(0, 10, "a"), (16, 8, "b"), (24, 4, "c")], 32)  # 6 bytes of padding after a
    assert arena.pieces(4, 24) == [("a", 4, 0, 6), ("b", 0, 12, 8), ("c", 0, 20, 4)]
    assert arena.pieces(10, 6) == []  # padding only
    assert arena.pieces(17, 2) == [("b", 1, 0, 2)]
    got = split_copies([(arena, 8, 100, 20, 1, 0), ("landing", 0, 5, 7, 1, 0)])
    assert got == [("a", 8, 100, 2, 1, 0), ("b", 0, 108, 8, 1, 0), ("c", 0, 116, 4, 1, 0), ("landing", 0, 5, 7, 1, 0)]


# -- digests ---------------------------------------------------------------------------------------


def _digest(ckpt, out, **kw):
    doc = dg.make_digest(ckpt, extent_bytes=EXTENT, **kw)
    out.write_bytes(dg.encode(doc))
    return out


def test_digest_verified_load_hashes_every_byte_it_reads(tmp_path, models, hasher):
    sa, want_a, _, _ = _two(tmp_path)
    d = _digest(tmp_path / "a" / "dense", tmp_path / "a.digest.json", sha256=True)
    model = planc.load(sa, verify="digest", digest=d)
    models.append(model)
    assert_model(model, want_a)
    rep = model.report["digest"]
    assert rep["ok"] and rep["extents"] >= 4 and rep["hasher"] == hasher
    assert (rep["simd"] is None) == (hasher != "native")  # the loop's level, with the loop
    if os.environ.get("PLANC_DIGEST_HASH") == "scalar":
        assert rep["simd"] == "scalar"
    assert (rep["loop_bytes"] > 0) == (hasher == "native"), rep  # the loop hashes the requests' whole leaves
    sizes = sum(f.stat().st_size for f in (tmp_path / "a" / "dense").glob("*.safetensors"))
    assert rep["hashed_bytes"] >= sizes  # every leaf at least once (a leaf two reads share: by each)
    doc = json.loads(d.read_text())
    import hashlib

    for f in doc["files"]:
        assert f["sha256"] == hashlib.sha256((tmp_path / "a" / "dense" / f["path"]).read_bytes()).hexdigest()


def _across(tmp_path, slot="64KiB", **io):
    """One file: a header of about 8 KiB, one float32 tensor of 400,000 bytes, requests of `slot`
    on the file's slot grid. Returns (spec, plan, digest file (64 KiB leaves), checkpoint folder, want)."""
    from safetensors.numpy import save_file

    from planc.compiler.compile import compile_spec

    root = tmp_path / "across"
    root.mkdir()
    w = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    save_file({"w": w}, str(root / "model.safetensors"), metadata={"pad": "x" * 6000})
    spec = spec_file(tmp_path, root, [{"match": "*"}], io=dict(SMALL_IO, slot=slot, **io), name="across.yaml")
    return spec, compile_spec(spec), _digest(root, tmp_path / "across.digest.json"), root, {"w": w}


def _kinds(plan, extent=EXTENT, leaf=None):
    """kind -> [(owner, leaf lo)] over every task of the plan's leaf assignment."""
    tasks, _ = dgc.assign(plan, extent, leaf or extent)
    out = {}
    for queue in tasks.values():
        for t in queue:
            for lf in t.leaves:
                out.setdefault(lf.kind, []).append((lf.owner, lf.lo))
    return out


def test_requests_on_the_slot_grid_hold_their_leaves_whole(tmp_path, models, hasher):
    """Leaves that divide the slot lie inside one request each, but the header's (the first request
    begins at the tensor's page): the loop hashes every other leaf as it lands, no leaf is hashed
    twice, and the load reads and requests as a plain one does."""
    spec, plan, d, root, want = _across(tmp_path)
    kinds = _kinds(plan)
    size = (root / "model.safetensors").stat().st_size
    assert len(kinds["whole"]) == -(-size // EXTENT) - 1 and len(kinds["part"]) == 1 and "fill" not in kinds
    assert all(owner for owners in kinds.values() for owner, _ in owners)  # one read a leaf: each its owner
    model = planc.load(spec, verify="digest", digest=d)
    models.append(model)
    assert_model(model, want)
    rep = model.report["digest"]
    assert rep["hashed_bytes"] == size and rep["fill_bytes"] == dgc.coverage(plan, EXTENT)["fill_bytes"] > 0
    if hasher == "native":
        assert rep["loop_bytes"] == size - EXTENT, rep  # all but the header's leaf
    assert model.report["requests"]["issued"] == model.report["requests"]["predicted"]  # one a request
    plain = planc.load(spec)  # the bytes read: as a plain load's
    try:
        assert model.report["bytes_read"]["measured"] == plain.report["bytes_read"]["measured"]
    finally:
        plain.free()


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_leaf_two_reads_share_is_hashed_by_each_and_a_flipped_byte_in_it_is_caught(tmp_path, models, hasher, where):
    """Requests of 96 KiB against 64 KiB leaves: every other leaf lies across two reads. Each read
    hashes the whole leaf (its bytes from the slot, the others from the file), one as the owner;
    the load is exact, and a byte flipped on either side of a read's first byte is caught."""
    spec, plan, d, root, want = _across(tmp_path, slot="96KiB")
    kinds = _kinds(plan)
    shared = [lo for owner, lo in kinds["part"] if not owner]
    assert len(shared) >= 2 and len(kinds["whole"]) >= 2  # witnesses: leaves across two reads
    assert dgc.coverage(plan, EXTENT)["shared_leaves"] == len(set(shared))
    model = planc.load(spec, verify="digest", digest=d)
    models.append(model)
    assert_model(model, want)
    assert model.report["digest"]["fill_bytes"] == dgc.coverage(plan, EXTENT)["fill_bytes"]
    q = [q for r in plan.runs for q in r.requests][2]
    at = q.offset - 100 if where == "before" else q.offset + 100
    with _flipped(root / "model.safetensors", at, 0x40), pytest.raises(DigestError, match="do not match the digest file") as e:
        planc.load(spec, verify="digest", digest=d)  # compiled again: the file's mtime changed
    assert e.value.code == "digest-mismatch"


def test_two_reads_of_one_leaf_that_differ_fail_the_load(tmp_path):
    """A witness's digest of its range of a leaf and the owner's of the same range are compared,
    whichever comes second: the file changed between the two reads."""
    _, plan, _, root, _ = _across(tmp_path, slot="96KiB")
    d = tmp_path / "leaved.digest.json"
    d.write_bytes(dg.encode(dg.make_digest(root, extent_bytes=LEAVED, leaf_bytes=LEAF)))
    d = dg.read_digest(str(d))
    for owner_first in (True, False):
        v = dgc.Verifier(plan, d)
        tasks = [t for queue in v.tasks.values() for t in queue]
        lf = next(lf for t in tasks for lf in t.leaves if not lf.owner)
        owner = next(x for t in tasks for x in t.leaves if x.lo == lf.lo and x.owner)
        (a, b, _), = lf.own
        assert (a, b) in owner.checks
        if owner_first:
            v.record(owner, b"\x01" * 16, {(a, b): b"\x02" * 16})
            with pytest.raises(DigestError, match="differ between two reads of the load") as e:
                v.witness(lf, a, b, b"\x03" * 16)
        else:
            v.witness(lf, a, b, b"\x03" * 16)
            with pytest.raises(DigestError, match="differ between two reads of the load") as e:
                v.record(owner, b"\x01" * 16, {(a, b): b"\x02" * 16})
        assert e.value.code == "digest-mismatch" and f"[{a:,}, {b:,})" in str(e.value)


def test_every_touched_leaf_has_one_owner_or_the_assignment_is_refused(tmp_path):
    """`check_owners` proves the assignment: a leaf with no owner, or two, is refused."""
    _, plan, d, _, _ = _across(tmp_path, slot="96KiB")
    tasks, extents = dgc.assign(plan, EXTENT, EXTENT)
    dgc.check_owners(tasks, extents)
    for flip in ("drop", "double"):
        bad = {k: type(q)(t._replace(leaves=tuple(lf._replace(owner=flip == "double") if lf.kind == "part" else lf
                                                    for lf in t.leaves)) for t in q) for k, q in tasks.items()}
        with pytest.raises(DigestError, match="owners, not one") as e:
            dgc.check_owners(bad, extents)
        assert e.value.code == "digest-incomplete"


def test_a_read_the_plan_does_not_hold_is_refused(tmp_path):
    """Nothing would hash its bytes: the verifier refuses it, naming the file and the offset."""
    _, plan, d, root, _ = _across(tmp_path)
    v = dgc.Verifier(plan, dg.read_digest(str(d)))
    q = next(q for r in plan.runs for q in r.requests)
    v.take(("r", q.file, q.offset, q.needed))
    with pytest.raises(DigestError, match=r"a read at .* the plan does not hold") as e:
        v.take(("r", q.file, q.offset, q.needed))  # taken once already
    assert e.value.code == "digest-incomplete" and str(root / "model.safetensors") in str(e.value)
    with pytest.raises(DigestError, match="were never hashed"):
        v.finish()


@pytest.mark.parametrize("shard", [0, 1])
def test_one_flipped_byte_is_caught_with_its_file_and_range(tmp_path, models, shard, hasher):
    sa, _, _, _ = _two(tmp_path)
    root = tmp_path / "a" / "dense"
    d = _digest(root, tmp_path / "a.digest.json")
    files = sorted(root.glob("*.safetensors"))
    victim = files[shard]
    data = bytearray(victim.read_bytes())
    at = len(data) * 2 // 3  # in a tensor's bytes, past the head the fingerprint hashes
    data[at] ^= 0x10
    victim.write_bytes(bytes(data))
    with pytest.raises(DigestError) as e:
        planc.load(sa, verify="digest", digest=d)
    msg = str(e.value)
    lo = at // EXTENT * EXTENT
    assert e.value.code == "digest-mismatch" and e.value.exit_code == 2
    assert str(victim) in msg and f"[{lo:,}, {min(lo + EXTENT, len(data)):,})" in msg
    from planc.manifest import read_manifest

    hit = [t.name for t in read_manifest(victim).tensors if t.start <= at < t.end]
    assert hit and hit[0] in msg


def test_cli_digest_then_run_verified(tmp_path, capsys):
    sa, _, _, _ = _two(tmp_path)
    root = tmp_path / "a" / "dense"
    rc, out, err = cli_run(capsys, "digest", root, "--extent", "64KiB", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["path"] == str(root / "planc-digest.json") and doc["extents"] >= 4
    rc, out, err = cli_run(capsys, "run", sa, "--json", "--verify-digest")
    assert rc == 0, err
    assert json.loads(out)["digest"]["ok"]
    rc, out, err = cli_run(capsys, "explain", sa, "--verify-digest")
    assert rc == 0 and "verified: yes" in out
    rc, out, err = cli_run(capsys, "explain", sa, "--json")
    assert json.loads(out)["verification"] == {"kind": "none"}
    victim = sorted(root.glob("*.safetensors"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) - 5] ^= 1
    victim.write_bytes(bytes(data))
    rc, out, err = cli_run(capsys, "run", sa, "--verify-digest", root / "planc-digest.json")
    assert rc == 2
    line = one_line(err)
    assert "digest-mismatch" in line and str(victim) in line


def test_digest_of_another_checkpoint_refused(tmp_path, capsys):
    sa, _, sb, _ = _two(tmp_path)
    other = _digest(tmp_path / "b" / "dense", tmp_path / "b.digest.json")
    rc, out, err = cli_run(capsys, "run", sa, "--verify-digest", other)
    assert rc == 2
    assert "[digest-other]" in one_line(err)
    small, _ = synth(tmp_path / "c", "dense", size_bytes=100_000, shards=2, seed=0)
    other = _digest(small, tmp_path / "c.digest.json")
    rc, out, err = cli_run(capsys, "run", sa, "--verify-digest", other)
    assert rc == 2 and "[digest-other]" in one_line(err)


@pytest.mark.parametrize("damage", ["truncated", "edited", "extra-key", "huge", "not-json", "bad-path", "extents"])
def test_damaged_digest_file_refused(tmp_path, capsys, damage):
    sa, _, _, _ = _two(tmp_path)
    d = _digest(tmp_path / "a" / "dense", tmp_path / "a.digest.json")
    raw = d.read_bytes()
    doc = json.loads(raw)
    if damage == "truncated":
        d.write_bytes(raw[:len(raw) // 2])
    elif damage == "edited":
        h = doc["files"][0]["extents"][1]
        doc["files"][0]["extents"][1] = ("0" if h[0] != "0" else "1") + h[1:]
        d.write_text(json.dumps(doc))
    elif damage == "extra-key":
        doc["note"] = "x"
        d.write_text(json.dumps(doc))
    elif damage == "huge":
        with open(d, "ab") as f:
            f.truncate(dg.MAX_FILE_BYTES + 1)
    elif damage == "not-json":
        d.write_bytes(b"\xff\xfe garbage")
    elif damage == "bad-path":
        doc["files"][0]["path"] = "../etc/passwd"
        doc["check"] = dg._check(doc)
        d.write_text(json.dumps(doc))
    else:
        doc["files"][0]["extents"].pop()
        doc["check"] = dg._check(doc)
        d.write_text(json.dumps(doc))
    with pytest.raises(DigestError) as e:
        dg.read_digest(d)
    assert e.value.exit_code == 2
    if damage == "edited":
        assert e.value.code == "digest-edited"
    rc, out, err = cli_run(capsys, "run", sa, "--verify-digest", d)
    assert rc == 2
    assert "digest" in one_line(err)


def test_coverage_counts_what_the_verifier_reads_besides(tmp_path):
    """A plan that skips a tensor: its bytes inside touched extents are read by the verifier (fill),
    and the load still verifies."""
    sa, want_a, _, _ = _two(tmp_path, shards=1)
    from planc.compiler.compile import compile_spec
    from planc.manifest import read_manifest

    root = tmp_path / "a" / "dense"
    m = read_manifest(root)
    big = max(m.tensors, key=lambda t: t.nbytes)
    spec = spec_file(tmp_path / "a", root, [{"match": big.name, "skip": True}, {"match": "*"}], io=SMALL_IO,
                     name="skip.yaml")
    plan = compile_spec(spec)
    cov = dgc.coverage(plan, EXTENT)
    assert cov["fill_bytes"] > 0
    d = _digest(root, tmp_path / "a.digest.json")
    model = planc.load(plan, verify="digest", digest=d)
    try:
        assert model.report["digest"]["fill_bytes"] == cov["fill_bytes"]
        want_a.pop(big.name)
        assert_model(model, want_a)
    finally:
        model.free()


# -- leaves: extents of several leaves, reads that split leaves, the format's version ----------------

LEAF = 64 << 10
LEAVED = 256 << 10  # four leaves per extent


def _tiny_io_spec(tmp_path, root, name="tiny.yaml", rules=None):
    """Requests of 96 KiB, from the first tensor's page: nearly every one begins and ends inside a leaf."""
    return spec_file(tmp_path, root, rules or [{"match": "*"}], io=dict(SMALL_IO, slot="96KiB", slots=4, workers=4, run="1MiB"),
                     name=name)


def test_digest_leaves_hash_to_the_extent():
    """An extent's hash is the xxh3-128 of its leaves' digests, in order; the last leaf and extent shorter."""
    import xxhash

    data = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    leaves = b"".join(xxhash.xxh3_128_digest(data[i:i + LEAF]) for i in range(256 << 10, len(data), LEAF))
    assert dg.extent_hash(leaves) == xxhash.xxh3_128_digest(leaves)


def test_leaves_split_across_reads_verify_and_a_flipped_byte_in_one_is_caught(tmp_path, models, hasher):
    sa, want_a, _, _ = _two(tmp_path, shards=1, size=900_000)
    root = tmp_path / "a" / "dense"
    spec = _tiny_io_spec(tmp_path / "a", root)
    from planc.compiler.compile import compile_spec

    plan = compile_spec(spec)
    d = tmp_path / "a.digest.json"
    d.write_bytes(dg.encode(dg.make_digest(root, extent_bytes=LEAVED, leaf_bytes=LEAF)))
    size = plan.checkpoint.files[0].size_bytes
    kinds = _kinds(plan, LEAVED, LEAF)
    assert len(kinds["part"]) >= 5 and len(kinds["whole"]) >= 1  # reads split leaves
    model = planc.load(plan, verify="digest", digest=d)
    models.append(model)
    assert_model(model, want_a)
    rep = model.report["digest"]
    assert rep["ok"] and rep["leaf_bytes"] == LEAF and rep["hasher"] == hasher
    assert rep["hashed_bytes"] >= size  # every byte, by each read that holds some of its leaf
    assert rep["fill_bytes"] == dgc.coverage(plan, LEAVED, LEAF)["fill_bytes"]
    # a flipped byte in a leaf two reads share, and one in a leaf one read covers whole
    starts = sorted(q.offset for r in plan.runs for q in r.requests)
    for at in (starts[3] - 7, (starts[5] // LEAF + 1) * LEAF + 100):
        victim = root / plan.checkpoint.files[0].path
        with _flipped(victim, at, 0x04), pytest.raises(DigestError) as e:
            planc.load(spec, verify="digest", digest=d)  # compiled again: the file's mtime changed
        lo = at // LEAVED * LEAVED
        assert e.value.code == "digest-mismatch" and str(victim) in str(e.value)
        assert f"[{lo:,}, {min(lo + LEAVED, size):,})" in str(e.value)


@contextlib.contextmanager
def _flipped(path, at: int, bit: int):
    """`path` with the byte at `at` xor `bit` inside the block, as it was after it."""
    data = bytearray(path.read_bytes())
    data[at] ^= bit
    path.write_bytes(bytes(data))
    try:
        yield
    finally:
        data[at] ^= bit
        path.write_bytes(bytes(data))


def test_version_1_digest_refused_with_its_own_code(tmp_path, capsys):
    sa, _, _, _ = _two(tmp_path)
    d = _digest(tmp_path / "a" / "dense", tmp_path / "a.digest.json")
    doc = json.loads(d.read_text())
    doc.pop("leaf_bytes")
    doc["version"] = 1
    doc["check"] = dg._check(doc)
    d.write_text(json.dumps(doc))
    with pytest.raises(DigestError) as e:
        dg.read_digest(d)
    assert e.value.code == "digest-version" and e.value.exit_code == 2 and "planc digest" in str(e.value)
    rc, out, err = cli_run(capsys, "run", sa, "--verify-digest", d)
    assert rc == 2 and "[digest-version]" in one_line(err)


@pytest.mark.parametrize("leaf", [32 << 10, 96 << 10, 512 << 10])
def test_leaf_size_out_of_range_refused(tmp_path, leaf):
    _two(tmp_path)
    with pytest.raises(DigestError) as e:
        dg.make_digest(tmp_path / "a" / "dense", extent_bytes=LEAVED, leaf_bytes=leaf)
    assert e.value.code == "digest-extent"


def _two_mb(tmp_path, io: dict, name: str, leaf: int):
    """A 2 MB one-file dense checkpoint, its plan with `io`, and its digest of LEAVED extents with
    `leaf` leaves: (spec, plan, digest file, checkpoint folder, want)."""
    from planc.compiler.compile import compile_spec

    a, want = synth(tmp_path / "a", "dense", size_bytes=2_000_000, shards=1, seed=0)
    root = tmp_path / "a" / "dense"
    spec = spec_file(tmp_path / "a", a, [{"match": "*"}], io=dict(SMALL_IO, **io), name=name)
    plan = compile_spec(spec)
    d = tmp_path / "a.digest.json"
    d.write_bytes(dg.encode(dg.make_digest(root, extent_bytes=LEAVED, leaf_bytes=leaf)))
    return spec, plan, d, root, want


def test_a_freed_models_tensors_refuse_reads_with_a_typed_error(tmp_path):
    from planc.base.errors import ModelFreedError

    sa, want_a, _, _ = _two(tmp_path)
    model = planc.load(sa)
    name = next(iter(model))
    held = model[name]
    model.free()
    with pytest.raises(ModelFreedError) as e:
        model[name]
    assert e.value.code == "model-freed" and name in str(e.value) and "free" in str(e.value)
    with pytest.raises(ModelFreedError):
        held.to_host()  # a tensor the caller kept
    assert isinstance(e.value, KeyError)


def test_a_digest_with_verify_false_or_true_is_refused_and_reload_takes_verify_digest(tmp_path, models):
    from planc.base.errors import SpecError

    sa, want_a, sb, want_b = _two(tmp_path)
    d = _digest(tmp_path / "b" / "dense", tmp_path / "b.digest.json")
    for verify in (False, True):
        with pytest.raises(SpecError) as e:
            planc.load(sa, verify=verify, digest=d)
        assert e.value.code == "bad-verify" and "verify='digest'" in str(e.value)
    model = planc.load(sa)
    models.append(model)
    with pytest.raises(SpecError):
        model.reload(sb, digest=d)
    assert not model.torn
    assert_model(model, want_a)  # refused before anything was written
    rep = model.reload(sb, verify="digest", digest=d)
    assert rep["digest"]["ok"]
    assert_model(model, want_b)


def test_the_digest_hasher_setting_chooses_the_hasher(tmp_path, models, monkeypatch):
    """PLANC_DIGEST_HASH=python: no read-and-hash loop, same digests; a bad value: a typed error
    before anything is read."""
    sa, want_a, _, _ = _two(tmp_path)
    d = _digest(tmp_path / "a" / "dense", tmp_path / "a.digest.json")
    model = planc.load(sa, verify="digest", digest=d, settings={"digest_hash": "python"})
    models.append(model)
    assert_model(model, want_a)
    assert model.report["digest"]["hasher"] == "python" and model.report["digest"]["simd"] is None
    with pytest.raises(Exception, match="digest_hash"):
        planc.load(sa, verify="digest", digest=d, settings={"digest_hash": "fastest"})


def test_a_file_gone_before_it_is_hashed_is_a_typed_read_error(tmp_path):
    """The verifier opens the files itself (their heads, the leaves it reads whole): one removed
    since the plan's checks is a ReadError naming it, not an OSError."""
    _, plan, d, root, _ = _across(tmp_path, slot="96KiB")
    v = dgc.Verifier(plan, dg.read_digest(str(d)))
    (root / "model.safetensors").rename(root / "gone.safetensors")
    with pytest.raises(ReadError) as e:
        v.check_files()
    assert e.value.code == "read-open" and str(root / "model.safetensors") in str(e.value)
    lf = next(lf for queue in v.tasks.values() for t in queue for lf in t.leaves if lf.kind == "part" and lf.owner)
    with pytest.raises(ReadError) as e:
        v.hash_from_file(lf, np.zeros(1 << 20, np.uint8))
    assert e.value.code == "read-open"


"""Hostile inputs and faults: refuse early, fail clean, lose nothing.

1. The corpus (tests/hostile/corpus.py): every hostile checkpoint and spec ends in its typed
   error through the API, and through the command line as exit 2 with one line on stderr naming
   the file and no traceback.
2. Properties (hypothesis): the header reader and the spec loader raise nothing but PlancError,
   whatever they are given. tests/test_manifest.py fuzzes headers and indexes already; here are
   mutated valid files, names that are not text, and specs of any shape. The coverage-guided
   harnesses are tests/fuzz/fuzz_*.py (atheris, run by hand).
3. Faults during `run`, under the CUDA simulator: files changed after compile, a read failing
   mid-load, SIGINT, live room shrinking below a run's cost, a file system refusing O_DIRECT.
   Each ends in a typed error and exit code 2, 3 or 130, with the pinned ring, the device arena,
   the reader threads and the file descriptors all released.
4. 100 load/free cycles in one process: resident memory does not grow.
"""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import gc  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import weakref  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from numba import cuda  # noqa: E402

if not numba.config.ENABLE_CUDASIM and not cuda.is_available():
    pytest.skip("numba was imported before the CUDA simulator could be switched on, and no GPU is present",
                allow_module_level=True)

from planc.execute.pipeline.events import CopyIssued  # noqa: E402
from execute_support import (SMALL_IO, cli_run, fail_read_at, handmade, holds_open, interrupt_at,  # noqa: E402
                             gone, live_room_by_call, one_line, use_parts, watch_regions, refuse_direct_open, spec_file, synth)
from hostile.corpus import CHECKPOINTS, SPECS, VALID, Case, ent, st_bytes, table, u8_shard  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import AdmissionError, FingerprintError, Interrupted, PlancError, ReadError, SpecError
from planc.execute import execute  # noqa: E402
from planc.execute.device.memory import rss_bytes  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402
from planc.plan.codec import save_plan  # noqa: E402
from planc.spec.model import load_spec, validate_spec  # noqa: E402

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------------------------------
# 1. the corpus


def _expect(case: Case, call):
    with pytest.raises(PlancError) as ei:
        call()
    e = ei.value
    assert type(e) is case.error and e.code == case.code, f"{case.name}: got {type(e).__name__} {e}"
    assert case.names in e.message, (case.names, e.message)
    assert all(w in e.message for w in case.words), (case.words, e.message)
    return e


def _spec_for(folder: Path, checkpoint: Path) -> Path:
    p = folder / "spec.yaml"
    p.write_text(yaml.safe_dump({"checkpoint": str(checkpoint), "budget": {"host": "64MiB"},
                                 "io": {"slot": 4096, "slots": 2}, "rules": [{"match": "*"}]}))
    return p


@pytest.mark.parametrize("case", CHECKPOINTS, ids=[c.name for c in CHECKPOINTS])
def test_hostile_checkpoint(tmp_path, capsys, case):
    path = case.build(tmp_path)
    _expect(case, lambda: read_manifest(path))
    spec = _spec_for(tmp_path, path)
    _expect(case, lambda: compile_spec(spec))
    for args in (["inspect", path], ["compile", spec], ["explain", spec, "--json"]):
        rc, out, err = cli_run(capsys, *args)
        line = one_line(err)
        assert rc == 2 and out == "", (args, rc, out)
        assert case.names in line and line.endswith(f"[{case.code}]"), line
        assert all(w in line for w in case.words), (case.words, line)


@pytest.mark.parametrize("case", SPECS, ids=[c.name for c in SPECS])
def test_hostile_spec(tmp_path, capsys, case):
    path = case.build(tmp_path)
    if case.error is SpecError:
        _expect(case, lambda: load_spec(path))
    _expect(case, lambda: compile_spec(path))
    for args in (["compile", path], ["explain", path], ["run", path, "--json"]):
        rc, out, err = cli_run(capsys, *args)
        line = one_line(err)
        assert rc == 2 and out == "", (args, rc, out)
        assert case.names in line and line.endswith(f"[{case.code}]"), line
        assert all(w in line for w in case.words), (case.words, line)


def test_corpus_names_are_unique_and_documented():
    names = [c.name for c in CHECKPOINTS + SPECS]
    assert len(names) == len(set(names))
    doc = (Path(__file__).parent.parent / "docs" / "reliability.md").read_text()
    assert table() in doc, "docs/reliability.md's corpus table differs from tests/hostile/corpus.py's table()"


def test_header_order_is_not_file_order(tmp_path):
    """The format lets the header list tensors in any order; the data region must still tile exactly."""
    p = tmp_path / "m.safetensors"
    p.write_bytes(st_bytes({"b": ent("U8", [2], 4, 6), "a": ent("U8", [4], 0, 4)}, bytes(6)))
    assert [t.name for t in read_manifest(p).tensors] == ["a", "b"]


@pytest.mark.parametrize("name", ["a\nb", "x\x1b[31mred", "[/bold]", "[red]x"])
def test_names_cannot_break_the_one_line_error(tmp_path, capsys, name):
    """Tensor names are any text: newlines, terminal escapes and rich markup are shown escaped, on one line."""
    (tmp_path / "model.safetensors").write_bytes(st_bytes({name: ent("U8", [1], 0, 1)}, b"x"))
    spec = tmp_path / "spec.yaml"
    spec.write_text("checkpoint: model.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2}\n"
                    "rules: [{match: nothing}]\n")
    rc, out, err = cli_run(capsys, "compile", spec)
    line = one_line(err)
    assert rc == 2 and "\x1b" not in line and line.endswith("[unmatched]")
    shown = name.encode("unicode_escape").decode("ascii")
    assert shown in line
    rc, out, err = cli_run(capsys, "inspect", tmp_path / "model.safetensors")
    assert rc == 0 and err == "" and shown in out and "\x1b" not in out
    spec.write_text(spec.read_text().replace("nothing", "'*'"))
    rc, out, err = cli_run(capsys, "explain", spec)
    assert rc == 0 and err == "" and "\x1b" not in out


# ------------------------------------------------------------------------------------------
# 2. properties: nothing but typed errors


def _only_typed(call):
    try:
        return call()
    except PlancError as e:
        assert e.code and e.message
        return None


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile-fuzz")
    (d / "model.safetensors").write_bytes(VALID)
    return d


VALID_FILE = u8_shard(a=3, b=5, c=1)
edits = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, len(VALID_FILE) - 1),
                           st.integers(0, 255)), min_size=1, max_size=4)


@FUZZ
@given(edits=edits)
def test_fuzz_mutated_valid_file(fuzz_dir, edits):
    """Byte edits anywhere in a valid file (prefix, header, data): a manifest or a ManifestError."""
    b = bytearray(VALID_FILE)
    for op, at, val in edits:
        at = min(at, len(b) - 1) if b else 0
        if op == "set" and b:
            b[at] = val
        elif op == "insert":
            b.insert(at, val)
        elif b:
            del b[at]
    p = fuzz_dir / "mutant.safetensors"
    p.write_bytes(bytes(b))
    m = _only_typed(lambda: read_manifest(p))
    if m is not None:
        assert sum(t.nbytes for t in m.tensors) == m.shards[0].size_bytes - m.shards[0].data_start


escapes = st.sampled_from(["\\ud800", "\\udfff", "\\udc80", "\\ud83d\\ude00", "\\u0000", "\\u001b", "\\n", "\\\\ud800",
                           "\\u2028", "[/b]", "é", ""])
json_names = st.lists(escapes | st.text(alphabet="ab.{}*", max_size=3), min_size=1, max_size=4).map("".join)


@FUZZ
@given(names=st.lists(json_names, min_size=1, max_size=3, unique=True), meta=json_names)
def test_fuzz_names_that_are_not_text(fuzz_dir, names, meta):
    """Tensor and metadata names with escapes of every kind (unpaired surrogates among them)."""
    entries = ", ".join(f'"{n}": {{"dtype": "U8", "shape": [1], "data_offsets": [{i}, {i + 1}]}}'
                        for i, n in enumerate(names))
    header = ('{"__metadata__": {"' + meta + '": "' + meta + '"}, ' + entries + "}").encode()
    p = fuzz_dir / "names.safetensors"
    p.write_bytes(st_bytes(header, bytes(len(names))))
    m = _only_typed(lambda: read_manifest(p))
    if m is not None:
        for t in m.tensors:
            t.name.encode("utf-8")  # every name that comes out is text
    idx = fuzz_dir / "names.safetensors.index.json"
    idx.write_text('{"weight_map": {' + ", ".join(f'"{n}": "{meta or "x"}.safetensors"' for n in names) + "}}")
    _only_typed(lambda: read_manifest(idx))


scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
           | st.builds(lambda e: 10**e, st.sampled_from([19, 400, 5000]))
           | st.floats() | st.text(max_size=12)
           | st.sampled_from(["64MiB", "8GiB", "1.5GB", "-1", "0.5", "9" * 400 + "GiB", "1e9", "12 parsecs", "4096",
                              "*", "{L}", "{name}_scale_inv", "{name[a]}", "{0}", "{", "model.layers.{L}.{P}",
                              "keep", "float16", "bfloat16", "float32", "device", "host", "auto", "on", "off",
                              "replicate", "F8_E4M3", "BF16", "\x00", "~nobody/x", "cuda:0"]))
KEYS = ["checkpoint", "device", "budget", "host", "io", "workers", "slot", "slots", "run", "direct", "merge_gap",
        "rules", "match", "source_dtype", "dtype", "skip", "on", "fuse", "stack", "into", "over", "order",
        "dequantize", "scale", "block", "transpose", "split", "dim", "pad", "tensor_parallel", "size"]
keys = st.sampled_from(KEYS) | st.text(max_size=6)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
                      max_leaves=24)


@FUZZ
@given(doc=st.dictionaries(keys, values, max_size=8) | values)
def test_fuzz_validate_spec(doc):
    spec = _only_typed(lambda: validate_spec(doc))
    if spec is not None:
        assert spec.budget.host >= 0 and spec.rules


rule = st.fixed_dictionaries({"match": st.sampled_from(["*", "w", "b", "{X}", "nothing", "[wb]", "?"])},
                             optional={k: values for k in ["dtype", "skip", "on", "transpose", "source_dtype",
                                                           "fuse", "stack", "dequantize", "split"]})
specs = st.fixed_dictionaries(
    {"checkpoint": st.just("model.safetensors"), "budget": st.fixed_dictionaries({"host": values}),
     "rules": st.lists(rule, max_size=3)},
    optional={"io": st.dictionaries(st.sampled_from(["workers", "slot", "slots", "run", "direct", "merge_gap"]),
                                    values, max_size=3),
              "tensor_parallel": st.dictionaries(st.sampled_from(["size"]), values), "device": values})


@FUZZ
@given(doc=specs, as_json=st.booleans())
def test_fuzz_spec_files_compile_or_refuse_by_name(fuzz_dir, doc, as_json):
    """Near-valid specs as YAML or JSON files, next to a real checkpoint: compile_spec gives a plan
    or a PlancError (spec, bind, admission), never another exception."""
    p = fuzz_dir / ("spec.json" if as_json else "spec.yaml")
    try:
        text = json.dumps(doc) if as_json else yaml.safe_dump(doc)
    except (ValueError, TypeError):  # a 5000-digit int has no JSON text here
        return
    p.write_text(text)
    _only_typed(lambda: compile_spec(p))


@FUZZ
@given(text=st.text(max_size=200) | st.sampled_from(["&a [*a]", "a: &a {b: *a}", "!!python/object:os.system x",
                                                      "? [a]\n: b", "a: 2024-13-45", "{a: 1e999}",
                                                      "a: 0x" + "f" * 5000]),
       as_json=st.booleans())
def test_fuzz_spec_text(fuzz_dir, text, as_json):
    p = fuzz_dir / ("text.json" if as_json else "text.yaml")
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    _only_typed(lambda: load_spec(p))


# ------------------------------------------------------------------------------------------
# 3. faults during run


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def released(monkeypatch):
    """Watch what each load allocates; `check()` asserts that all of it is gone (while the error may
    still be held), and that no file descriptor or thread outlived the load."""
    fds, threads = _fds(), threading.active_count()
    seen = watch_regions(monkeypatch)

    def check(allocated: bool = True):
        gc.collect()
        assert bool(seen) == allocated, "a load allocated although it should have been refused first"
        for rec in seen:
            assert gone(rec, "ring"), "the pinned ring outlived the failed load"
            assert gone(rec, "arena"), "the device arena outlived the failed load"
        assert _fds() <= fds, f"file descriptors left open: {sorted(_fds() - fds)}"
        assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]

    return check


@pytest.fixture
def dense(tmp_path):
    return synth(tmp_path, "dense", layers=1)


def _plan_file(tmp_path, path, rules=None, io=None) -> tuple[Path, object]:
    plan = compile_spec(spec_file(tmp_path, path, rules or [{"match": "*"}], io=io or dict(SMALL_IO, direct="off")))
    assert plan.fits
    save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json", plan


@pytest.mark.parametrize("change", ["truncate", "replace", "remove"])
def test_shard_changed_after_compile(tmp_path, capsys, dense, released, change):
    path, _ = dense
    plan_path, plan = _plan_file(tmp_path, path)
    if change == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 4096)
    elif change == "replace":  # another file of the same size moved into place, as a re-download does
        other = Path(path).with_suffix(".new")
        other.write_bytes(Path(path).read_bytes()[::-1])
        st_ = os.stat(path)
        os.utime(other, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
        os.replace(other, path)
    else:
        os.remove(path)
    code = "file-removed" if change == "remove" else "file-changed"
    with pytest.raises(FingerprintError) as ei:
        execute(plan)
    assert ei.value.code == code and ei.value.exit_code == 2
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 2 and out == "" and path in one_line(err) and err.strip().endswith(f"[{code}]")
    released(allocated=False)


def test_read_failing_mid_load(tmp_path, capsys, dense, released, monkeypatch):
    """The disk fails (EIO) on the fifth read: ReadError, exit 2, everything released."""
    path, _ = dense
    plan_path, plan = _plan_file(tmp_path, path, io={"slot": 4096, "slots": 2, "workers": 2, "direct": "off"})
    assert plan.totals.requests > 5
    calls = fail_read_at(monkeypatch, 5)
    with pytest.raises(ReadError) as ei:
        execute(plan)
    assert ei.value.code == "read-failed" and ei.value.exit_code == 2 and "Input/output error" in ei.value.message
    released()
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 2 and out == "" and one_line(err).endswith("[read-failed]") and path in err
    released()


def test_interrupt_during_the_load_in_process(tmp_path, capsys, dense, released, monkeypatch):
    """KeyboardInterrupt in the middle of the pipeline: Interrupted (exit 130), everything released."""
    path, _ = dense
    plan_path, plan = _plan_file(tmp_path, path, io={"slot": 4096, "slots": 2, "workers": 2, "direct": "off"})
    calls = interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted) as ei:
        execute(plan)
    assert ei.value.code == "interrupted" and ei.value.exit_code == 130
    released()
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 130 and out == "" and "interrupted during the load" in one_line(err)
    released()


def _slow_plan(tmp_path) -> tuple[Path, str]:
    """A plan that takes many seconds under the simulator: every element goes through a simulated kernel."""
    path, _ = synth(tmp_path, "dense", size_bytes=512 * 1024)
    plan_path, _ = _plan_file(tmp_path, path, rules=[{"match": "*", "dtype": "float32"}],
                              io={"slot": 4096, "slots": 2, "workers": 1, "run": "64KiB", "direct": "off"})
    return plan_path, path


def _start(plan_path: Path) -> subprocess.Popen:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop("PLANC_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "planc", "run", str(plan_path), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt(proc: subprocess.Popen) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("planc run did not stop within 60 s of SIGINT") from None
    return proc.returncode, out, err


def test_sigint_during_the_load(tmp_path):
    """`planc run` gets SIGINT while it loads (its reader holds the checkpoint open): exit 130, one line."""
    plan_path, path = _slow_plan(tmp_path)
    proc = _start(plan_path)
    deadline = time.monotonic() + 30
    while not holds_open(proc.pid, path):
        assert proc.poll() is None, f"planc run ended before it was interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "the load never started"
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None, "the load finished before it could be interrupted: make it slower"
    rc, out, err = _interrupt(proc)
    # 130, or the signal itself: an interrupt that landed while numba's native libraries loaded leaves the
    # interpreter to end by SIGINT after planc's own exit (shells report both as 130).
    assert rc in (130, -signal.SIGINT) and out == ""
    line = one_line(err)
    assert "interrupted during the load" in line and line.endswith("[interrupted]")


def test_interrupt_before_the_load(tmp_path, capsys, dense, monkeypatch):
    """Ctrl-C while `planc run` compiles: typer turns it into exit code 130; planc says so on one line."""
    path, _ = dense
    spec = spec_file(tmp_path, path, [{"match": "*"}], io=SMALL_IO)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("planc.compiler.compile.compile_loaded", interrupted)  # the compile `run` makes of a spec
    rc, out, err = cli_run(capsys, "run", spec, "--json")
    assert rc == 130 and out == "" and one_line(err) == "planc: interrupted"


def test_interrupt_dropped_by_python_still_ends_the_run(tmp_path, capsys, dense, released, monkeypatch):
    """A KeyboardInterrupt raised inside a weakref callback or a __del__ is dropped by Python, and the load
    goes on; `planc run` remembers the SIGINT and ends as interrupted, the loaded model freed."""
    path, _ = dense
    plan_path, _ = _plan_file(tmp_path, path, io={"slot": 4096, "slots": 2, "workers": 2, "direct": "off"})
    calls = []

    def observe(event):  # the 3rd read sent on to the device: a SIGINT that Python drops
        if isinstance(event, CopyIssued) and event.request is not None:
            calls.append(1)
            if len(calls) == 3:
                try:
                    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
                except KeyboardInterrupt:
                    pass  # what Python does with it in a weakref callback

    use_parts(monkeypatch, observer=observe)
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 130 and out == "" and "interrupted during the load" in one_line(err)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    released()


def _host_path_plan(tmp_path, dense):
    path, _ = dense
    rules = [{"match": "*.mlp.*", "dtype": "float32", "on": "host"}, {"match": "*"}]
    plan_path, plan = _plan_file(tmp_path, path, rules=rules, io={"slot": 4096, "slots": 2, "run": "8KiB",
                                                                  "direct": "off"})
    host_runs = [r["index"] for r in plan.to_dict()["runs"] if r["host_bytes"]]
    assert len(host_runs) >= 2
    return plan_path, plan, host_runs


def test_live_room_shrinks_below_a_run(tmp_path, capsys, dense, released, monkeypatch):
    """Room for the first host-path run, none after: the second waits for in-flight runs, then is refused."""
    plan_path, plan, host_runs = _host_path_plan(tmp_path, dense)
    calls = live_room_by_call(monkeypatch, lambda k: 2**40 if k == 1 else 0)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    second = next(r for r in plan.to_dict()["runs"] if r["index"] == host_runs[1])
    assert ei.value.code == "live-room" and ei.value.exit_code == 3
    r = ei.value.refusal
    assert (r.run, r.needed_bytes, r.allowed_bytes) == (second["index"], second["host_bytes"], 0)
    assert len(calls) == 3, "run 1 admitted; run 2 checked, waited for the runs in flight, checked again"
    released()
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 3 and out == "" and one_line(err).endswith("[live-room]")
    assert f"refused at run {second['index']}" in err
    released()


def test_file_system_refusing_o_direct(tmp_path, capsys, dense, monkeypatch):
    """io.direct: on asks for O_DIRECT; a file system that refuses it (EINVAL at open) gets buffered reads
    under `auto`, said so in the report, and a named refusal under `on`."""
    path, _ = dense
    refuse_direct_open(monkeypatch)  # and a cold cache
    auto = spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="auto"), name="auto.yaml")
    rc, out, err = cli_run(capsys, "run", auto)
    assert rc == 0 and "reads: file system refuses O_DIRECT: 1 file(s)" in out
    rc, out, err = cli_run(capsys, "run", auto, "--json")
    assert rc == 0 and json.loads(out)["files"]["model.safetensors"] == {
        "direct": False, "why": "file system refuses O_DIRECT"}
    on = spec_file(tmp_path, path, [{"match": "*"}], io=dict(SMALL_IO, direct="on"), name="on.yaml")
    rc, out, err = cli_run(capsys, "run", on, "--json")
    assert rc == 2 and one_line(err).endswith("[direct-refused]")


# ------------------------------------------------------------------------------------------
# 4. repeated loads


def test_hundred_load_free_cycles_do_not_grow_rss(tmp_path):
    rng = np.random.default_rng(5)
    path, _ = handmade(tmp_path, {f"layer.{i}.w": rng.standard_normal((16, 24 + i)).astype(np.float32)
                                  for i in range(6)})
    plan = compile_spec(spec_file(tmp_path, path, [{"match": "*"}],
                                  io={"slot": 4096, "slots": 2, "workers": 2, "direct": "off"}))
    assert plan.totals.kernels == 0
    rss = {}
    # Every load ends with full garbage collections (planc.execute.alloc.release); frozen, the objects
    # of the test session are not walked again each time. What is measured does not change.
    gc.collect()
    gc.freeze()
    try:
        for cycle in range(1, 101):
            model = execute(plan)
            assert len(model) == len(plan.to_dict()["tensors"])
            model.free()
            del model
            if cycle in (10, 100):
                gc.collect()
                rss[cycle] = rss_bytes()
    finally:
        gc.unfreeze()
    growth = rss[100] - rss[10]
    assert growth <= 8 * 2**20, f"RSS grew {growth:,} bytes from cycle 10 to cycle 100"


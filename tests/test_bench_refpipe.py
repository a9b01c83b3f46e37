"""bench/refpipe.py (the reference pipeline) without a GPU: the readers into the ring on a real
safetensors checkpoint, every slice hashed against the file; the full pipeline on a simulated device
whose copies run late on a thread of their own, the device bytes compared with the files (and a
pipeline that refills a slot before its copy ran caught); the CLI's fresh processes end to end; the
loader `reference` as bench/loaders.py and bench/peers.py see it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_st

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def _module(name: str):
    """bench/NAME.py as module NAME, leaving sys.path and the other bench modules as they were (bench/
    first on the path would hide packages such as gguf from later tests); `refpipe` stays, as
    loaders.py imports it by that name."""
    path, before = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = path
        for k in set(sys.modules) - before - {"refpipe"}:
            if str(getattr(sys.modules[k], "__file__", "") or "").startswith(str(BENCH)):
                del sys.modules[k]


@pytest.fixture(scope="module")
def rp():
    return _module("refpipe")


@pytest.fixture()
def ckpt(tmp_path):
    rng = np.random.default_rng(7)
    for k in range(3):  # sizes that are no multiple of the slot: every file ends in a short slice
        write_st(tmp_path / "ck" / f"model-{k:05d}-of-00003.safetensors",
                 {f"layers.{k}.w{i}": rng.integers(0, 256, size=(300 + 17 * i, 129 + k), dtype=np.uint8)
                  for i in range(5)})
    (tmp_path / "ck" / "notes.txt").write_text("not a shard")
    return tmp_path / "ck"


def test_sizes_modes_slices(rp, ckpt):
    assert [rp.parse_size(x) for x in ("16MiB", "64M", "1GiB", "4096", "2KB")] == [16 << 20, 64 << 20, 1 << 30, 4096, 2000]
    for bad in ("", "16XB", "-1", "0", "1.5GiB"):
        with pytest.raises(ValueError):
            rp.parse_size(bad)
    assert rp.parse_modes("read,copy,both,both@64MiB,both", 16 << 20) == [
        ("read", 16 << 20), ("copy", 16 << 20), ("both", 16 << 20), ("both", 64 << 20)]
    with pytest.raises(ValueError):
        rp.parse_modes("write", 1)
    assert rp.label("both", 64 << 20) == "both@64MiB"
    files = rp.files_of([ckpt])
    assert [Path(f).name for f in files] == [f"model-{k:05d}-of-00003.safetensors" for k in range(3)]
    sizes = [os.path.getsize(f) for f in files]
    jobs = rp.chunks_of(sizes, 10_000)
    for i, size in enumerate(sizes):  # the slices of a file cover it exactly, in order
        mine = [(off, n) for f, off, n in jobs if f == i]
        assert mine[0][0] == 0 and sum(n for _, n in mine) == size
        assert all(a + n == b for (a, n), (b, _) in zip(mine, mine[1:]))
        assert all(0 < n <= 10_000 for _, n in mine)
    with pytest.raises(FileNotFoundError):
        rp.files_of([ckpt / "missing"])


@pytest.mark.parametrize("threads,slot,slots", [(4, 8192, 6), (16, 3000, 3), (1, 1 << 20, 1)])
def test_read_lands_every_byte(rp, ckpt, threads, slot, slots):
    pipe = rp.Pipeline(rp.files_of([ckpt]), threads, slot, slots, device="none", mode="read")
    try:
        r = pipe.run_read(check=True)
    finally:
        pipe.close()
    assert r["verify"] == "ok" and r["verify_hash"] == r["file_hash"]
    assert r["reads"] == r["chunks"] == len(pipe.jobs) and r["bytes"] == sum(pipe.sizes)
    assert r["device"] == "none" and "not pinned" in r["ring"] and r["gb_per_s"] > 0


@pytest.mark.parametrize("mode", ["both", "copy"])
def test_both_and_copy_on_a_simulated_device(rp, ckpt, mode):
    pipe = rp.Pipeline(rp.files_of([ckpt]), 4, 4096, 4, device="sim", mode=mode)
    try:
        r = pipe.run(mode)
        assert r["ttfb_seconds"] >= 0 and r["alloc_seconds"] >= 0 and r["wall_seconds"] > 0
        if mode == "both":
            assert pipe.verify()["verify"] == "ok"
            assert r["reads"] == len(pipe.jobs)
        else:  # the ring's bytes (ones), not the files'
            assert all(np.all(d == 1) for d in pipe.keep)
    finally:
        pipe.close()


def test_a_slot_refilled_before_its_copy_is_caught(rp, ckpt):
    """Without the wait on the slot's event, readers overwrite slots whose copies have not run."""
    pipe = rp.Pipeline(rp.files_of([ckpt]), 4, 4096, 2, device="sim", mode="both")
    pipe.dev.delay = 0.005
    pipe.dev.wait = lambda ev: None
    try:
        pipe.run_both()
        assert pipe.verify()["verify"].startswith("MISMATCH")
    finally:
        pipe.close()


def test_cli_fresh_processes(rp, ckpt, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, str(BENCH / "refpipe.py"), str(ckpt), str(out), "--modes", "read,both,both@2KiB",
                        "--repeat", "2", "--threads", "3", "--slot", "8KiB", "--slots", "5", "--device", "sim",
                        "--verify", "--verify-read"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    doc = json.loads((out / "refpipe.json").read_text())
    runs = doc["runs"]
    assert [(r["rep"], r["mode"], r["slot"]) for r in runs] == [(-1, "read", 8192)] + [
        (rep, m, s) for rep in (0, 1) for m, s in (("read", 8192), ("both", 8192), ("both", 2048))]
    assert not [r for r in runs if "error" in r]
    assert {r["verify"] for r in runs if "verify" in r} == {"ok"}
    assert [(r["mode"], r["slot"]) for r in runs if "verify" in r] == [("read", 8192), ("both", 8192), ("both", 2048)]
    med = doc["medians"]
    assert set(med) == {"read@8KiB", "both@8KiB", "both@2KiB"} and all(m["n"] == 2 for m in med.values())
    assert med["both@8KiB"]["gb_per_s"] > 0 and "ttfb_seconds" in med["both@8KiB"]
    assert len((out / "refpipe.jsonl").read_text().splitlines()) == len(runs)
    assert "both@8KiB" in p.stdout and "== refpipe medians" in p.stdout


def test_cli_read_without_torch_says_so(rp, ckpt, tmp_path):
    """`auto` on a machine without torch or CUDA: read runs on a numpy ring and says it; copy and
    both are reported as errors, naming why."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True, env=env).stdout.strip() == "True"
    if cuda:
        pytest.skip("CUDA is here: auto uses it")
    p = subprocess.run([sys.executable, str(BENCH / "refpipe.py"), str(ckpt), str(tmp_path / "o"), "--modes", "read,copy",
                        "--repeat", "1", "--slot", "16KiB", "--verify-read"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    runs = json.loads((tmp_path / "o" / "refpipe.json").read_text())["runs"]
    reads = [r for r in runs if r["mode"] == "read"]
    assert all("not pinned" in r["ring"] for r in reads) and reads[0]["verify"] == "ok"
    (copy,) = [r for r in runs if r["mode"] == "copy"]
    assert "needs a CUDA device" in copy["error"]
    assert "not pinned" in p.stdout


def test_the_loader_reference(rp, ckpt):
    loaders = _module("loaders")
    run, setup = loaders.LOADERS["reference"]
    assert setup.__name__ == "_reference_setup" and run.__name__ == "reference_run"
    files = loaders.files_of(str(ckpt))
    pipe = rp.Pipeline(files, 4, 4096, 4, device="sim")  # what setup builds, on the simulated device
    try:
        r = run(files, pipe)
        assert r["bytes"] == sum(os.path.getsize(f) for f in files)
        assert r["inner_gb_per_s"] > 0 and r["inner_seconds"] > 0 and r["slots"] == 4 and r["ttfb_seconds"] >= 0
        assert pipe.keep is not None and pipe.verify()["verify"] == "ok"  # kept past the clock
        json.dumps(r)
    finally:
        pipe.close()
    peers = _module("peers")
    assert "reference" in peers.CEILINGS and "reference" in peers.ALL


class _FakeTorch:
    """The few torch calls TorchDevice makes, on numpy, copies done at once: it checks the calls and
    their arguments as written against torch's names (torch itself is not here)."""

    uint8 = np.uint8
    __version__ = "fake"

    class version:
        cuda = "fake"

    class Tensor:
        def __init__(self, a, pinned=False, cuda=False):
            self.a, self.pinned, self.cuda_ = a, pinned, cuda

        def __getitem__(self, sl):
            assert isinstance(sl, slice) and sl.step is None
            return _FakeTorch.Tensor(self.a[sl], self.pinned, self.cuda_)

        def numpy(self):
            assert not self.cuda_
            return self.a

        def is_pinned(self):
            return self.pinned

        def copy_(self, src, non_blocking=False):
            assert self.cuda_ and src.pinned and non_blocking and _FakeTorch.cuda.current is not None
            assert self.a.shape == src.a.shape
            self.a[:] = src.a
            return self

        def cpu(self):
            return _FakeTorch.Tensor(self.a.copy())

    @staticmethod
    def empty(n, dtype=None, device=None, pin_memory=False):
        assert dtype in (None, np.uint8) and device in (None, "cuda") and not (pin_memory and device)
        return _FakeTorch.Tensor(np.zeros(n, dtype=np.uint8), pin_memory, device == "cuda")

    class cuda:
        current = None

        @staticmethod
        def is_available():
            return True

        @staticmethod
        def init():
            pass

        @staticmethod
        def get_device_name(i):
            return "fake GPU"

        @staticmethod
        def synchronize():
            pass

        class Stream:
            def synchronize(self):
                pass

        class Event:
            def __init__(self, enable_timing=False):
                self.timing, self.t = enable_timing, None

            def record(self, stream=None):
                assert isinstance(stream, _FakeTorch.cuda.Stream)
                import time
                self.t = time.perf_counter()

            def synchronize(self):
                assert self.t is not None

            def elapsed_time(self, other):
                assert self.timing and other.timing
                return (other.t - self.t) * 1e3

        class stream:
            def __init__(self, s):
                assert isinstance(s, _FakeTorch.cuda.Stream)
                self.s = s

            def __enter__(self):
                self.prev, _FakeTorch.cuda.current = _FakeTorch.cuda.current, self.s

            def __exit__(self, *a):
                _FakeTorch.cuda.current = self.prev


def test_torch_calls_against_a_stand_in(rp, ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch)
    monkeypatch.setenv("REFPIPE_SLOT", "4KiB")
    monkeypatch.setenv("REFPIPE_SLOTS", "3")
    files = rp.files_of([ckpt])
    for mode in ("read", "copy", "both"):
        pipe = rp.Pipeline(files, 4, 4096, 3, device="auto", mode=mode)
        try:
            assert pipe.dev.name == "torch"
            r = pipe.run(mode, check=True)
            assert r["ring_pinned"] and r["pinned_bytes"] == 3 * 4096 and r["device"] == "fake GPU"
            if mode != "read":
                assert r["ttfb_seconds"] >= 0
            assert (pipe.verify() if mode == "both" else r if mode == "read" else {"verify": "ok"})["verify"] == "ok"
        finally:
            pipe.close()
    pipe = rp.loader_setup(files)
    try:
        assert (pipe.slot, pipe.slots, pipe.threads) == (4096, 3, rp.THREADS)
        r = rp.loader_run(files, pipe)
        assert r["bytes"] == pipe.nbytes and pipe.verify()["verify"] == "ok"
    finally:
        pipe.close()


def test_a_loader_variant_names_its_environment():
    """`bench/peers.py --loaders planc,planc@PLANC_RING=kept`: the same loader in an environment
    of its own, alternated with the others (an A/B of a setting side by side)."""
    peers = _module("peers")
    assert peers.variant("planc") == ("planc", {})
    assert peers.variant("planc@PLANC_RING=kept+PLANC_ISSUE_GIL=release") == (
        "planc", {"PLANC_RING": "kept", "PLANC_ISSUE_GIL": "release"})
    assert peers.variant("reference@REFPIPE_SLOTS=16") == ("reference", {"REFPIPE_SLOTS": "16"})
    assert peers.variant("planc@") == ("planc", {})
    for bad in ("planc@PLANC_RING", "planc@=kept"):
        with pytest.raises(SystemExit, match="NAME@VAR=VALUE"):
            peers.variant(bad)

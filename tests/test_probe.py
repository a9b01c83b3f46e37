"""`planc probe` measures the I/O cost figures, keeps them, and `compile` chooses by them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from planc.plan import costs as costmodel
from planc.face.cli import main
from planc.compiler.compile import compile_spec
from planc.plan.explain import explain_doc


def test_probe_writes_figures_that_compile_reads(tmp_path, monkeypatch, capsys):
    out = tmp_path / "probe.json"
    assert main(["probe", str(tmp_path / "scratch"), "-o", str(out)]) == 2  # a folder that does not exist
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "scratch").exists() and not out.exists()
    (tmp_path / "scratch").mkdir()
    rc = main(["probe", str(tmp_path / "scratch"), "--size", "64MiB", "--workers", "2", "--repeat", "1",
               "-o", str(out), "--json"])
    assert rc == 0
    doc = json.loads(out.read_text())
    printed = json.loads(capsys.readouterr().out)
    assert printed["saved"] == str(out) and printed["page_s"] == doc["page_s"]
    for k in ("page_s", "copy_byte_s", "read_byte_s", "request_s"):
        assert 0 < doc[k] < 1 and 0 < doc["cold"][k] < 1
    assert 0 < doc["disk_byte_s"] == doc["cold"]["disk_byte_s"] < 1  # O_DIRECT where the file system takes it
    assert isinstance(doc["cold"]["disk_direct"], bool)
    assert not list((tmp_path / "scratch").iterdir())  # the scratch file is gone

    save_file({"w": np.zeros((64, 32), np.float16)}, str(tmp_path / "m.safetensors"))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"checkpoint": "m.safetensors", "budget": {"host": "64MiB"},
                                    "tensor_parallel": {"size": 4}, "rules": [{"match": "w", "split": {"dim": 1}}]}))
    monkeypatch.setenv("PLANC_PROBE", str(out))
    plan = compile_spec(spec, 1)
    assert plan.costs.source == str(out) and plan.costs.page_s == doc["page_s"]
    assert plan.costs.disk_byte_s == doc["disk_byte_s"]
    (s,) = explain_doc(plan)["strided_reads"]
    assert s["method"] in ("mapped", "rows") and s["segments"] == 64 and s["segment_bytes"] == 16
    assert explain_doc(plan)["costs"]["source"] == str(out)


def test_a_damaged_or_absent_probe_file_means_the_defaults(tmp_path, monkeypatch):
    bad = tmp_path / "probe.json"
    for text in ("{", json.dumps({"page_s": -1, "copy_byte_s": 1, "read_byte_s": 1, "request_s": 1}), "[]"):
        bad.write_text(text)
        assert costmodel.load_costs(bad) == costmodel.DEFAULTS
    bad.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-10, "request_s": 1e-5,
                               "disk_byte_s": "fast"}))
    assert costmodel.load_costs(bad) == costmodel.DEFAULTS  # a damaged disk figure: none of the file's figures
    good = {"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-10, "request_s": 1e-5}
    for disk in ("1" + "0" * 400, '"5e-10"', "true", "0", "1e999"):
        bad.write_text(json.dumps(good)[:-1] + f', "disk_byte_s": {disk}}}')
        assert costmodel.load_costs(bad) == costmodel.DEFAULTS, disk  # never an error, never a string
    monkeypatch.setenv("PLANC_PROBE", str(tmp_path / "missing.json"))
    assert costmodel.load_costs() == costmodel.DEFAULTS
    monkeypatch.setenv("PLANC_PROBE", "off")
    assert costmodel.load_costs() == costmodel.DEFAULTS


def test_choice_follows_the_figures():
    """Mapped reads of narrow slices, whole rows when reading rows is much cheaper per byte."""
    c = costmodel.DEFAULTS
    assert costmodel.choose(c, 1024, 8192, 4096, 16 << 20)[0] == "mapped"
    cheap_rows = c._replace(page_s=1e-5)
    assert costmodel.choose(cheap_rows, 1024, 8192, 4096, 16 << 20)[0] == "rows"
    assert costmodel.choose(c, 32 << 20, 64 << 20, 4, 16 << 20)[0] == "rows"  # a segment longer than a slot
    assert costmodel.choose(c, 1024, 8192, 4096, 16 << 20, "rows")[0] == "rows"


def test_a_probe_file_without_a_disk_figure_has_the_built_in_one(tmp_path):
    """Probe files from before the disk figure, and probes whose page cache could not be dropped."""
    old = tmp_path / "probe.json"
    old.write_text(json.dumps({"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-10, "request_s": 1e-5}))
    c = costmodel.load_costs(old)
    assert c.source == str(old) and c.page_s == 1e-7 and c.disk_byte_s == costmodel.DEFAULTS.disk_byte_s


def test_the_probe_s_buffers_are_aligned_and_populated():
    """O_DIRECT reads need page-aligned buffers; timed reads must not fault in their destination."""
    import ctypes
    import mmap

    from planc.tools import probe

    for b in probe._buffers(3, 1 << 20):
        assert b.ctypes.data % mmap.PAGESIZE == 0 and b.flags.writeable and b.nbytes == 1 << 20
        vec = (ctypes.c_ubyte * 256)()
        libc = ctypes.CDLL(None)
        assert libc.mincore(ctypes.c_void_p(b.ctypes.data), ctypes.c_size_t(b.nbytes), vec) == 0
        assert all(v & 1 for v in vec)  # every page resident before any read


def test_a_file_system_that_refuses_o_direct_reads_gets_buffered_disk_reads(tmp_path, monkeypatch):
    """O_DIRECT taken at open but its reads refused (EINVAL): the probe's disk figure is read
    buffered instead, and says so, rather than failing."""
    import errno
    import fcntl
    import os as _os

    from planc.tools import probe

    real = _os.preadv

    def preadv(fd, bufs, offset):  # as such a file system answers a read of a descriptor opened O_DIRECT
        if fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(_os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, offset)

    monkeypatch.setattr(_os, "preadv", preadv)
    doc = probe.measure(tmp_path, 64 << 20, workers=2, repeat=1)
    assert doc["cold"]["disk_direct"] is False and 0 < doc["cold"]["disk_byte_s"] < 1


def test_the_link_probe_copies_pinned_bytes_to_the_device():
    """`measure_link` on the load's device (the simulator here: its copies are real copies of the
    pinned bytes into device memory): the figure is the median time over the bytes copied."""
    from planc.execute.device import seam
    from planc.tools.probe import measure_link

    got = measure_link(seam.default_device(), 8 << 20, piece=1 << 20, repeat=3)
    assert got["link_bytes"] == 8 << 20 and got["link_copy_bytes"] == 1 << 20
    assert 0 < got["link_byte_s"] < 1
    assert got["link_gbps"] == pytest.approx(1 / got["link_byte_s"] / 1e9)
    odd = measure_link(seam.default_device(), (8 << 20) + 123, piece=3 << 20, repeat=1)
    assert odd["link_bytes"] == 6 << 20  # whole copies only


def test_probe_says_why_it_measured_no_link(tmp_path, capsys):
    """Under the simulator (the tests' device) `planc probe` keeps no link figure, says why in the
    document and the text, and compile then keeps the built-in link; a bad --device is refused first."""
    out = tmp_path / "probe.json"
    (tmp_path / "scratch").mkdir()
    assert main(["probe", str(tmp_path / "scratch"), "--device", "gpu0", "-o", str(out)]) == 2
    assert "--device gpu0: expected cuda or cuda:N" in capsys.readouterr().err and not out.exists()
    args = ["probe", str(tmp_path / "scratch"), "--size", "64MiB", "--workers", "2", "--repeat", "1", "-o", str(out)]
    assert main(args + ["--json"]) == 0
    doc = json.loads(out.read_text())
    printed = json.loads(capsys.readouterr().out)
    assert "link_byte_s" not in doc and printed["link"] == {"measured": False,
                                                            "why": "the device is simulated (NUMBA_ENABLE_CUDASIM=1)"}
    assert costmodel.load_costs(out).link_byte_s == costmodel.DEFAULTS.link_byte_s
    assert main(args + ["--no-link"]) == 0
    assert "link: not measured, not asked (--no-link)" in capsys.readouterr().out


def test_a_probe_file_s_link_figure_is_checked(tmp_path):
    base = {"page_s": 1e-7, "copy_byte_s": 1e-10, "read_byte_s": 1e-11, "request_s": 1e-6}
    p = tmp_path / "probe.json"
    p.write_text(json.dumps({**base, "link_byte_s": 1 / 25e9}))
    assert costmodel.load_costs(p).link_byte_s == 1 / 25e9
    for bad in ("fast", 0, -1e-10, 3.0, None):
        p.write_text(json.dumps({**base, "link_byte_s": bad}))
        assert costmodel.load_costs(p) == costmodel.DEFAULTS, bad


def test_a_link_probe_that_fails_keeps_the_read_figures(tmp_path):
    """The device refusing the link probe's pinned memory: the document keeps every read figure and
    says why it has no link, instead of losing a minute of measuring."""
    from planc.base.codes import Code
    from planc.base.errors import ExecuteError
    from planc.execute.device import seam
    from planc.tools.probe import measure, measure_link

    class NoPinning:
        def __getattr__(self, name):
            return getattr(seam.default_device(), name)

        def pinned_bytes(self, n):
            raise ExecuteError("cuMemHostAlloc failed: out of memory", code=Code.CUDA)

    (tmp_path / "scratch").mkdir()
    doc = measure(tmp_path / "scratch", 64 << 20, 2, 1, link=NoPinning())
    assert 0 < doc["read_byte_s"] < 1 and "link_byte_s" not in doc
    assert doc["link"]["measured"] is False
    assert doc["link"]["why"].startswith("the link probe failed: cuMemHostAlloc failed: out of memory")
    for size, repeat in ((4095, 1), (1 << 20, 0)):
        with pytest.raises(ValueError, match="at least"):
            measure_link(seam.default_device(), size, repeat=repeat)


def test_probe_refuses_a_bad_setting_before_measuring(tmp_path, capsys, monkeypatch):
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("PLANC_ISSUE_GIL", "bogus")
    out = tmp_path / "probe.json"
    assert main(["probe", str(tmp_path / "scratch"), "--size", "64MiB", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "PLANC_ISSUE_GIL" in err and "bad-env" in err and not out.exists()


def test_a_scratch_file_that_cannot_be_written_is_not_left_behind(tmp_path):
    """A full disk while the scratch file is written (here a file-size limit of 1 MiB, a real
    EFBIG from the kernel): the command fails with the folder named, and the folder holds nothing."""
    import os
    import resource
    import subprocess
    import sys

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "PLANC_PROBE": str(tmp_path / "probe.json"), "NUMBA_ENABLE_CUDASIM": "1"}

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = subprocess.run([sys.executable, "-m", "planc", "probe", str(scratch), "--size", "64MiB", "--repeat", "1",
                        "--no-link"], env=env, preexec_fn=limit, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "scratch" in r.stderr, r.stderr
    assert list(scratch.iterdir()) == [] and not (tmp_path / "probe.json").exists()

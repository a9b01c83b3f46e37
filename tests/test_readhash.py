"""The digest's read-and-hash loop (`planc.execute.io.readhash`, machine code in
planc/execute/io/native): real reads from a real file, digests against the xxhash package's."""

import hashlib
import json
import os
import platform
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planc.execute.io import readhash
from planc.execute.io.reader import Reader

ON_X86_LINUX = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


ROOT = Path(__file__).resolve().parent.parent
HAS_CC = bool(shutil.which((os.environ.get("CC") or "cc").split()[0]) or shutil.which("gcc"))


def _setup():
    return runpy.run_path(str(ROOT / "setup.py"), run_name="planc_setup")


@pytest.mark.skipif(not (ON_X86_LINUX and HAS_CC), reason="the loop is built for x86-64 Linux, with a C compiler")
def test_the_installed_object_is_built_from_the_current_source():
    """Installing planc built it (setup.py); after an edit of readhash.c it is stale until rebuilt."""
    assert readhash.OBJECT.is_file() and readhash.INDEX.is_file(), readhash.stale_reason()
    doc = json.loads(readhash.INDEX.read_text())[readhash.OBJECT.name]
    assert doc["source_sha256"] == hashlib.sha256(readhash.SOURCE.read_bytes()).hexdigest(), \
        "planc/execute/io/native/readhash.c changed: run tools/build_native.sh (or install planc again)"
    assert doc["sha256"] == hashlib.sha256(readhash.OBJECT.read_bytes()).hexdigest()
    assert readhash.stale_reason() is None


@pytest.mark.skipif(not (ON_X86_LINUX and HAS_CC), reason="the loop is built for x86-64 Linux, with a C compiler")
def test_the_build_step_builds_it_from_the_source_and_says_so(tmp_path):
    """setup.py's build step, as the install runs it: the object and native.json naming its source;
    an object that is absent or was built from another source is not used, with how to rebuild."""
    ns = _setup()
    assert ns["build_native"](tmp_path, werror=True) is None
    obj, index = tmp_path / readhash.OBJECT.name, tmp_path / readhash.INDEX.name
    assert readhash.stale_reason(obj, index) is None
    other = tmp_path / "other.c"
    other.write_bytes(readhash.SOURCE.read_bytes() + b"\n")
    assert "built from another" in readhash.stale_reason(obj, index, other)
    obj.write_bytes(obj.read_bytes() + b"\0")
    assert "not the object" in readhash.stale_reason(obj, index)
    obj.unlink()
    assert "install planc again" in readhash.stale_reason(obj, index)


def test_no_compiler_leaves_the_install_without_the_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    why = _setup()["build_native"](tmp_path / "out")
    assert why and ("no-such-cc" in why or "not x86-64" in why)
    assert not (tmp_path / "out" / readhash.OBJECT.name).exists()


@pytest.mark.skipif(not (ON_X86_LINUX and HAS_CC), reason="the loop is built for x86-64 Linux, with a C compiler")
def test_it_loads_here():
    assert readhash.load() is not None, readhash.why_not


@pytest.fixture
def native():
    rh = readhash.load()
    if rh is None:
        pytest.skip(readhash.why_not)
    return rh


LEVELS = sorted(readhash.LEVELS, key=readhash.LEVELS.get)


def _runs(native, level):
    if readhash.LEVELS[level] > native.widest:
        pytest.skip(f"this processor or system does not run {level}")


@pytest.fixture
def data_file(tmp_path):
    data = np.random.default_rng(7).integers(0, 256, 3_000_000, dtype=np.uint8)
    f = tmp_path / "f.bin"
    f.write_bytes(data.tobytes())
    return f, data.tobytes()


@pytest.mark.parametrize("offset,needed,piece,spans", [
    (0, 3_000_000, 4096, [(0, 3_000_000)]),
    (4096, 1 << 20, 65536, [(0, 1 << 18), (1 << 18, 1 << 19), (600_000, 1 << 20)]),  # a gap between spans
    (70_000, 900_001, 8192, [(10, 11), (62_000, 500_000), (500_000, 900_001)]),  # odd offsets, a one-byte span
    (2_999_000, 1000, 1 << 20, [(0, 1000)]),  # the file's end
    (123, 1000, 4096, []),  # nothing to hash: a read all the same
])
@pytest.mark.parametrize("level", LEVELS)
def test_reads_and_hashes_like_xxhash(native, data_file, offset, needed, piece, spans, level):
    _runs(native, level)
    f, data = data_file
    fd = os.open(f, os.O_RDONLY)
    try:
        buf = np.zeros(needed + 4096, np.uint8)
        got, digests = native.read(fd, buf, offset, needed, needed, piece, False, spans, level)
    finally:
        os.close(fd)
    assert got == needed and buf[:needed].tobytes() == data[offset:offset + needed]
    assert digests == [xxhash.xxh3_128(data[offset + a:offset + b]).digest() for a, b in spans]


@pytest.mark.parametrize("level", LEVELS[1:])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 40_000), min_size=1, max_size=8), gaps=st.lists(st.booleans(), min_size=8,
       max_size=8), piece=st.sampled_from([64, 100, 1000, 1024, 4096, 65536]), start=st.integers(0, 5000))
def test_the_stripe_path_at_any_length_and_piece(native, data_file, level, cuts, gaps, piece, start):
    """XXH3's long path keeps its last stripe for the end and scrambles after each 16 stripes: the
    leaves' lengths around 240 / 1024 / 1088 bytes and their pieces' ends anywhere."""
    _runs(native, level)
    f, data = data_file
    bounds = sorted(set(cuts) | {0})
    lengths = [b - a for a, b in zip(bounds, bounds[1:])] + [241, 1024, 1025, 1088, 1087, 16384, 16448]
    spans, at = [], 0
    for n, gap in zip(lengths, gaps * 4):
        at += 7 if gap else 0
        spans.append((at, at + n))
        at += n
    fd = os.open(f, os.O_RDONLY)
    try:
        buf = np.zeros(at, np.uint8)
        got, digests = native.read(fd, buf, start, at, at, piece, False, spans, level)
    finally:
        os.close(fd)
    assert got == at
    assert digests == [xxhash.xxh3_128(data[start + a:start + b]).digest() for a, b in spans]


def test_the_level_is_capped_and_named(native):
    assert native.level("best") == native.widest >= readhash.LEVELS["scalar"]
    assert native.level_name("avx512") in readhash.LEVELS
    with pytest.raises(ValueError, match="level is 'best'"):
        native.level("sse9")


def test_the_file_ending_early_and_a_failed_read_give_no_digests(native, data_file):
    f, data = data_file
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(1 << 20, np.uint8)
    try:
        got, digests = native.read(fd, buf, 2_500_000, 1 << 20, 1 << 20, 65536, False, [(0, 1 << 20)])
        assert got == 500_000 and digests == []  # the file ended: bytes read, nothing hashed as whole
    finally:
        os.close(fd)
    got, digests = native.read(fd, buf, 0, 4096, 4096, 4096, False, [(0, 4096)])  # a closed descriptor
    assert got == -1 and digests == []
    with pytest.raises(ValueError):
        native.read(0, bytes(10), 0, 10, 10, 4096, False, [])  # a read-only buffer


def test_the_states_are_reset_for_each_read(native, data_file):
    f, data = data_file
    fd = os.open(f, os.O_RDONLY)
    try:
        buf = np.zeros(1 << 20, np.uint8)
        native.read(fd, buf, 0, 1 << 20, 1 << 20, 65536, False, [(0, 1 << 20)])
        got, d = native.read(fd, buf, 1 << 20, 1 << 20, 1 << 20, 65536, False, [(0, 1 << 20)])
    finally:
        os.close(fd)
    assert d == [xxhash.xxh3_128(data[1 << 20:2 << 20]).digest()]


def test_reader_counts_one_request_and_its_bytes(native, data_file, tmp_path):
    f, data = data_file
    r = Reader(str(tmp_path), "off")
    r.open("f.bin", len(data))
    buf = np.zeros(1 << 20, np.uint8)
    got, d = r.read_hashing("f.bin", 8192, 1 << 20, buf, 1 << 20, [(0, 1 << 20)], native, 65536)
    assert (got, r.requests, r.bytes_read) == (1 << 20, 1, 1 << 20)
    assert r.read_hashing("f.bin", 2_500_000, 1 << 20, buf, 1 << 20, [(0, 1 << 20)], native, 65536) is None
    assert r.requests == 1  # a read that stopped short is not counted: the caller reads it again
    r.close()
    assert d == [xxhash.xxh3_128(data[8192:8192 + (1 << 20)]).digest()]


def test_spans_out_of_order_or_past_the_read_give_no_digests(native, data_file):
    """The loop checks its spans (sorted, disjoint, inside the read): otherwise -1 and nothing
    hashed, and the caller reads the request again its own way."""
    f, _ = data_file
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(1 << 20, np.uint8)
    try:
        for spans in ([(5000, 9000), (1000, 4000)], [(0, 5000), (4000, 9000)], [(0, 1 << 20)]):
            assert native.read(fd, buf, 0, 1 << 19, 1 << 20, 65536, False, spans) == (-1, [])
    finally:
        os.close(fd)


class _Wrong:
    """The loop with one of its functions answering wrong (a library whose XXH3 is not the package's)."""

    def __init__(self, rh, **wrong):
        self._rh, self._wrong = rh, wrong

    def __getattr__(self, name):
        return self._wrong.get(name) or getattr(self._rh, name)


def test_the_loop_s_digests_are_checked_when_it_loads(native):
    assert readhash._self_check(native) is None


def test_a_stripe_path_that_errs_is_not_used(native):
    def wrong_at_scalar(*a):
        got, digests = native.read(*a)
        return (got, [bytes(16)] + digests[1:]) if a[-1] == "scalar" else (got, digests)

    assert readhash._self_check(_Wrong(native, read=wrong_at_scalar)) == \
        "the read-and-hash loop's digests (scalar) differ from the xxhash package's"

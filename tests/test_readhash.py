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
    assert native.level("package") == 0 and native.level_name("avx512") in readhash.LEVELS
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


@pytest.mark.parametrize("n", [0, 1, 16, 240, 241, 256, 4096])
def test_the_extent_hash_is_xxhash_s(native, n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert native.digest(data) == xxhash.xxh3_128_digest(data)


class _Wrong:
    """The loop with one of its functions answering wrong (a library whose XXH3 is not the package's)."""

    def __init__(self, rh, **wrong):
        self._rh, self._wrong = rh, wrong

    def __getattr__(self, name):
        return self._wrong.get(name) or getattr(self._rh, name)


def test_a_loop_whose_digests_differ_from_the_package_s_is_not_used(native):
    """The check `load()` runs: a library whose XXH3 is not the package's (here: the one-shot hash
    made wrong) is refused with the reason, so the verifier hashes in Python."""
    assert readhash._self_check(native) is None
    assert "one-shot digests differ" in readhash._self_check(_Wrong(native, digest=lambda data: b"\0" * 16))


def test_a_stripe_path_that_errs_is_not_used(native):
    def wrong_at_scalar(*a):
        got, digests = native.read(*a)
        return (got, [bytes(16)] + digests[1:]) if a[-1] == "scalar" else (got, digests)

    assert readhash._self_check(_Wrong(native, read=wrong_at_scalar)) == \
        "the read-and-hash loop's digests (scalar) differ from the xxhash package's"


# -- copying out of a mapping of the file (PLANC_DIGEST_READ=mapped) --------------------------------


def _mapped_rss(addr: int) -> int:
    """Bytes of the mapping at `addr` present in this process (its `Rss` in /proc/self/smaps)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for k, line in enumerate(lines):
        lo = line.split(" ", 1)[0]
        if "-" in lo and int(lo.split("-")[0], 16) == addr:
            for more in lines[k + 1:]:
                if more.startswith("Rss:"):
                    return int(more.split()[1]) * 1024
    raise AssertionError("no such mapping")


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(0, 200_000), needed=st.integers(1, 1_500_000), skew=st.integers(0, 63),
       chunk=st.sampled_from([256, 4096, 65536, 1 << 20]), cuts=st.lists(st.integers(0, 1_500_000), max_size=5))
def test_a_mapped_copy_gives_the_file_s_bytes_and_the_package_s_digests(native, data_file, level, offset, needed, skew,
                                                                         chunk, cuts):
    _runs(native, level)
    f, data = data_file
    bounds = sorted({0, needed, *[c for c in cuts if c < needed]})
    spans = [(a, b) for a, b in zip(bounds, bounds[1:]) if b - a != 7]  # a gap where a span would be 7 bytes
    import mmap

    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    src = np.frombuffer(mm, np.uint8)
    base = src.__array_interface__["data"][0]
    buf = np.zeros(needed + 64, np.uint8)
    try:
        d = native.copy_mapped(base + offset, buf[skew:skew + needed], needed, spans, level, chunk)
        assert buf[skew:skew + needed].tobytes() == data[offset:offset + needed]
        assert not buf[:skew].any() and not buf[skew + needed:].any()  # nothing written outside the request
        assert d == [xxhash.xxh3_128(data[offset + a:offset + b]).digest() for a, b in spans]
    finally:
        src = None
        mm.close()


def test_a_reader_s_mapped_read_leaves_no_page_of_the_file_mapped(native, data_file, tmp_path):
    """The RSS holds a chunk of the mapping at most while a read copies, and nothing after it."""
    f, data = data_file
    r = Reader(str(tmp_path), "off")
    r.open("f.bin", len(data))
    buf = np.zeros(2 << 20, np.uint8)
    try:
        got, d = r.read_mapped("f.bin", 4096 + 3, 2 << 20, buf, 2_000_000, [(0, 2_000_000)], native)
        assert (got, r.requests, r.bytes_read, r.mapped_bytes) == (2_000_000, 1, 2_000_000, 2_000_000)
        assert d == [xxhash.xxh3_128(data[4099:4099 + 2_000_000]).digest()]
        assert buf[:2_000_000].tobytes() == data[4099:4099 + 2_000_000]
        addr, size = r.mapping("f.bin")
        assert size == len(data) and _mapped_rss(addr) == 0
    finally:
        r.close()
    assert r._maps == {}


def test_a_mapped_read_past_the_file_s_end_is_read_the_other_way(native, data_file, tmp_path):
    """A file cut short after it was mapped: the pages past its new end cannot be made present, so
    the copy stops without a fault and returns None (the caller reads again and says why)."""
    f, data = data_file
    r = Reader(str(tmp_path), "off")
    r.open("f.bin", len(data))
    buf = np.zeros(1 << 20, np.uint8)
    try:
        assert r.mapping("f.bin")[1] == len(data)
        os.truncate(f, 1 << 20)
        assert r.read_mapped("f.bin", 1 << 20, 1 << 20, buf, 1 << 20, [(0, 1 << 20)], native) is None
        assert r.read_mapped("f.bin", 0, 1 << 20, buf, 1 << 20, [(0, 1 << 20)], native) is not None
        assert r.requests == 1
    finally:
        r.close()


def test_a_file_read_with_o_direct_is_not_mapped(native, data_file, tmp_path):
    f, data = data_file
    r = Reader(str(tmp_path), "off")
    r.open("f.bin", len(data))
    r.files["f.bin"].direct = True  # as a cold file opened with O_DIRECT is marked
    try:
        assert r.read_mapped("f.bin", 0, 4096, np.zeros(4096, np.uint8), 4096, [(0, 4096)], native) is None
        assert r._maps == {}
    finally:
        r.files["f.bin"].direct = False
        r.close()


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(1, 400_000), plen=st.integers(1, 70_000), first=st.integers(1, 300_000),
       piece=st.sampled_from([4096, 65536]), more=st.integers(0, 100_000), mapped=st.booleans())
def test_a_leaf_begun_before_the_request_is_hashed_with_its_prefix(native, data_file, level, at, plen, first, piece,
                                                                   more, mapped):
    """The first span's leaf begins `plen` bytes before the request (those bytes given): its
    digest is the whole leaf's, at every level, read with pread or copied out of a mapping."""
    _runs(native, level)
    f, data = data_file
    plen = min(plen, at)
    needed = first + more
    prefix = data[at - plen:at]
    spans = [(0, first)] + ([(first, needed)] if more else [])
    want = [xxhash.xxh3_128(data[at - plen:at + first]).digest()] + (
        [xxhash.xxh3_128(data[at + first:at + needed]).digest()] if more else [])
    buf = np.zeros(needed, np.uint8)
    if mapped:
        import mmap

        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        src = np.frombuffer(mm, np.uint8)
        try:
            d = native.copy_mapped(src.__array_interface__["data"][0] + at, buf, needed, spans, level, 4096, prefix)
        finally:
            src = None
            mm.close()
    else:
        fd = os.open(f, os.O_RDONLY)
        try:
            got, d = native.read(fd, buf, at, needed, needed, piece, False, spans, level, prefix)
        finally:
            os.close(fd)
        assert got == needed
    assert d == want
    assert buf.tobytes() == data[at:at + needed]


def test_a_prefix_is_only_for_a_first_span_at_the_request_s_start(native, data_file):
    f, data = data_file
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="prefix"):
            native.read(fd, np.zeros(4096, np.uint8), 0, 4096, 4096, 4096, False, [(8, 4096)], None, b"x" * 8)
    finally:
        os.close(fd)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lo=st.integers(0, 100_000), cuts=st.lists(st.integers(1, 400_000), min_size=1, max_size=3, unique=True),
       before=st.integers(0, 5000), after=st.integers(0, 5000), mapped=st.booleans(), level=st.sampled_from(LEVELS))
def test_a_leaf_hashed_across_reads_through_its_own_state(native, data_file, lo, cuts, before, after, mapped, level):
    """A leaf's parts in consecutive reads, each with other leaves beside it: the first holds
    the state, the middle ones continue and hold it, the last continues it and gives the digest."""
    _runs(native, level)
    f, data = data_file
    bounds = [lo] + sorted(lo + c for c in cuts)
    before = min(before, lo)
    leaf = native.new_state()
    import mmap

    fd = os.open(f, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    src = np.frombuffer(mm, np.uint8)
    try:
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            first, last = k == 0, k == len(bounds) - 2
            at = a - (before if first else 0)  # the first read begins with another leaf
            end = b + (after if last else 0)  # the last read ends with another
            spans = ([(0, a - at)] if a > at else []) + [(a - at, b - at)] + ([(b - at, end - at)] if end > b else [])
            i = 1 if a > at else 0
            chained = {i: (leaf, not first, not last)}
            buf = np.zeros(end - at, np.uint8)
            if mapped:
                d = native.copy_mapped(src.__array_interface__["data"][0] + at, buf, end - at, spans, level, 4096,
                                       chained=chained)
            else:
                got, d = native.read(fd, buf, at, end - at, end - at, 4096, False, spans, level, chained=chained)
            others = [xxhash.xxh3_128(data[at + x:at + y]).digest() for j, (x, y) in enumerate(spans) if j != i]
            assert [x for j, x in enumerate(d) if j != i] == others
            assert d[i] == (xxhash.xxh3_128(data[bounds[0]:bounds[-1]]).digest() if last else b"")
    finally:
        src = None
        mm.close()
        os.close(fd)

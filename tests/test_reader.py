"""Strided reads through a mapping, against numpy slicing of the same file's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from planc.plan import costs as costmodel
from planc.base.errors import ReadError
from planc.execute.io.reader import Reader


@pytest.fixture()
def blob(tmp_path):
    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8)
    (tmp_path / "f.bin").write_bytes(data.tobytes())
    return tmp_path, data


@pytest.mark.parametrize("window", [1 << 20, 8192, 4096, 1000])
@pytest.mark.parametrize("offset,length,stride,count", [
    (0, 1024, 8192, 30), (123, 2, 16, 5000), (4095, 4097, 9000, 20), (77, 3000, 3001, 90), (5, 1, 1, 1),
    (299_000, 1000, 1000, 1)])
def test_read_strided_equals_numpy_slicing(blob, monkeypatch, window, offset, length, stride, count):
    import mmap

    from planc.execute.io import reader as reader_mod

    d, data = blob
    r = Reader(str(d), "off", map_window=window)  # windows and segment pieces smaller than the reads
    buf = np.full(length * count + 64, 0xAB, dtype=np.uint8)
    maps, real = [], mmap.mmap

    class Watched(real):
        def __new__(cls, fd, n, *a, **k):
            maps.append(n)
            return real.__new__(cls, fd, n, *a, **k)

    monkeypatch.setattr(reader_mod.mmap, "mmap", Watched)
    try:
        assert r.read_strided("f.bin", offset, length, stride, count, buf) == length * count
    finally:
        r.close()
    monkeypatch.setattr(reader_mod.mmap, "mmap", real)
    # every window mapped is within what the plan counts for the request (layout.map_bytes)
    assert maps and max(maps) <= costmodel.window_bytes(length, stride, count, window)
    want = np.lib.stride_tricks.as_strided(data[offset:], (count, length), (stride, 1)).reshape(-1)
    assert np.array_equal(buf[:length * count], want)
    assert (buf[length * count:] == 0xAB).all()  # nothing written past the packed segments
    assert r.bytes_read == length * count and r.requests == 1


def test_read_strided_past_the_end_is_a_typed_error_not_a_fault(blob):
    d, _ = blob
    r = Reader(str(d), "off")
    try:
        with pytest.raises(ReadError) as ei:
            r.read_strided("f.bin", 299_000, 100, 1000, 3, np.empty(300, np.uint8))
        assert ei.value.code == "read-short" and "f.bin" in ei.value.message
    finally:
        r.close()


def test_a_short_read_names_where_the_file_really_ends(blob):
    """A file cut short after compile: the message gives its size now, not the read's offset."""
    d, data = blob
    (d / "f.bin").write_bytes(data[:100_000].tobytes())
    r = Reader(str(d), "off")
    r.open("f.bin", 300_000)
    try:
        with pytest.raises(ReadError) as ei:
            r.read_into("f.bin", 200_704, 8192, np.empty(8192, np.uint8), 8192)
        assert ei.value.code == "read-short" and "file ended at 100000 bytes" in ei.value.message, ei.value.message
    finally:
        r.close()


def _rss_of_mapping(addr: int) -> int:
    """The resident bytes of the mapping that starts at `addr`, from /proc/self/smaps."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and int(head.split("-")[0], 16) == addr:
            for more in lines[i + 1:]:
                if more.startswith("Rss:"):
                    return int(more.split()[1]) * 1024
    raise AssertionError(f"no mapping at {addr:#x}")


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
@pytest.mark.parametrize("pages,tail", [(1, 0), (64, 0), (37, 1000), (5, 4095)])
def test_a_mapped_window_is_faulted_in_before_its_copy(blob, pages, tail):
    """The plan counts each mapped window at its whole size, every page from its first
    (layout.map_bytes): after `fault_in`, every page of the window is in the RSS, before the copy
    touches any; a window mapped and not faulted in holds fewer."""
    import mmap
    import os

    from planc.execute.io.reader import fault_in, map_window

    d, data = blob
    fd = os.open(d / "f.bin", os.O_RDONLY)
    page = mmap.PAGESIZE
    n = pages * page + tail
    try:
        mm = map_window(fd, page, n, "f.bin")
        try:
            src = np.frombuffer(mm, np.uint8)
            before = _rss_of_mapping(src.ctypes.data)
            fault_in(src)
            after = _rss_of_mapping(src.ctypes.data)
            same = np.array_equal(src, data[page:page + n])
            del src  # before the mapping closes, also if an assertion below fails
        finally:
            mm.close()
        assert before < -(-n // page) * page == after and same
        with pytest.raises(ReadError) as ei:
            map_window(fd, 123, n, "f.bin")  # not a page boundary
        assert ei.value.code == "read-failed" and "f.bin" in ei.value.message and "[123," in ei.value.message
    finally:
        os.close(fd)


def test_a_window_past_the_end_of_the_file_is_a_typed_short_read(blob):
    """A file cut short after its size was checked: the mapping itself is refused as `read-short`,
    naming the file and where it ends now; an empty window is a programming error, not a mapping
    of the rest of the file."""
    import os

    from planc.execute.io.reader import map_window

    d, _ = blob
    fd = os.open(d / "f.bin", os.O_RDONLY)
    try:
        with pytest.raises(ReadError) as ei:
            map_window(fd, 4096, 400_000, "f.bin")
        assert ei.value.code == "read-short" and "f.bin" in ei.value.message and "300000 bytes" in ei.value.message
        with pytest.raises(ValueError, match="at least one byte"):
            map_window(fd, 0, 0, "f.bin")
    finally:
        os.close(fd)


def test_every_window_is_faulted_in_before_its_copy(blob, monkeypatch):
    """`read_strided` faults in each window it maps, whole, before copying out of it (watched by
    wrapping the real functions, not replacing them: the reader's `fault`, numpy's `copyto`)."""
    from planc.execute.io import reader as reader_mod

    d, data = blob
    order, real_fault, real_copy = [], reader_mod.fault_in, np.copyto

    def fault(window):
        order.append(("fault", window.size))
        real_fault(window)

    def copy(dst, src, *a, **k):
        order.append(("copy", src.shape[0]))
        return real_copy(dst, src, *a, **k)

    monkeypatch.setattr(np, "copyto", copy)
    r = Reader(str(d), "off", map_window=20_000, fault=fault)
    buf = np.empty(100 * 30, np.uint8)
    try:
        r.read_strided("f.bin", 7, 100, 3000, 30, buf)
    finally:
        r.close()
    monkeypatch.setattr(np, "copyto", real_copy)
    assert [k for k, _ in order] == ["fault", "copy"] * 5  # 30 rows, 6 to a 20,000-byte window
    assert all(n >= 5 * 3000 + 100 for k, n in order if k == "fault")  # the whole window, not a part
    assert np.array_equal(buf, np.lib.stride_tricks.as_strided(data[7:], (30, 100), (3000, 1)).reshape(-1))


def test_a_failure_while_copying_a_window_propagates_as_itself(blob):
    """An error in the middle of a window (here injected into the fault-in) reaches the caller as
    itself, not as the mapping's refusal to close while a view of it lives."""
    d, _ = blob

    def boom(window):
        raise MemoryError("injected")

    r = Reader(str(d), "off", fault=boom)
    try:
        with pytest.raises(MemoryError, match="injected"):
            r.read_strided("f.bin", 0, 100, 1000, 10, np.empty(1000, np.uint8))
    finally:
        r.close()

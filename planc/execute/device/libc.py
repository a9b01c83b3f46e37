"""The C library's memory calls the executor makes through ctypes, bound and typed once for every
module that makes them: `mmap`, `munmap`, `madvise` (the pinned ring's huge pages, `driver.py`) and
`mincore` (a file's page-cache residency, `reader.py`)."""

from __future__ import annotations

import ctypes

_vp, _sz, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
MAP_FAILED = ctypes.c_void_p(-1).value
_c = None


def libc():
    """The C library with errno kept per call (`ctypes.get_errno()`); raises OSError or AttributeError
    where it, or one of the calls, is missing."""
    global _c
    if _c is None:
        c = ctypes.CDLL(None, use_errno=True)
        c.mmap.argtypes, c.mmap.restype = [_vp, _sz, _int, _int, _int, ctypes.c_long], _vp
        c.munmap.argtypes, c.munmap.restype = [_vp, _sz], _int
        c.madvise.argtypes, c.madvise.restype = [_vp, _sz, _int], _int
        c.mincore.argtypes, c.mincore.restype = [_vp, _sz, _vp], _int
        _c = c
    return _c

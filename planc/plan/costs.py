"""How a tensor-parallel slice of a later dim is read: through a mapping, or as whole rows.

A dim-1 slice of a row-major [R, C] weight is R segments of C/N elements, a row apart. Two ways
read it, and both bring the device only the slice:
- `mapped`: the segments are copied out of the page cache through a mapping of the file, one
  window at a time, packed into a ring slot (a strided request); the pages the other ranks' bytes
  sit on are mapped but never read. Cost: `page_s` per page touched + `copy_byte_s` per byte.
- `rows`: the whole rows are read into ring slots (O_DIRECT when cold), and a 2-D copy sends
  only the slice to the device. Cost: `read_byte_s` per byte of the rows + `request_s` per request.

The figures are machine-wide (all readers together). They come from `planc probe`, which measures
them on this machine and keeps the result (`probe_path()`), else from `DEFAULTS`: `planc probe`
on an H200 host (16 cores, 16 readers, 4 GiB scratch file, page cache warm, 2026-12-01), where
mapped reads of 1 KiB segments 8 KiB apart ran at 6.8 GB/s of payload and of 64 KiB segments
128 KiB apart at 22.9 GB/s, whole 16 MiB requests at 42.9 GB/s; 2-D copies from pinned memory ran
at 47-54 GB/s there, as fast as 1-D copies of the same bytes (`bench/probe_strided.py`). The
choice per input and its predicted seconds are in `explain`.
"""

from __future__ import annotations

import heapq
import json
import math
import mmap
import os
import stat
from functools import lru_cache
from pathlib import Path

from .records import Costs

PAGE = 4096
STRIDED_MODES = ("auto", "mapped", "rows")  # io.strided
# Whole rows are read only when predicted this much faster than the mapped read: they read bytes no
# one asked for (from disk too, when cold, where warm figures see no cost), and the figures spread
# by about a fifth between runs on a shared host.
ROWS_MARGIN = 1.25
# Mapped strided reads (`io.map_window`, `io.map_lanes`; the plan carries both). On the H200 host
# (bench/tp.py, warm, docs/tp.md "Mapping windows and lanes"), 32 MiB windows read TP 2/4/8 ranks
# alone 1.3-1.5x as fast as 8 MiB ones (fewer maps and unmaps, each of which interrupts every core
# the readers run on). Each window's pages are faulted in before its copy (`reader.fault_in`), so
# a busy lane holds the whole window the plan counts, and the host peak stays within 0.5 % of the
# plan's at either size. (Faulted in as the copy went, 32 MiB windows left the peak 6-8 % short.)
MAP_WINDOW = 32 << 20  # file bytes a strided read maps at a time (its pages count in the RSS until unmapped)
MAP_LANES = 4  # windows mapped at once, whatever the readers: what bounds the mapped pages in the RSS
MAP_PAGE = max(PAGE, mmap.PAGESIZE)  # a mapping starts on this machine's page boundary (64 KiB on some arm64)


def window_bytes(seg: int, stride: int, count: int, window: int = MAP_WINDOW) -> int:
    """The largest file window a strided request (`count` segments of `seg` bytes, `stride` apart)
    maps at a time (`Reader.read_strided`): as many whole segments as fit in `window`, or one
    `window` piece of a longer segment, from the page below its first byte, in whole pages."""
    piece = min(seg, window)
    rows = min(count, max(1, window // stride)) if piece == seg else 1
    return -(-(MAP_PAGE - 1 + (rows - 1) * stride + piece) // MAP_PAGE) * MAP_PAGE


def map_bytes(workers: int, windows, lanes: int = MAP_LANES) -> int:
    """Host bytes the mapped windows of strided reads hold at most (`layout.map_bytes`): the largest
    windows (`window_bytes` of each strided request) of as many requests as may read at once."""
    return sum(heapq.nlargest(min(lanes, workers), windows))


def map_bytes_bound(workers: int, strided_requests: int, lanes: int = MAP_LANES, window: int = MAP_WINDOW) -> int:
    """What `map_bytes` can be at most: a full window per lane (plans from before windows were sized
    to their requests claimed this)."""
    return min(lanes, workers, strided_requests) * (window + MAP_PAGE)


DEFAULTS = Costs("default", page_s=6.1e-8, copy_byte_s=2.8e-11, read_byte_s=2.3e-11, request_s=2.6e-5)


def probe_path() -> Path:
    """Where `planc probe` keeps its figures (`settings.probe_file`; with PLANC_PROBE=off, the default
    place, which compile then does not read)."""
    from ..base import settings

    return settings.probe_file() or settings.default_probe_file()


def load_costs(path: Path | None = None) -> Costs:
    """The probe's figures when a valid probe file exists, else the defaults (never an error: a
    damaged probe file only costs the choice its measured figures)."""
    from ..base import settings

    p = path or settings.probe_file()
    if p is None:
        return DEFAULTS
    doc = read_doc(p)  # never blocks on a FIFO, never reads /dev/zero
    try:
        raw = [doc[k] for k in ("page_s", "copy_byte_s", "read_byte_s", "request_s")]
        # probe files before them, or a probe without a GPU (no link): the built-in figures
        raw += [doc.get("disk_byte_s", DEFAULTS.disk_byte_s), doc.get("link_byte_s", DEFAULTS.link_byte_s)]
        if not all(type(x) in (int, float) for x in raw):  # numbers only, as a plan's costs
            return DEFAULTS
        vals = [float(x) for x in raw]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return DEFAULTS
    if not all(math.isfinite(v) and 0 < v < 1 for v in vals):
        return DEFAULTS
    return Costs(str(p), *vals)


def pages_touched(seg: int, stride: int, count: int) -> int:
    """Pages a mapped read of `count` segments of `seg` bytes, `stride` apart, touches (about).

    The segments' pages, not the span's: the reader faults in every page of a window
    (`reader.fault_in`), but for segments less than the kernel's fault-around (64 KiB) apart, which
    is every tensor-parallel split measured, the kernel maps the span either way, and `page_s` as
    `planc probe` fits it takes that in. Sparser segments pay a fault for the pages between them
    that this count leaves out. Counting the span instead would price a TP 8 `down_proj` slice 3.5x
    higher and turn `auto` to whole rows, which read 8x the bytes."""
    span = (count - 1) * stride + seg
    return min(count * (-(-seg // PAGE) + 1), -(-span // PAGE) + 1)


def mapped_seconds(c: Costs, seg: int, stride: int, count: int) -> float:
    return pages_touched(seg, stride, count) * c.page_s + seg * count * c.copy_byte_s


def rows_seconds(c: Costs, seg: int, stride: int, count: int, slot: int) -> float:
    span = (count - 1) * stride + seg
    return span * c.read_byte_s + -(-span // slot) * c.request_s


@lru_cache(maxsize=4096)
def choose(c: Costs, seg: int, stride: int, count: int, slot: int, mode: str = "auto") -> tuple[str, float, float]:
    """("mapped" | "rows", predicted seconds mapped, predicted seconds as rows) for one input;
    `mode` (io.strided) other than auto forces the method (a segment longer than a slot is always
    read as rows: a mapped read packs whole segments into one slot)."""
    rows = rows_seconds(c, seg, stride, count, slot)
    if seg > slot:
        return "rows", math.inf, rows
    mapped = mapped_seconds(c, seg, stride, count)
    if mode in ("mapped", "rows"):
        return mode, mapped, rows
    return ("rows" if rows * ROWS_MARGIN < mapped else "mapped"), mapped, rows


MAX_PROBE_BYTES = 1 << 20  # a probe file is about 1 KiB; a larger one is not read


def read_doc(path: Path) -> dict | None:
    """The probe document at `path`, or None when there is none that can be read: the file is opened
    without blocking (a FIFO has no writer to wait for), must be a regular file (not `/dev/zero`)
    and at most `MAX_PROBE_BYTES`; only then is it read, and at most that many bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PROBE_BYTES:
            return None
        data = os.read(fd, MAX_PROBE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_PROBE_BYTES:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None

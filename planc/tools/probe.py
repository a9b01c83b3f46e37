"""`planc probe`: measure the I/O cost figures that choose how row-parallel slices are read.

The figures (`ir.Costs`, machine-wide: all readers together) are measured on a scratch file in a
folder of the user's choice (put it on the disk the checkpoints live on), with `workers` reader
threads, the way the executor reads:
- mapped strided reads of 1 KiB segments 8 KiB apart (cost dominated by pages touched) and of
  64 KiB segments 128 KiB apart (dominated by bytes copied) give `page_s` and `copy_byte_s`;
- buffered reads of whole 16 MiB requests give `read_byte_s`; 4 KiB requests give `request_s`.
Each is timed warm (the file in the page cache). Cold figures (the file's pages dropped with
`posix_fadvise(DONTNEED)` first) are measured too and kept beside them for people; the choice
uses the warm figures, since a cold read either way brings whole pages from disk. One cold figure
is a plan's: 16 MiB requests read with O_DIRECT (as `io.direct: auto` reads a cold file; buffered
where the file system refuses it) give `disk_byte_s`, the predicted cold wall's disk rate.
On a GPU, 1 GiB of pinned memory copied to the device in 64 MiB copies gives `link_byte_s`, the
predicted wall's link and the reports' `limits` (`measure_link`; without a GPU the plan keeps the
built-in link).
The destination buffers are page-aligned and written before any timing, as a load's ring slots
are: fresh ones had the timed reads fault in and zero their pages, which on the H200 host put
2.8x the load's `page_s` into the figures (docs/tp.md).
The result is written to `costmodel.probe_path()`, which `planc compile` reads.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..plan.costs import PAGE, pages_touched, probe_path, read_doc



def _scratch(folder: Path, size: int) -> Path:
    import numpy as np

    fd, name = tempfile.mkstemp(prefix="planc-probe-", suffix=".bin", dir=folder)
    try:
        block = np.random.default_rng(0).integers(0, 256, min(size, 64 << 20), dtype=np.uint8).tobytes()
        with os.fdopen(fd, "wb") as f:
            left = size
            while left > 0:
                f.write(block[:left])
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # a full disk, an interrupt: the scratch file made here goes with the error
        os.unlink(name)
        raise
    return Path(name)


def _warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def _drop(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False


def _timed(jobs, workers: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        for f in [ex.submit(j) for j in jobs]:
            f.result()
    return time.perf_counter() - t0


def _buffers(n: int, size: int) -> list:
    """`n` destination buffers of `size` bytes, page-aligned (O_DIRECT reads need it) and every page
    written before any timing: a load reads into ring slots that are populated before its reads, so
    the timed reads must not fault in and zero their destination's pages."""
    import mmap

    import numpy as np

    bufs = [np.frombuffer(mmap.mmap(-1, size), np.uint8) for _ in range(n)]
    for b in bufs:
        b.fill(0)
    return bufs


def _mapped(reader, rel: str, size: int, seg: int, stride: int, workers: int) -> tuple[float, int, int]:
    """(seconds, pages touched, bytes copied) of mapped reads over the whole file, split among workers."""
    per_req = max(1, (16 << 20) // seg)
    rows = (size - seg) // stride + 1
    jobs, pages = [], 0
    bufs = _buffers(workers, per_req * seg)
    for k, first in enumerate(range(0, rows, per_req)):
        m = min(per_req, rows - first)
        pages += pages_touched(seg, stride, m)
        buf = bufs[k % workers]
        jobs.append(lambda first=first, m=m, buf=buf: reader.read_strided(rel, first * stride, seg, stride, m, buf))
    return _timed(jobs, workers), pages, rows * seg


def _rows(reader, rel: str, size: int, req: int, workers: int) -> tuple[float, int, int]:
    """(seconds, requests, bytes) of buffered reads of `req` bytes covering the file."""
    bufs = _buffers(workers, req)
    offs = list(range(0, size - req + 1, req))
    jobs = [lambda o=o, b=bufs[k % workers]: reader.read_into(rel, o, req, b, req) for k, o in enumerate(offs)]
    return _timed(jobs, workers), len(offs), len(offs) * req


def _direct_reader(path: Path, size: int):
    """A reader of `path` with O_DIRECT, as `io.direct: auto` reads a cold file, or a buffered one
    where the file system refuses O_DIRECT, at the open or at a first read of one page (as auto
    falls back)."""
    from ..base.errors import ReadError
    from ..execute.io.reader import Reader

    r = Reader(str(path.parent), "on")
    try:
        r.open(path.name, size)
        r.read_into(path.name, 0, PAGE, _buffers(1, PAGE)[0], PAGE)
    except ReadError:
        r.close()
        r = Reader(str(path.parent), "off")
        r.open(path.name, size)
    return r


MIN_SIZE = 64 << 20  # bytes of the scratch file, at least: `probe --size` below it is refused
LINK_BYTES = 1 << 30  # pinned bytes the link probe copies each time (at most the scratch file's size)
LINK_COPY = 64 << 20  # bytes per copy: the link's rate, which a load's 16 MiB slot copies reach too


def measure_link(dev, size: int = LINK_BYTES, piece: int = LINK_COPY, repeat: int = 3) -> dict:
    """The pinned host -> device link of `dev` (a `planc.execute.device.seam` device): `size` pinned
    bytes, written first, copied to the device in `piece`-byte async copies on one stream, `repeat`
    times after one untimed copy (the median kept). The pinned and device bytes are freed on return."""
    import statistics

    if size < PAGE or repeat < 1:
        raise ValueError(f"the link probe copies at least {PAGE} bytes at least once, got {size} bytes x {repeat}")
    piece = max(PAGE, min(piece, size))
    size = size // piece * piece
    host = dev.pinned_bytes(size)
    host.fill(1)  # populated before any timing, as a load's ring slots are
    dst = dev.device_bytes(size)
    stream = dev.stream()
    copies = [(dst, off, off, piece, 1, 0) for off in range(0, size, piece)]
    times = []
    try:
        for k in range(repeat + 1):
            t0 = time.perf_counter()
            dev.stage(host, copies, stream)
            stream.synchronize()
            if k:
                times.append(time.perf_counter() - t0)
    finally:
        del host, dst
    t = statistics.median(times)
    return {"link_byte_s": t / size, "link_gbps": size / t / 1e9, "link_bytes": size, "link_copy_bytes": piece}


def measure(folder: Path, size: int = 1 << 30, workers: int = 16, repeat: int = 3, progress=None,
            link=None) -> dict:
    """The probe's figures, warm and cold, as the JSON document `planc probe` writes; with `link` (a
    device), its pinned host -> device link too (`measure_link`: `link_byte_s`)."""
    from ..execute.io.reader import Reader

    folder.mkdir(parents=True, exist_ok=True)
    if size < MIN_SIZE:  # the figures need the 16 MiB row reads and 64 MiB of page-sized requests
        raise ValueError(f"the probe's scratch file is at least 64MiB ({MIN_SIZE} bytes), got {size}")
    size = size // PAGE * PAGE
    path = _scratch(folder, size)
    try:
        reader = Reader(str(path.parent), "off")
        reader.open(path.name, size)
        direct = _direct_reader(path, size)  # cold rows as a cold load reads them
        doc: dict = {}
        for state in ("warm", "cold"):
            fig = {}
            samples = {k: [] for k in ("small", "large", "rows", "req") + (("disk",) if state == "cold" else ())}
            for _ in range(repeat):
                for key, fn in (("small", lambda: _mapped(reader, path.name, size, 1024, 8192, workers)),
                                ("large", lambda: _mapped(reader, path.name, size, 65536, 131072, workers)),
                                ("rows", lambda: _rows(reader, path.name, size, 16 << 20, workers)),
                                ("req", lambda: _rows(reader, path.name, min(size, 64 << 20), PAGE, workers)),
                                ("disk", lambda: _rows(direct, path.name, size, 16 << 20, workers))):
                    if key not in samples:
                        continue
                    if state == "warm":
                        _warm(path)
                    elif not _drop(path):
                        fig["dropped"] = False
                    samples[key].append(fn())
                    if progress:
                        progress(state, key)
            med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
            (t1, p1, b1), (t2, p2, b2) = med["small"], med["large"]
            # t = pages * page_s + bytes * copy_byte_s, solved from the two mapped reads
            det = p1 * b2 - p2 * b1
            page_s = (t1 * b2 - t2 * b1) / det if det else t1 / p1
            copy_s = (p1 * t2 - p2 * t1) / det if det else 0.0
            tr, _, br = med["rows"]
            read_s = tr / br
            tq, nq, bq = med["req"]
            fig.update({"page_s": max(page_s, 1e-12), "copy_byte_s": max(copy_s, 1e-14), "read_byte_s": read_s,
                        "request_s": max((tq - bq * read_s) / nq, 1e-9),
                        "mapped_small_gbps": b1 / t1 / 1e9, "mapped_large_gbps": b2 / t2 / 1e9,
                        "rows_gbps": br / tr / 1e9})
            if state == "cold":
                td, _, bd = med["disk"]
                fig.update({"disk_byte_s": td / bd, "disk_gbps": bd / td / 1e9,
                            "disk_direct": direct.files[path.name].direct})
            doc[state] = fig
        reader.close()
        direct.close()
    finally:
        path.unlink(missing_ok=True)
    w = doc["warm"]
    return {"kind": "planc-probe", "folder": str(folder), "size_bytes": size, "workers": workers,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "page_s": w["page_s"], "copy_byte_s": w["copy_byte_s"],
            "read_byte_s": w["read_byte_s"], "request_s": w["request_s"],
            # the cold load's disk figure, only where the page cache could be dropped (else the reads were warm)
            **({"disk_byte_s": doc["cold"]["disk_byte_s"]} if doc["cold"].get("dropped", True) else {}),
            **(_link_figures(link, size, repeat, progress) if link is not None else {}),
            "warm": w, "cold": doc["cold"]}


def _link_figures(dev, size: int, repeat: int, progress) -> dict:
    """The link's figures for the probe document; where the device fails them (no memory to pin or
    allocate, a driver error), the reason instead, and the read figures are kept."""
    from ..base.errors import PlancError

    try:
        got = measure_link(dev, min(size, LINK_BYTES), repeat=repeat)
    except (PlancError, MemoryError, OSError) as e:
        return {"link": {"measured": False, "why": f"the link probe failed: {str(e).splitlines()[0][:200]}"}}
    finally:
        if progress:
            progress("link", "copy")
    return {"link_byte_s": got.pop("link_byte_s"), "link": got}


def is_probe_file(path: Path) -> bool:
    """Whether `path` holds a probe document planc wrote (`kind: planc-probe`): the only existing file
    `save` writes over."""
    doc = read_doc(path)
    return doc is not None and doc.get("kind") == "planc-probe"


def save(doc: dict, path: Path | None = None) -> Path:
    """Write the probe document to `path` (default `probe_path()`) through `outputs.write`: a new file,
    or over a probe file planc wrote, through a symlink to one; anything else (a device such as
    /dev/null, a FIFO, another file) is refused with an `OutputError` naming the path."""
    from ..base import outputs

    p = path or probe_path()
    if not os.path.lexists(p):
        p.parent.mkdir(parents=True, exist_ok=True)
    return outputs.write(p, json.dumps(doc, indent=1) + "\n", "probe output", ours=is_probe_file)

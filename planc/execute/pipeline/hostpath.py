"""The host path: a part whose transform runs on the host, read into its own buffer, transformed
into host scratch, then staged through the ring slot by slot.

`HostPath` is a part of the pipeline: given the plan, the device, the stream, the load's regions,
its reader and observer (told of each slot's copy: `CopyIssued`, and of each part done:
`HostPartDone`); the pipeline hands it the ring's `acquire` and `fence` for each part (`run`).
"""

from __future__ import annotations

import time

import numpy as np

from .events import CopyIssued, HostPartDone
from ..kernels.formats import FORMATS, of_part


class HostPath:
    """Runs the plan's host-path parts (`run`)."""

    def __init__(self, plan, dev, stream, regions, reader, observer):
        self.plan, self.dev, self.stream, self.regions, self.reader = plan, dev, stream, regions, reader
        self.observer = observer
        self.slot = plan.io.slot_bytes

    def run(self, r, h, acquire, fence) -> None:
        """Host part `h` of run `r`: read, transformed, staged through ring slots from `acquire()`,
        each `fence(slot)`ed after its copy."""
        t0 = time.perf_counter()
        self.regions.ready()
        requests = self._host_part(r, h, acquire, fence)
        self.observer(HostPartDone(r.index, h.part, self.plan.parts[h.part].out_bytes, requests, start=t0))

    @property
    def ring(self):
        return self.regions.ring

    @property
    def arena(self):
        return self.regions.arena

    def _host_part(self, r, h, acquire, fence) -> int:
        """Part `h` read, transformed and staged; returns how many reads it took."""
        p = self.plan.parts[h.part]
        bufs, requests = [], 0
        for inp in p.inputs:
            buf = np.empty(inp.nbytes, dtype=np.uint8)
            for off, n, rel in inp.segments():
                if n:
                    self.reader.read_plain(inp.file, off, buf[rel:rel + n])
                requests += 1
            bufs.append(buf)
        out = _host_transform(p, bufs)
        del bufs
        off = 0
        while off < len(out):
            n = min(self.slot, len(out) - off)
            slot = acquire()
            t0 = time.perf_counter()
            buf = self.ring[slot]
            buf[:n] = out[off:off + n]
            self.dev.stage(buf, ((self.arena, h.dst_offset + off, 0, n, 1, 0),), self.stream)
            fence(slot)
            self.observer(CopyIssued(r.index, None, 1, n, start=t0))
            off += n
        return requests


def gguf_host(p, raw: np.ndarray) -> np.ndarray:
    """A gguf part's blocks (U8 rows) dequantized on the host, as the bytes of its output."""
    return FORMATS["gguf"].host(p, [raw])


def _host_transform(p, bufs: list) -> np.ndarray:
    """A host-path part's output bytes: its format's host reference (`planc.execute.kernels.formats`), or
    its bytes as read (a copy)."""
    fmt = of_part(p)
    return bufs[0] if fmt is None else fmt.host(p, bufs)

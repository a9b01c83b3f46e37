"""A run's kernels: launched after the run's copies on a stream of their own (which waits for an
event recorded after those copies on the load's stream), or deferred while the kernels are still
being loaded; and the warmer that loads them while the first reads run. A run's kernels so run
while the next runs' copies go on; copies into a landing region wait for an event recorded after
the kernels that last read it (`before_copies`).

`KernelRuns` is a part of the pipeline: given the plan, the device, the stream, the load's regions,
the warmer (a thread, or None), its tallies and its observer.
"""

from __future__ import annotations

import time

import numpy as np

from ..base import fp4
from ..plan.records import DEQUANTIZE_OPS
from . import dispatch, seam
from .events import KernelsLaunched


class KernelRuns:
    """Launches each run's kernels on the kernels' stream (`launch`) behind the run's copies,
    deferring them while the warmer still loads the kernels (`flush_deferred` launches those
    deferred); `before_copies(r)` holds the load's stream until the kernels reading run r's landing
    region are done; `synchronize()` waits for every kernel launched."""

    def __init__(self, plan, dev, stream, regions, warmer, counters: dict, timings: dict, observer):
        self.plan, self.dev, self.stream, self.regions = plan, dev, stream, regions
        self.warmer = warmer
        self.counters, self.timings, self.observer = counters, timings, observer
        self.deferred: list = []  # runs whose kernels wait for the kernel warmer
        self.kstream = None  # the kernels' stream, made with the first launch
        self.after: dict = {}  # landing region -> event recorded after the last kernels that read it

    def flush_readers_of(self, region: int) -> None:
        """Launch the deferred kernels if any of them reads landing region `region`."""
        if any(d.landing_region == region and reads_landing(d) for d in self.deferred):
            self.flush_deferred()

    def before_copies(self, r) -> None:
        """Before run r's first copy: the kernels that read its landing region launched (deferred
        ones flushed) and the load's stream held until they are done."""
        region = r.landing_region
        self.flush_readers_of(region)
        ev = self.after.pop(region, None)
        if ev is not None:
            ev.wait(self.stream)

    def synchronize(self) -> None:
        """Wait for every kernel launched (the load's stream is the caller's to wait for)."""
        if self.kstream is not None:
            self.kstream.synchronize()

    def join_warmer(self) -> None:
        """Wait for the kernel-warming thread before the first launch.

        Two threads loading the same kernel's module at once (the warmer and the first real launch)
        can load it twice; numba-cuda then finds the module handle already registered.
        """
        if self.warmer is not None:
            t0 = time.perf_counter()
            self.warmer.join()
            self.warmer = None
            self.timings["wait_warm"] = time.perf_counter() - t0

    def launch(self, r) -> None:
        """Launch run r's kernels, or defer them while the kernel warmer is still compiling.

        Deferred kernels are launched later on the same stream, so they still follow their run's
        copies; the arena ranges they touch are the run's own. A run that reuses a landing region
        flushes the deferred kernels first (`Pipeline._admit_run`), since they may still read it.
        """
        self.regions.ready()
        if r.kernels:
            if self.warmer is not None and self.warmer.is_alive():
                self.deferred.append(r)
                return
            self.flush_deferred()
        self._kernels_of(r)

    def flush_deferred(self) -> None:
        if self.deferred or self.warmer is not None:
            self.join_warmer()
        runs, self.deferred = self.deferred, []
        for r in runs:
            self._kernels_of(r)

    def _kernels_of(self, r) -> None:
        t0 = time.perf_counter()
        if not r.kernels:
            self.observer(KernelsLaunched(r.index, 0, len(r.parts) - len(r.host_parts), start=t0))
            return
        if self.kstream is None:
            self.kstream = self.dev.stream()
        copied = self.dev.event()  # after the run's copies (and everything before them) on the load's stream
        copied.record(self.stream)
        copied.wait(self.kstream)
        for k in r.kernels:
            self._kernel(r, k)
            self.counters["kernels"] += 1
        if reads_landing(r):
            done = self.dev.event()
            done.record(self.kstream)
            self.after[r.landing_region] = done
        self.observer(KernelsLaunched(r.index, len(r.kernels), len(r.parts) - len(r.host_parts), start=t0))

    def _kernel(self, r, k) -> None:
        from ..base.dtypes import DTYPES

        s_size, d_size = DTYPES[k.src_dtype].bits // 8, DTYPES[k.dst_dtype].bits // 8
        numel = k.numel
        if k.op == "gguf":
            self._gguf(r, k, d_size)
            return
        src = self.regions.dst(k.src_space, r, k.src_offset, max(1, numel * max(1, s_size)))
        dst = self.regions.arena[k.dst_offset:k.dst_offset + numel * d_size]
        if k.op == "convert":
            dispatch.convert(src, dst, k.src_dtype, k.dst_dtype, numel, stream=self.kstream, dev=self.dev)
        elif k.op in DEQUANTIZE_OPS and k.src_dtype == fp4.WEIGHT_DTYPE:
            self._fp4(r, k, src, dst)
        elif k.op == "dequantize":
            rows, cols, b = k.rows, k.cols, k.block
            n_scale = -(-rows // b) * -(-cols // b)
            scale = self.regions.dst("landing", r, k.scale_offset, n_scale * 4)
            dispatch.dequantize_fp8(src, scale, dst, k.src_dtype, k.dst_dtype, rows, cols, b, stream=self.kstream,
                                    dev=self.dev)
        else:  # transpose (the codec admits no other op)
            dispatch.transpose2d(src, dst, k.rows, k.cols, s_size, stream=self.kstream, dev=self.dev)


    def _gguf(self, r, k, d_size: int) -> None:
        """GGUF blocks (U8 rows, `k.rows` x `k.cols` bytes, in the landing region) dequantized to the
        part's dtype: its GGML type is the part's `ggml`."""
        from ..base.dtypes import DTYPES
        from .gguf_dispatch import dequantize_gguf

        src = self.regions.dst(k.src_space, r, k.src_offset, k.rows * k.cols)
        dst = self.regions.arena[k.dst_offset:k.dst_offset + k.numel * d_size]
        out = dst.view(np.uint32 if DTYPES[k.dst_dtype].itemsize == 4 else np.uint16)
        dequantize_gguf(src, out, self.plan.parts[k.part].ggml, k.dst_dtype, k.numel, stream=self.kstream,
                        dev=self.dev)

    def _fp4(self, r, k, src, dst) -> None:
        """An MXFP4 or NVFP4 dequantization: its weight, block scales (and NVFP4's per-tensor scale,
        just after them) in the landing region."""
        from . import fp4_dispatch

        fmt = fp4_format(self.plan, k)
        n_scale = k.numel // k.block
        scale = self.regions.dst("landing", r, k.scale_offset, n_scale)
        scale2 = (self.regions.dst("landing", r, fp4.scale2_offset(k.scale_offset, n_scale), 4)
                  if fmt == "nvfp4" else None)
        fp4_dispatch.dequantize_fp4(src, scale, scale2, dst, fmt, k.dst_dtype, k.numel // (k.rows * k.cols), k.rows,
                                    k.cols, k.op == "dequantize_t", stream=self.kstream, dev=self.dev)


def fp4_format(plan, k) -> str | None:
    """The FP4 format of kernel k's part (by its inputs' dtypes), or None."""
    p = plan.parts[k.part]
    return fp4.format_of(p.inputs[0].dtype, p.inputs[1].dtype) if len(p.inputs) >= 2 else None


def reads_landing(r) -> bool:
    """Whether run r's kernels read its landing region (sources or FP8 scales placed there)."""
    return any(k.src_space != "arena" or k.op in DEQUANTIZE_OPS for k in r.kernels)


def gguf_type(plan, k) -> str:
    """The GGML type of GGUF kernel k's part."""
    return plan.parts[k.part].ggml


def warm_kernels(plan, dev=None):
    """Load the kernels the plan will launch, in a thread, while the first reads run.

    A kernel's first launch in a process loads its module (from the shipped machine code, a few
    milliseconds; compiled by numba where none fits, about half a second): done here on tiny arrays,
    that overlaps the I/O instead of stalling the stream (on a device that loads modules: not the
    simulator). `dev`: the load's device (None: the device in force). Returns the thread, or None.
    """
    dev = seam.device() if dev is None else dev
    if not dev.loads_kernels:
        return None
    need = set()
    for r in plan.runs:
        for k in r.kernels:
            fmt = fp4_format(plan, k) if k.op in DEQUANTIZE_OPS else None
            if k.op == "gguf":
                need.add(("gguf", gguf_type(plan, k), k.dst_dtype))
                continue
            need.add((f"fp4:{fmt}", k.op == "dequantize_t", k.dst_dtype) if fmt else (k.op, k.src_dtype, k.dst_dtype))
        for q in r.requests:
            if q.scatter:
                need.add(("scatter", q.width, None))
    if plan.layout.zero:
        need.add(("zero", None, None))
    if not need:
        return None
    import contextvars
    import threading

    # The thread selects the load's device itself, whatever a new thread would default to; the
    # caller's context (the load's settings) goes with it.
    t = threading.Thread(target=contextvars.copy_context().run, args=(_warm, dev, dev.current_device(),
                                                                       sorted(need, key=str)),
                         name="planc-warm", daemon=True)
    t.start()
    return t


def _warm(dev, idx: int, need) -> None:
    from ..base.dtypes import DTYPES

    try:
        dev.select(idx)
        stream = dev.stream()
        buf = dev.device_bytes(256)  # a whole block of every GGUF type (Q6_K: 210 bytes)
        out = dev.device_bytes(1024)  # its 256 values in F32
        for op, a, b in need:
            if op == "convert":
                dispatch.convert(buf, out if DTYPES[a].bits != DTYPES[b].bits else buf, a, b, 1, stream=stream, dev=dev)
            elif op == "dequantize":
                dispatch.dequantize_fp8(buf[:8], buf[8:16], out, a, b, 1, 1, 128, stream=stream, dev=dev)
            elif op == "transpose":
                dispatch.transpose2d(buf, out, 1, 1, DTYPES[a].bits // 8, stream=stream, dev=dev)
            elif op.startswith("fp4:"):
                from . import fp4_dispatch

                fmt = op[4:]
                fp4_dispatch.dequantize_fp4(buf[:16], buf[16:20], buf[32:36], out, fmt, b, 1, 1, fp4.BLOCK[fmt], a,
                                            stream=stream, dev=dev)
            elif op == "scatter":
                table = dev.to_device(np.zeros((1, 3), np.int64))
                dispatch.scatter(buf, out, table, 0, 1, a, stream, 1, dev=dev)
            elif op == "zero":
                dispatch.zero(out, [(0, 1)], stream, dev=dev)
            elif op == "gguf":
                from ..manifest.ggml_types import quant_type
                from .gguf_dispatch import dequantize_gguf

                values = quant_type(a).block
                dequantize_gguf(buf, out.view(np.uint32 if b == "F32" else np.uint16), a, b, values, stream=stream,
                                dev=dev)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - warming is an optimization; the real launch reports errors
        pass

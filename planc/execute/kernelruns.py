"""A run's kernels: launched after the run's copies, on the same stream, or deferred while the
kernels are still being loaded; and the warmer that loads them while the first reads run.
"""

from __future__ import annotations

import time

import numpy as np

from . import dispatch, seam


class KernelRuns:
    """The kernel half of `Loader` (a mixin: the loader's state is one object)."""

    def _join_warmer(self) -> None:
        """Wait for the kernel-warming thread before the first launch.

        Two threads loading the same kernel's module at once (the warmer and the first real launch)
        can load it twice; numba-cuda then finds the module handle already registered.
        """
        if self.warmer is not None:
            t0 = time.perf_counter()
            self.warmer.join()
            self.warmer = None
            self.timings["wait_warm"] = time.perf_counter() - t0

    def _launch_kernels(self, r) -> None:
        """Launch run r's kernels, or defer them while the kernel warmer is still compiling.

        Deferred kernels are launched later on the same stream, so they still follow their run's
        copies; the arena ranges they touch are the run's own. A run that reuses a landing region
        flushes the deferred kernels first (`_admit_run`), since they may still read it.
        """
        self._device()
        if r.kernels:
            if self.warmer is not None and self.warmer.is_alive():
                self.deferred.append(r)
                return
            self._flush_deferred()
        self._kernels_of(r)

    def _flush_deferred(self) -> None:
        if self.deferred or self.warmer is not None:
            self._join_warmer()
        runs, self.deferred = self.deferred, []
        for r in runs:
            self._kernels_of(r)

    def _kernels_of(self, r) -> None:
        for k in r.kernels:
            self._kernel(r, k)
            self.counters["kernels"] += 1
        if self.progress:
            self.progress(0, len(r.parts) - len(r.host_parts))

    def _kernel(self, r, k) -> None:
        from ..dtypes import DTYPES

        s_size, d_size = DTYPES[k.src_dtype].bits // 8, DTYPES[k.dst_dtype].bits // 8
        numel = k.numel
        src = self._dst(k.src_space, r, k.src_offset, max(1, numel * max(1, s_size)))
        dst = self.arena[k.dst_offset:k.dst_offset + numel * d_size]
        if k.op == "convert":
            dispatch.convert(src, dst, k.src_dtype, k.dst_dtype, numel, stream=self.stream)
        elif k.op == "dequantize":
            rows, cols, b = k.rows, k.cols, k.block
            n_scale = -(-rows // b) * -(-cols // b)
            scale = self._dst("landing", r, k.scale_offset, n_scale * 4)
            dispatch.dequantize_fp8(src, scale, dst, k.src_dtype, k.dst_dtype, rows, cols, b, stream=self.stream)
        else:  # transpose (the codec admits no other op)
            dispatch.transpose2d(src, dst, k.rows, k.cols, s_size, stream=self.stream)


def reads_landing(r) -> bool:
    """Whether run r's kernels read its landing region (sources or FP8 scales placed there)."""
    return any(k.src_space != "arena" or k.op == "dequantize" for k in r.kernels)


def warm_kernels(plan):
    """Load the kernels the plan will launch, in a thread, while the first reads run.

    A kernel's first launch in a process loads its module (from the shipped machine code, a few
    milliseconds; compiled by numba where none fits, about half a second): done here on tiny arrays,
    that overlaps the I/O instead of stalling the stream. Returns the thread.
    """
    if seam.simulated():
        return None
    need = set()
    for r in plan.runs:
        for k in r.kernels:
            need.add((k.op, k.src_dtype, k.dst_dtype))
        for q in r.requests:
            if q.scatter:
                need.add(("scatter", q.width, None))
    if plan.layout.zero:
        need.add(("zero", None, None))
    if not need:
        return None
    import threading

    # The thread selects the load's device itself, whatever a new thread would default to.
    t = threading.Thread(target=_warm, args=(seam.current_device(), sorted(need, key=str)), name="planc-warm",
                         daemon=True)
    t.start()
    return t


def _warm(idx: int, need) -> None:
    from ..dtypes import DTYPES

    try:
        dev = seam.device()
        dev.select(idx)
        stream = dev.stream()
        buf = dev.device_bytes(64)
        out = dev.device_bytes(64)
        for op, a, b in need:
            if op == "convert":
                dispatch.convert(buf, out if DTYPES[a].bits != DTYPES[b].bits else buf, a, b, 1, stream=stream)
            elif op == "dequantize":
                dispatch.dequantize_fp8(buf[:8], buf[8:16], out, a, b, 1, 1, 128, stream=stream)
            elif op == "transpose":
                dispatch.transpose2d(buf, out, 1, 1, DTYPES[a].bits // 8, stream=stream)
            elif op == "scatter":
                table = dev.to_device(np.zeros((1, 3), np.int64))
                dispatch.scatter(buf, out, table, 0, 1, a, stream, 1)
            elif op == "zero":
                dispatch.zero(out, [(0, 1)], stream)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - warming is an optimization; the real launch reports errors
        pass

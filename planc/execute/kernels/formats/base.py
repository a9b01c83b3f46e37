"""The interface every kernel format implements (`planc.execute.kernels.formats`)."""

from __future__ import annotations

import numpy as np


class Format:
    """One kernel format. `launch(runs, r, k)`: kernel record k of run r on the kernels' stream of `runs`
    (a `KernelRuns`: its plan, device, regions and stream); `host(p, bufs)`: a host-path part's output
    bytes from its inputs' bytes; `warm_key(plan, k)`: what tells this format's kernels apart for the
    warm-up (one warm launch per key); `warm(dev, key, buf, out, stream)`: that launch on scratch
    device bytes (`buf` 256, `out` 1024); `launches()`: its (kernel name, signature) pairs, the
    shipped PTX's; `check`: the plan reader's checks of its parts and kernel records
    (`planc.plan.formatcheck`), None for the element-wise formats, which the reader checks alike."""

    name = ""
    check = None

    def launch(self, runs, r, k) -> None:
        raise NotImplementedError

    def host(self, p, bufs: list) -> np.ndarray:
        raise NotImplementedError

    def warm_key(self, plan, k) -> tuple:
        return (k.src_dtype, k.dst_dtype)

    def warm(self, dev, key: tuple, buf, out, stream) -> None:
        raise NotImplementedError

    def launches(self) -> list:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<format {self.name}>"

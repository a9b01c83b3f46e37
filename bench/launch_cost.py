"""What one kernel launch costs the thread that issues it (run on the GPU machine).

    python3 bench/launch_cost.py [--n 2000] [--json OUT.json]

A GGUF load issues one launch per dequantized tensor from the thread that also issues the copies:
a file of many small tensors (Q6_K at 2 GiB: 343) pays that cost many times on the load's critical
path. This times, on one GPU, `--n` launches of a Q6_K -> BF16 kernel over one block each (the
device's work negligible), as a load makes them, and each piece of one launch on its own: slicing
the source and destination out of their regions (`Regions.dst`, the arena's slice and `view`), the
launch's argument signature and packing, the context look-up, and the driver call alone
(`cuLaunchKernel` with the arguments already packed). Prints microseconds per launch (medians of 5
rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()

    from planc.execute.device import launch, seam
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf

    seam.select("cuda:0")
    dev = seam.device()
    stream = dev.stream()
    src_all = dev.device_bytes(1 << 20)
    arena = dev.device_bytes(1 << 22)
    n = a.n

    def rounds(fn) -> float:
        out = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) / n * 1e6)
            stream.synchronize()
        return statistics.median(out)

    def whole():
        for i in range(n):
            off = (i % 64) * 256
            src = src_all[off:off + 210]
            out = arena[i % 64 * 512:(i % 64) * 512 + 512].view(np.uint16)
            dequantize_gguf(src, out, "Q6_K", "BF16", 256, stream=stream, dev=dev, row=256, hd=0)

    whole()  # loads the module
    stream.synchronize()
    res = {"launch_us": rounds(whole)}

    def slices():
        for i in range(n):
            off = (i % 64) * 256
            src_all[off:off + 210]
            arena[i % 64 * 512:(i % 64) * 512 + 512].view(np.uint16)

    res["slices_us"] = rounds(slices)
    src = src_all[0:210]
    out = arena[0:512].view(np.uint16)
    args = (src, out, 256, 0, 0)
    res["signature_us"] = rounds(lambda: [launch.signature(args) for _ in range(n)])
    res["pack_us"] = rounds(lambda: [launch.pack(args) for _ in range(n)])
    calls = launch.LAUNCHER.calls
    res["context_us"] = rounds(lambda: [calls.context() for _ in range(n)])
    res["grid_us"] = rounds(lambda: [dev.grid.map(256) for _ in range(n)])
    fn, _why = launch.LAUNCHER.load(dev, "gguf_Q6_K_BF16", launch.signature(args))
    res["driver_call_us"] = rounds(lambda: [calls.launch(fn, 1, 256, stream, args) for _ in range(n)])
    for k, v in res.items():
        print(f"{k:16s} {v:8.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

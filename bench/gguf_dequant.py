"""GGUF dequantization on the GPU: each kernel's GB/s against a plain device copy of the same bytes.

    python bench/gguf_dequant.py [--quant Q8_0 Q4_K_M] [--size 2GiB] [--folder /tmp/planc-gguf]

Writes a Llama-shaped GGUF per quantization with planc's synth (the `gguf` package), reads each
2-D weight's stored blocks from the file, and times on the device (CUDA events, after a warm-up
launch): the dequantization to BF16 (`planc.execute.kernels.gguf_kernels`) and a copy of the stored bytes
(`copy` of `planc.execute.kernels.kernels`). Each result is checked bit for bit against
`planc.execute.kernels.gguf_dequant` for the first tensor of each type. Prints one JSON line per quantization.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# bench/gguf.py would shadow the `gguf` package that synth writes with: this folder leaves the path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", nargs="+", default=["Q8_0", "Q4_K_M"])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--folder", default="/tmp/planc-gguf")
    a = ap.parse_args()
    from numba import cuda

    from planc.execute.kernels.gguf_dispatch import dequantize_gguf
    from planc.execute.device.seam import default_device
    from planc.execute.kernels.kernels import KERNELS
    from planc.execute.kernels.gguf_dequant import dequantize
    from planc.manifest import read_manifest
    from planc.tools.synth_gguf import write_gguf
    from planc.base.units import parse_bytes

    for quant in a.quant:
        folder = os.path.join(a.folder, quant)
        path = os.path.join(folder, "model.gguf")
        if not os.path.exists(path):
            write_gguf(folder, quant=quant, size_bytes=parse_bytes(a.size))
        m = read_manifest(path)
        checked: set = set()
        t_deq = t_copy = 0.0
        in_bytes = out_bytes = 0
        with open(path, "rb") as f:
            for t in m.tensors:
                if len(t.shape) != 2 or t.dtype in ("F32", "F16", "BF16"):
                    continue
                f.seek(t.start)
                raw = np.frombuffer(f.read(t.nbytes), np.uint8)
                numel = t.shape[0] * t.shape[1]
                src = cuda.to_device(raw)
                dst = cuda.device_array(numel, np.uint16)
                cp = cuda.device_array(t.nbytes, np.uint8)
                for timed in (False, True):
                    e0, e1, e2 = cuda.event(), cuda.event(), cuda.event()
                    e0.record()
                    dequantize_gguf(src, dst, t.dtype, "BF16", numel, dev=default_device())
                    e1.record()
                    KERNELS["copy"][528, 256](src, cp, t.nbytes)
                    e2.record()
                    e2.synchronize()
                    if timed:
                        t_deq += cuda.event_elapsed_time(e0, e1) / 1e3
                        t_copy += cuda.event_elapsed_time(e1, e2) / 1e3
                in_bytes += t.nbytes
                out_bytes += numel * 2
                if t.dtype not in checked:
                    want = dequantize(raw, t.dtype, t.shape, "BF16").view(np.uint16).reshape(-1)
                    assert np.array_equal(dst.copy_to_host(), want), f"{t.name}: not bit-exact"
                    checked.add(t.dtype)
        print(json.dumps({"quant": quant, "file_bytes": os.path.getsize(path), "stored_bytes": in_bytes,
                          "bf16_bytes": out_bytes, "dequant_s": round(t_deq, 4), "copy_s": round(t_copy, 4),
                          "dequant_out_GBps": round(out_bytes / t_deq / 1e9, 1),
                          "dequant_in_GBps": round(in_bytes / t_deq / 1e9, 1),
                          "values_per_s_G": round(out_bytes / 2 / t_deq / 1e9, 1),
                          "values_per_stored_byte": round(out_bytes / 2 / in_bytes, 3),
                          "copy_GBps": round(in_bytes / t_copy / 1e9, 1), "bit_exact": sorted(checked)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""FP4 on the GPU, side by side in one process tree (run on the GPU machine).

    python3 bench/fp4.py DATA OUT [--size 4GiB] [--repeat 3] [--families mxfp4,nvfp4] [--no-handoff]

1. Loads. For each family, a checkpoint of about --size written once by planc's synth at the real
   models' shapes (mxfp4: gpt-oss-20b's experts, H = I = 2880, 32 experts; nvfp4: Llama-3-8B's
   linears). Loaded in fresh `planc run --json` processes, page cache warm, alternating order,
   --repeat times: with the shipped spec (`specs/transformers-gpt-oss.yaml`,
   `specs/transformers-llama-nvfp4.yaml`: dequantized on the device into BF16) and with
   `match: "*"` (the same files copied as stored). Median GB/s of the file bytes read and their
   ratio; requests, copies and kernels predicted and issued; host growth against the plan's
   prediction.
2. Kernels alone. Each FP4 tensor of the checkpoint on the device, timed with CUDA events after a
   warm-up: the dequantization (as the spec does it: gpt-oss transposed) against a device copy of
   the stored bytes (`copy` of `planc.execute.kernels.kernels`). The first tensor of each is checked bit
   for bit against `planc.execute.kernels.fp4ref`.
3. Hand-off (unless --no-handoff). A gpt-oss-shaped model (small config, random MXFP4 experts,
   `planc.tools.synth_fp4.write_gpt_oss`) loaded by `transformers` (`from_pretrained` with
   `Mxfp4Config(dequantize=True)`) and by `planc.load_into` into a meta-device `GptOssForCausalLM`
   with the shipped spec: every weight bit-exact, the logits equal.

Everything goes to OUT/fp4.json (and is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402

from common import planc, warm_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"mxfp4": "transformers-gpt-oss", "nvfp4": "transformers-llama-nvfp4"}


def checkpoint(data: Path, fam: str, size: int) -> Path:
    from planc.tools.synth_fp4 import write_fp4_checkpoint

    d = data / f"{fam}-{size >> 20}MiB"
    if not (d / ".complete").exists():
        write_fp4_checkpoint(d, fam, size_bytes=size or None)  # --size 0: the tiny test checkpoint
        (d / ".complete").write_text("ok\n")
    return d


def specs(ckpt: Path, fam: str) -> dict[str, Path]:
    doc = yaml.safe_load((ROOT / "specs" / f"{SPEC[fam]}.yaml").read_text())
    doc["checkpoint"] = str(ckpt / "model.safetensors")
    doc["budget"] = {"host": "8GiB"}
    out = {}
    for kind, rules in (("dequant", doc["rules"]), ("copy", [{"match": "*"}])):
        p = ckpt.parent / f"{ckpt.name}.{kind}.yaml"
        p.write_text(yaml.safe_dump({**doc, "rules": rules}, sort_keys=False))
        out[kind] = p
    return out


def _counts(rep: dict) -> dict:
    h = rep["host"]
    return {"gb_per_s": rep["gb_per_s"], "payload_bytes": rep["payload_bytes"],
            "requests": rep["requests"], "copies": rep["copies"], "kernels": rep["kernels"],
            "host_growth_bytes": h["growth_bytes"], "host_predicted_bytes": h["predicted_peak_bytes"],
            "host_growth_over_predicted": round(h["growth_bytes"] / max(1, h["predicted_peak_bytes"]), 4),
            "kernel_code": rep.get("kernel_code")}


def loads(fam: str, ckpt: Path, repeat: int) -> dict:
    sp = specs(ckpt, fam)
    warm_file(ckpt / "model.safetensors")
    runs = {"dequant": [], "copy": []}
    for i in range(repeat):
        for kind in (("dequant", "copy") if i % 2 == 0 else ("copy", "dequant")):
            rc, out, err = planc("run", sp[kind], "--json")
            if rc != 0:
                raise SystemExit(f"{fam} {kind}: planc run failed: {err[-2000:]}")
            runs[kind].append(_counts(json.loads(out)))
    med = {k: statistics.median(r["gb_per_s"] for r in v) for k, v in runs.items()}
    return {"family": fam, "file_bytes": (ckpt / "model.safetensors").stat().st_size,
            "dequant_GBps": round(med["dequant"], 2), "copy_GBps": round(med["copy"], 2),
            "ratio": round(med["dequant"] / med["copy"], 3), "runs": runs}


def _seconds(a, b) -> float:
    from numba import cuda

    if not hasattr(cuda, "event_elapsed_time"):  # the simulator (a dry run of this script) has no timed events
        return 1e-6
    return cuda.event_elapsed_time(a, b) / 1e3


def kernels_alone(fam: str, ckpt: Path) -> dict:
    import numpy as np
    from numba import cuda

    from planc.base import fp4
    from planc.execute.kernels import fp4ref
    from planc.execute.kernels.fp4_dispatch import dequantize_fp4
    from planc.execute.device.seam import default_device
    from planc.execute.kernels.kernels import KERNELS
    from planc.manifest import read_manifest

    path = ckpt / "model.safetensors"
    m = read_manifest(str(path))
    by = {t.name: t for t in m.tensors}
    t_deq = t_copy = 0.0
    in_bytes = out_bytes = 0
    checked = False
    with open(path, "rb") as f:
        def raw(t):
            f.seek(t.start)
            return np.frombuffer(f.read(t.nbytes), np.uint8)

        for t in m.tensors:
            if fam == "mxfp4" and not t.name.endswith("_blocks"):
                continue
            if fam == "nvfp4" and not (t.name.endswith(".weight") and t.dtype == "U8"):
                continue
            base = fp4.loaded_name(fam, t.name)
            s = by[f"{base}_scales" if fam == "mxfp4" else f"{base}_scale"]
            s2 = by.get(f"{base}_scale_2")
            w_h, s_h = raw(t), raw(s)
            batch, rows, cols = fp4.geometry(fam, tuple(t.shape))
            transpose = fam == "mxfp4"
            w_d, s_d = cuda.to_device(w_h), cuda.to_device(s_h)
            s2_d = cuda.to_device(raw(s2)) if s2 is not None else None
            out = cuda.device_array(batch * rows * cols * 2, np.uint8)
            cp = cuda.device_array(t.nbytes + s.nbytes, np.uint8)
            src = cuda.to_device(np.concatenate([w_h, s_h]))
            for timed in (False, True):
                e0, e1, e2 = cuda.event(), cuda.event(), cuda.event()
                e0.record()
                dequantize_fp4(w_d, s_d, s2_d, out, fam, "BF16", batch, rows, cols, transpose, dev=default_device())
                e1.record()
                KERNELS["copy"][528, 256](src, cp, t.nbytes + s.nbytes)
                e2.record()
                e2.synchronize()
                if timed:
                    t_deq += _seconds(e0, e1)
                    t_copy += _seconds(e1, e2)
            in_bytes += t.nbytes + s.nbytes
            out_bytes += batch * rows * cols * 2
            if not checked:
                if fam == "mxfp4":
                    want = fp4ref.mxfp4(w_h.reshape(t.shape), s_h.reshape(s.shape), "BF16", True)
                else:
                    want = fp4ref.nvfp4(w_h.reshape(t.shape), s_h.reshape(s.shape), raw(s2).view(np.float32), "BF16")
                assert np.array_equal(out.copy_to_host(), want.reshape(-1).view(np.uint8)), f"{t.name}: not bit-exact"
                checked = True
    return {"family": fam, "stored_bytes": in_bytes, "bf16_bytes": out_bytes, "dequant_s": round(t_deq, 5),
            "copy_s": round(t_copy, 5), "dequant_in_GBps": round(in_bytes / t_deq / 1e9, 1),
            "dequant_out_GBps": round(out_bytes / t_deq / 1e9, 1), "copy_GBps": round(in_bytes / t_copy / 1e9, 1),
            "bit_exact_first_tensor": checked}


def handoff(data: Path) -> dict:
    import torch
    import transformers

    import planc
    from planc.tools.synth_fp4 import write_gpt_oss

    d = data / "gpt-oss-small"
    write_gpt_oss(d)
    doc = yaml.safe_load((ROOT / "specs" / "transformers-gpt-oss.yaml").read_text())
    doc["checkpoint"] = str(d / "model.safetensors")
    spec = d.parent / "gpt-oss-small.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))

    t0 = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        d, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.bfloat16, device_map="cuda")
    hf.eval()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        mine = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    res = planc.load_into(mine, spec)
    mine.eval()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    a, b = hf.state_dict(), mine.state_dict()
    differ = sorted(k for k in a if k not in b or a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
                    or not torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16 else a[k],
                                       b[k].view(torch.int16) if b[k].dtype == torch.bfloat16 else b[k]))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (2, 48), generator=g).to("cuda")
    with torch.no_grad():
        la, lb = hf(ids).logits, mine(ids).logits
    out = {"weights": len(a), "weights_differ": differ[:20], "extra_in_planc": sorted(set(b) - set(a))[:20],
           "logits_equal": bool(torch.equal(la, lb)), "logits_max_abs_diff": float((la.float() - lb.float()).abs().max()),
           "hf_load_s": round(t1 - t0, 3), "planc_load_into_s": round(t2 - t1, 3),
           "missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys)}
    res.model.free()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--families", default="mxfp4,nvfp4")
    ap.add_argument("--no-handoff", dest="handoff", action="store_false")
    a = ap.parse_args()
    from planc.base.units import parse_bytes

    a.data.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"loads": [], "kernels": []}
    for fam in a.families.split(","):
        t0 = time.time()
        ck = checkpoint(a.data, fam, parse_bytes(a.size))
        print(f"{fam}: checkpoint in {time.time() - t0:.1f} s", flush=True)
        r = loads(fam, ck, a.repeat)
        result["loads"].append(r)
        last = r["runs"]["dequant"][-1]
        print(f"{fam}: dequant {r['dequant_GBps']} GB/s, copy {r['copy_GBps']} GB/s, ratio {r['ratio']}; "
              f"requests {last['requests']} copies {last['copies']} kernels {last['kernels']} host growth "
              f"{last['host_growth_over_predicted']} of predicted", flush=True)
        k = kernels_alone(fam, ck)
        result["kernels"].append(k)
        print(json.dumps(k), flush=True)
    if a.handoff:
        result["handoff"] = handoff(a.data)
        print(json.dumps(result["handoff"]), flush=True)
    (a.out / "fp4.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

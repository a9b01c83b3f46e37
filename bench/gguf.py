"""GGUF loads on the GPU: dequantized against planc's plain copy, and against transformers' GGUF load.

    python3 bench/gguf.py DATA OUT [--size 15GiB] [--repeat 3] [--quants Q8_0,Q4_K_M]
                                   [--handoff small|tiny|none] [--handoff-repeat 3] [--hidden 4096]

1. Loads. For each quantization, a Llama-shaped GGUF of about --size written once under DATA by
   planc's synth (`planc.tools.synth_gguf.write_gguf`; --size 0: the tiny 2-layer file; the largest
   preset of which 8 layers fit --size, or with --hidden the preset of that width for every type, so
   that the types compare on one shape: at 2 GiB Q6_K and Q8_0 fit 8 layers of hidden 2048 only, and
   are written as 43-56 such layers), loaded in
   fresh `planc run SPEC --json` processes, page cache warm, alternating order, --repeat times:
   `dequant`, the shipped spec's rules (`specs/transformers-llama-gguf.yaml`: renamed, q/k rows
   unpermuted, every tensor dequantized to bfloat16 on the device), and `copy`, the same file with
   every tensor kept as stored (`match: "*"`, `dtype: keep`). Median GB/s of the file's bytes
   (file bytes / the run's wall seconds) and their ratio (target: dequant at least 0.8x copy); host
   RSS growth over the plan's predicted host peak (target: within 5%); requests, copies and kernels
   predicted and issued.
2. Hand-off (unless --handoff none). A Llama with random weights (`small`: hidden 2048, 8 layers,
   32 heads, 4 kv heads, vocab 32000, about 0.5 GB in Q8_0; `tiny`: hidden 128, 2 layers) written
   as llama.cpp's converter writes it (`planc.tools.gguf_llama.write_llama_from_state`). Timed
   --handoff-repeat times, alternating, each to a ready module on the GPU: transformers'
   `from_pretrained(dir, gguf_file="model.gguf", dtype=torch.bfloat16, device_map="cuda")` against
   the config from planc's read of the header (`gguf_names.transformers_config`, checked equal to
   `AutoConfig.from_pretrained(dir, gguf_file=...)`, whose own time is reported beside: it parses
   the tokenizer arrays in Python), the module built on the meta device and
   `planc.load_into(module, spec)` with the shipped spec. Every weight bit-equal, the logits on the
   same tokens equal (`torch.equal`), planc's speed-up (target: at least 5x). CUDA (torch's and
   numba's) is started and transformers' modules imported before anything is timed. Needs torch,
   transformers and accelerate (transformers refuses a GGUF load without it).

Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, no GPU) it dry-runs: `--size 0 --handoff tiny
--repeat 1 --handoff-repeat 1`; the loads then dequantize on the host (`--on host`, the simulator's
default: its kernels run each thread in Python), transformers loads on the CPU and the times mean
nothing.

Everything goes to OUT/gguf.json (and is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file's own name would shadow the `gguf` package that planc, synth and transformers import:
# its folder leaves the import path, and the bench's helpers are loaded by file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import importlib.util  # noqa: E402

import yaml  # noqa: E402


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", HERE / "common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_c = _common()
planc, warm = _c.planc, _c.warm_file
SPEC = ROOT / "specs" / "transformers-llama-gguf.yaml"
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HANDOFF = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "small": (2048, 8, 32, 4, 5632, 32000),
    "tiny": (128, 2, 4, 2, 256, 512),
}


def checkpoint(data: Path, quant: str, size: int, hidden: int | None = None) -> Path:
    from planc.tools.synth_gguf import write_gguf

    d = data / (f"gguf-{quant}-{size >> 20}MiB" + (f"-h{hidden}" if hidden else ""))
    if not (d / ".complete").exists():
        if (d / "model.gguf").exists():
            (d / "model.gguf").unlink()
        write_gguf(d, quant=quant, size_bytes=size or None, hidden=hidden)  # --size 0: the tiny 2-layer file
        (d / ".complete").write_text("ok\n")
    return d / "model.gguf"


def specs(path: Path, *, host: str = "8GiB", on: str = "device", variants: dict | None = None,
          flat: bool = False) -> dict[str, Path]:
    """The shipped spec on `path` (dequant; `on: host` added to its rules if asked), the same file
    kept as stored (copy), for each of `variants` (name -> io settings) the dequant and copy specs
    with those io settings (`dequant_NAME`, `copy_NAME`), and with `flat` the dequant spec without `unpermute`
    (`dequant_flat`: q and k rows left in the file's order, each request's bytes one plain copy: what
    the row permutation's 2-D copies cost)."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["checkpoint"] = str(path)
    doc["budget"] = {"host": host}
    rules = [dict(r, on="host") if on == "host" and "dtype" in r else r for r in doc["rules"]]
    out = {}
    kinds = [("dequant", rules, {}), ("copy", [{"match": "*", "dtype": "keep"}], {})]
    for name, io in (variants or {}).items():  # each variant's dequant against its own plain copy
        kinds += [(f"dequant_{name}", rules, io), (f"copy_{name}", kinds[1][1], io)]
    if flat:
        kinds.append(("dequant_flat", [{k: v for k, v in r.items() if k != "unpermute"} for r in rules], {}))
    for kind, rules, io in kinds:
        p = path.parent.parent / f"{path.parent.name}.{kind}.yaml"
        extra = {"io": {**doc.get("io", {}), **io}} if io else {}
        p.write_text(yaml.safe_dump({**doc, **extra, "rules": rules}, sort_keys=False))
        out[kind] = p
    return out


def _pair(v: dict) -> dict:
    return {"predicted": v.get("predicted"), "issued": v.get("issued", v.get("measured"))}


def counts(rep: dict, file_bytes: int) -> dict:
    h = rep["host"]
    return {"file_GBps": round(file_bytes / rep["wall_seconds"] / 1e9, 3), "wall_s": rep["wall_seconds"],
            "gb_per_s": rep["gb_per_s"], "payload_bytes": rep["payload_bytes"],
            "requests": _pair(rep["requests"]), "copies": _pair(rep["copies"]), "kernels": _pair(rep["kernels"]),
            "host_growth_bytes": h["growth_bytes"], "host_predicted_bytes": h["predicted_peak_bytes"],
            "host_growth_over_predicted": round(h["growth_bytes"] / max(1, h["predicted_peak_bytes"]), 4),
            "launch_s": rep["timings"].get("launch"), "issue_s": rep["timings"].get("issue")}


def loads(quant: str, path: Path, repeat: int, on: str = "device", variants: dict | None = None,
          flat: bool = False) -> dict:
    sp = specs(path, on=on, variants=variants, flat=flat)
    file_bytes = path.stat().st_size
    warm(path)
    runs: dict[str, list] = {k: [] for k in sp}
    for i in range(repeat):
        for kind in (list(sp) if i % 2 == 0 else list(reversed(sp))):
            rc, out, err = planc("run", sp[kind], "--json")
            if rc != 0:
                raise SystemExit(f"{quant} {kind}: planc run failed: {err[-2000:]}")
            runs[kind].append(counts(json.loads(out), file_bytes))
    med = {k: statistics.median(r["file_GBps"] for r in v) for k, v in runs.items()}
    growth = {k: max(r["host_growth_over_predicted"] for r in v) for k, v in runs.items()}
    return {"quant": quant, "on": on, "file_bytes": file_bytes, "dequant_GBps": round(med["dequant"], 2),
            "copy_GBps": round(med["copy"], 2), "ratio": round(med["dequant"] / med["copy"], 3),
            "ratio_target_met": med["dequant"] >= 0.8 * med["copy"],
            "host_growth_over_predicted_max": growth,
            "host_target_met": all(g <= 1.05 for g in growth.values()),
            "variants": {k[8:]: {"GBps": round(v, 2), "copy_GBps": round(med.get(f"copy_{k[8:]}", med["copy"]), 2),
                                 "ratio": round(v / med.get(f"copy_{k[8:]}", med["copy"]), 3)}
                         for k, v in med.items() if k.startswith("dequant_")},  # flat: against the plain copy
            "runs": runs}


def _sync(torch) -> None:
    if not SIMULATED:
        torch.cuda.synchronize()


def handoff(data: Path, preset: str, repeat: int) -> dict:
    import torch
    import transformers

    import planc
    from planc.manifest import read_manifest
    from planc.manifest.gguf_names import transformers_config
    from planc.tools.gguf_llama import llama_config, random_llama_state, write_llama_from_state

    d = data / f"llama-gguf-{preset}"
    path = d / "model.gguf"
    if not (d / ".complete").exists():
        cfg = llama_config(*HANDOFF[preset])
        write_llama_from_state(d, random_llama_state(cfg, seed=0), cfg, quant="Q8_0")
        (d / ".complete").write_text("ok\n")
    doc = yaml.safe_load(SPEC.read_text())
    doc["checkpoint"] = str(path)
    spec = data / f"llama-gguf-{preset}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    warm(path)
    device_map = None if SIMULATED else "cuda"
    if not SIMULATED:  # both libraries' CUDA started before anything is timed
        from numba import cuda

        torch.zeros(1, device="cuda")
        cuda.current_context()

    def hf():
        t0 = time.perf_counter()
        m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=path.name, dtype=torch.bfloat16,
                                                              device_map=device_map)
        m.eval()
        _sync(torch)
        return m, time.perf_counter() - t0, None

    def config_from_header():
        """The config from planc's read of the header (`gguf_names.transformers_config`): the same as
        AutoConfig.from_pretrained(dir, gguf_file=...), which parses the header again in Python."""
        m = read_manifest(str(path))
        return transformers.LlamaConfig(**transformers_config(dict(m.shards[0].metadata), [t.name for t in m.tensors]))

    def mine():
        t0 = time.perf_counter()
        config = config_from_header()
        config_s.append(time.perf_counter() - t0)
        with torch.device("meta"):
            m = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        res = planc.load_into(m, spec)
        m.eval()
        _sync(torch)
        return m, time.perf_counter() - t0, res

    # transformers' modules imported before anything is timed: a meta-device Llama built once
    with torch.device("meta"):
        transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**llama_config(*HANDOFF["tiny"])))
    t0 = time.perf_counter()
    auto = transformers.AutoConfig.from_pretrained(d, gguf_file=path.name)
    autoconfig_s = time.perf_counter() - t0
    differ_config = {k: v for k, v in config_from_header().to_diff_dict().items()
                     if auto.to_diff_dict().get(k) != v and k not in ("_name_or_path", "_model_name_or_path")}
    times: dict[str, list] = {"transformers": [], "planc": []}
    config_s: list = []
    kept: dict = {}
    for i in range(repeat):
        for kind in (("transformers", "planc") if i % 2 == 0 else ("planc", "transformers")):
            m, s, res = (hf if kind == "transformers" else mine)()
            times[kind].append(round(s, 4))
            if i == repeat - 1:
                kept[kind] = (m, res)
            else:
                if res is not None:
                    res.model.free()
                del m
    a_mod, (b_mod, res) = kept["transformers"][0], kept["planc"]
    a, b = a_mod.state_dict(), b_mod.state_dict()
    differ = _c.weights_differ(a, b, torch)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a_mod.config.vocab_size, (2, 64), generator=g).to(next(a_mod.parameters()).device)
    with torch.no_grad():
        la, lb = a_mod(ids).logits, b_mod(ids.to(next(b_mod.parameters()).device)).logits.to(ids.device)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"preset": preset, "file_bytes": path.stat().st_size, "simulated": SIMULATED,
           "weights": len(a), "weights_differ": differ[:20], "extra_in_planc": sorted(set(b) - set(a))[:20],
           "logits_equal": bool(torch.equal(la, lb)),
           "logits_max_abs_diff": float((la.float() - lb.float()).abs().max()),
           "transformers_s": times["transformers"], "planc_s": times["planc"],
           "transformers_median_s": round(med["transformers"], 4), "planc_median_s": round(med["planc"], 4),
           "speedup": round(med["transformers"] / med["planc"], 2),
           "speedup_target_met": med["transformers"] >= 5 * med["planc"],
           "planc_config_from_header_s": round(statistics.median(config_s), 4),
           "autoconfig_from_gguf_s": round(autoconfig_s, 4), "config_differs_from_autoconfig": differ_config,
           "missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys),
           "planc_timings": {k: round(v, 4) for k, v in (res.report.get("timings") or {}).items()
                             if isinstance(v, (int, float))}}
    res.model.free()
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="15GiB", help="each GGUF's size (0: the tiny 2-layer file)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quants", default="Q8_0,Q4_K_M")
    ap.add_argument("--handoff", choices=("small", "tiny", "none"), default="small")
    ap.add_argument("--handoff-repeat", type=int, default=3)
    ap.add_argument("--on", choices=("device", "host"), default="host" if SIMULATED else "device",
                    help="where the loads dequantize (the simulator's default is host: its kernels are slow)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="also load the dequant spec with these io settings (e.g. rows:strided=rows)")
    ap.add_argument("--flat", action="store_true", help="also load the dequant spec without unpermute (dequant_flat)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="every file of the preset of this width (4096: Llama-3-8B-like), its layers fitting --size; "
                         "default: the largest preset of which 8 layers fit")
    a = ap.parse_args(argv)
    try:
        a.variants = {n: dict(kv.split("=", 1) for kv in rest.split(",") if kv)
                      for n, rest in (v.split(":", 1) for v in a.variant)}
    except ValueError:
        ap.error("--variant takes NAME:KEY=VALUE[,KEY=VALUE]")
    if a.repeat < 1 or a.handoff_repeat < 1:
        ap.error("--repeat and --handoff-repeat must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    from planc.base.units import parse_bytes

    a.data.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"simulated": SIMULATED, "loads": []}
    size = parse_bytes(a.size) if a.size not in ("0", "") else 0
    for quant in [q for q in a.quants.split(",") if q]:
        t0 = time.time()
        path = checkpoint(a.data, quant, size, a.hidden)
        print(f"{quant}: {path.stat().st_size / 2**30:.2f} GiB file ready in {time.time() - t0:.1f} s", flush=True)
        r = loads(quant, path, a.repeat, a.on, a.variants, a.flat)
        result["loads"].append(r)
        last = r["runs"]["dequant"][-1]
        print(f"{quant}: dequant {r['dequant_GBps']} GB/s, copy {r['copy_GBps']} GB/s of file bytes, ratio "
              f"{r['ratio']}; dequant requests {last['requests']} copies {last['copies']} kernels {last['kernels']}; "
              f"host growth / predicted (max) {r['host_growth_over_predicted_max']}; variants {r['variants']}; "
              f"kernel launch s (median) {statistics.median(x['launch_s'] or 0 for x in r['runs']['dequant']):.4f}",
              flush=True)
    (a.out / "gguf.json").write_text(json.dumps(result, indent=1))  # the loads kept if the hand-off fails
    if a.handoff != "none":
        t0 = time.time()
        result["handoff"] = handoff(a.data, a.handoff, a.handoff_repeat)
        print(json.dumps(result["handoff"]), flush=True)
        print(f"hand-off in {time.time() - t0:.1f} s", flush=True)
    (a.out / "gguf.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Each GGUF architecture planc maps, against transformers' own GGUF load, on the GPU.

    python3 bench/gguf_archs.py DATA OUT [--archs llama,mistral,qwen2,qwen3,qwen3moe,gemma3] [--quant Q8_0]

For each architecture: a model with random weights (`planc.tools.gguf_model.random_state`, small
dims transformers' loader accepts: Qwen3's head dim 128 and Qwen3-MoE's expert width 768, which it
does not read from the file) written as llama.cpp's converter writes it (`write_from_state`), then

* transformers: `AutoModelForCausalLM.from_pretrained(dir, gguf_file="model.gguf", dtype=bfloat16,
  device_map="cuda")`;
* planc: the config from planc's read of the header (`gguf_names.transformers_config`, checked equal
  to `AutoConfig.from_pretrained(dir, gguf_file=...)`), the module built on the meta device, and
  `planc.load_into(module, spec)` with the shipped spec (`specs/transformers-{arch}-gguf.yaml`).

Under the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, no GPU) it runs the same comparison with
transformers on the CPU and smaller models (planc's kernels simulated; the times mean nothing).

Reported: every weight bit-equal (names, shapes, dtypes, values), the logits on the same tokens
equal (`torch.equal`), the config's differences from AutoConfig's, both load times (one load each:
the models are small; the speed of the loads is bench/gguf.py's). Needs torch, transformers,
accelerate and gguf. Everything goes to OUT/gguf_archs.json (and is printed); exit 1 when any
architecture differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This folder holds gguf.py, which would shadow the `gguf` package: it leaves the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import importlib.util  # noqa: E402

import yaml  # noqa: E402


def _common():
    """bench/common.py, loaded by file (its folder is off the import path)."""
    spec = importlib.util.spec_from_file_location("bench_common", HERE / "common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
SPEC = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3-moe",
        "gemma3": "gemma3"}
# hidden, layers, heads, kv heads, intermediate, vocab (under the simulator, whose kernels run each
# thread in Python: smaller; the head dims and expert width transformers assumes for qwen3 / qwen3moe kept)
DIMS = (256, 2, 4, 2, 512, 512)
SIM_DIMS = (64, 1, 4, 2, 64, 64)
SIM_EXTRA = {"experts": 2, "experts_used": 1}
DEVICE = "cpu" if SIMULATED else "cuda"


def _sync(torch) -> None:
    if not SIMULATED:
        torch.cuda.synchronize()


def one(data: Path, arch: str, quant: str) -> dict:
    import torch
    import transformers

    import planc
    from planc.manifest import read_manifest
    from planc.manifest.gguf_names import transformers_config
    from planc.tools.gguf_model import config_of, random_state, write_from_state

    d = data / f"arch-{arch}-{quant}"
    cfg = config_of(arch, *SIM_DIMS, **SIM_EXTRA) if SIMULATED else config_of(arch, *DIMS)
    state = random_state(arch, cfg, seed=0)
    path = write_from_state(d, state, cfg, arch, quant=quant)
    doc = yaml.safe_load((ROOT / "specs" / f"transformers-{SPEC[arch]}-gguf.yaml").read_text())
    doc["checkpoint"] = str(path)
    spec = data / f"arch-{arch}-{quant}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))

    def hf_load(folder, file):
        t0 = time.perf_counter()
        m = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file.name, dtype=torch.bfloat16,
                                                              device_map=DEVICE)
        _sync(torch)
        return m, time.perf_counter() - t0

    ref, ref_d, ref_path = None, d, path
    try:
        a_mod, hf_s = hf_load(d, path)
    except NotImplementedError as e:
        if arch != "mistral":
            raise
        # transformers turns a llama file whose name holds "mistral" into model type mistral, then asks
        # gguf-py for a "mistral" name map, which it has not: its own Mistral GGUF load fails. The
        # reference is then the same tensors written as a Llama file, which it loads as a
        # LlamaForCausalLM (the same weights and names; the same logits at 32 tokens, inside the window).
        ref = f"transformers cannot load a Mistral GGUF ({str(e)[:70]}...); reference: the same tensors as a Llama"
        ref_d = data / f"arch-{arch}-{quant}-as-llama"
        ref_path = write_from_state(ref_d, state, {**cfg, "model_type": "llama"}, "llama", quant=quant)
        a_mod, hf_s = hf_load(ref_d, ref_path)
    auto = transformers.AutoConfig.from_pretrained(ref_d, gguf_file=ref_path.name)

    t0 = time.perf_counter()
    man = read_manifest(str(path))
    kw = transformers_config(dict(man.shards[0].metadata), [t.name for t in man.tensors])
    config = transformers.AutoConfig.for_model(**kw)
    with torch.device("meta"):
        b_mod = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    res = planc.load_into(b_mod, spec)
    _sync(torch)
    planc_s = time.perf_counter() - t0

    # `dtype`: from_config writes the dtype it was given into the config it builds from.
    skip = ("_name_or_path", "_model_name_or_path", "transformers_version", "dtype")
    ad, bd = auto.to_diff_dict(), config.to_diff_dict()
    differ_config = {k: (ad.get(k), bd.get(k)) for k in set(ad) | set(bd) if ad.get(k) != bd.get(k) and k not in skip}
    a, b = a_mod.state_dict(), b_mod.state_dict()
    differ = _common().weights_differ(a, b, torch)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a_mod.config.vocab_size, (2, 32), generator=g).to(DEVICE)
    a_mod.eval()
    b_mod.eval()
    with torch.no_grad():
        la, lb = a_mod(ids).logits, b_mod(ids).logits
    out = {"arch": arch, "quant": quant, "model_type": kw["model_type"], "file_bytes": path.stat().st_size,
           "weights": len(a), "weights_differ": differ[:20], "missing_in_planc": sorted(set(a) - set(b))[:20],
           "extra_in_planc": sorted(set(b) - set(a))[:20], "logits_equal": bool(torch.equal(la, lb)),
           "logits_max_abs_diff": float((la.float() - lb.float()).abs().max()),
           "config_differs_from_autoconfig": {k: [str(x) for x in v] for k, v in differ_config.items()},
           "transformers_s": round(hf_s, 3), "planc_s": round(planc_s, 3),
           "missing": list(res.missing_keys), "unexpected": list(res.unexpected_keys),
           "tied": [list(t) for t in res.tied] if res.tied else []}
    if ref is not None:
        out["reference"] = ref
    out["equal"] = (not differ and not out["missing_in_planc"] and not out["extra_in_planc"] and out["logits_equal"]
                    and (not differ_config or ref is not None))
    res.model.free()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--archs", default="llama,mistral,qwen2,qwen3,qwen3moe,gemma3")
    ap.add_argument("--quant", default="Q8_0")
    a = ap.parse_args(argv)
    a.data.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    import torch
    from numba import cuda

    torch.zeros(1, device=DEVICE)
    cuda.current_context()
    results, ok = [], True
    for arch in [x for x in a.archs.split(",") if x]:
        try:
            r = one(a.data, arch, a.quant)
        except Exception as e:  # noqa: BLE001 - one architecture's failure is reported, the rest still run
            r = {"arch": arch, "equal": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        ok = ok and r["equal"]
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
        if "trace" in r:
            print(r["trace"], flush=True)
    (a.out / "gguf_archs.json").write_text(json.dumps(results, indent=1))
    print("all equal" if ok else "DIFFER", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Hand-off benchmark: time to a ready PyTorch module, transformers' `from_pretrained` against
`planc.load_into` a meta-device model, on checkpoints transformers itself writes.

    python bench/handoff.py OUT [--large] [--no-mixtral] [--repeats 3] [--dtypes bf16,fp16]

Needs a GPU, torch and transformers (5.x: Mixtral's experts fused on load). Everything is written
under OUT: the checkpoints (`save_pretrained`, sharded, with their index), the specs (copies of
`specs/*.yaml` pointing at them) and `handoff.json`, which is also printed. In one process:

1. For each model (a ~2 GB Llama; with `--large` a ~15 GB Llama-3-8B shape; a small Mixtral) and
   dtype (bf16 as stored; fp16: transformers casts on load, planc converts on the device):
   - `from_pretrained(dir, dtype=..., device_map="cuda")`, synchronised: seconds to a ready module;
   - `from_config` on the meta device + `planc.load_into(module, spec)` (spec compiled in the call),
     and the same from a saved plan (`plan.json`, the fast path): seconds to a ready module;
   - the logits of both modules on the same tokens, `torch.equal`.
   The first round warms the page cache, CUDA and planc's kernels and is reported apart; then
   `repeats` rounds alternate the order, and the medians are reported.
2. The Mixtral checkpoint in its Hub layout (per-expert w1/w2/w3; rewritten from the saved tensors
   if this transformers saves the fused layout): `planc.load` with `specs/transformers-mixtral.yaml`
   (experts fused and stacked by placement) against a plain copy of the same files, and the same
   spec with no request scattered, loaded in turn: GB/s, and the plans' requests, copies and kernels.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"

# transformers config kwargs; sizes in bf16
MODELS = {
    # TinyLlama-1.1B shape: 2.2 GB
    "llama-2GB": ("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                                tie_word_embeddings=False)),
    # Llama-3-8B shape: 16 GB
    "llama-15GB": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                 rope_theta=500000.0, tie_word_embeddings=False)),
    # 8 layers, 16 experts: 1.6 GB
    "mixtral-small": ("mixtral", dict(vocab_size=32000, hidden_size=1024, intermediate_size=1792, num_hidden_layers=8,
                                      num_attention_heads=16, num_key_value_heads=8, num_local_experts=16,
                                      num_experts_per_tok=2, max_position_embeddings=4096,
                                      tie_word_embeddings=False)),
}
SPEC_OF = {"llama": "transformers-llama", "mixtral": "transformers-mixtral"}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder for checkpoints, specs, plans and handoff.json")
    p.add_argument("--large", action="store_true", help="also the ~15 GB Llama-3-8B-shaped model")
    p.add_argument("--no-mixtral", dest="mixtral", action="store_false", help="skip the Mixtral model and the fused-MoE rate")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up round (default 3)")
    p.add_argument("--dtypes", default="bf16,fp16", type=lambda s: [d.strip() for d in s.split(",") if d.strip()],
                   help="comma-separated: bf16 (as stored), fp16 (converted on load)")
    p.add_argument("--tokens", type=int, default=64, help="prompt length for the logits check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default=None, type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                   help=f"only these models (of {', '.join(MODELS)}); default: by --large and --no-mixtral")
    a = p.parse_args(argv)
    bad = sorted(set(a.dtypes) - set(TORCH_DTYPES))
    if bad or not a.dtypes:
        p.error(f"--dtypes takes {', '.join(TORCH_DTYPES)}; got {a.dtypes}")
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    return a


def models_of(args) -> list[str]:
    if args.models:
        return args.models
    names = ["llama-2GB"] + (["llama-15GB"] if args.large else []) + (["mixtral-small"] if args.mixtral else [])
    return names


# ------------------------------------------------------------------------------------------
# checkpoints and specs


def config_of(name: str):
    import transformers

    family, kw = MODELS[name]
    cls = transformers.LlamaConfig if family == "llama" else transformers.MixtralConfig
    return cls(**kw)


def write_model(out: Path, name: str, seed: int) -> Path:
    """`save_pretrained` of a randomly initialised model (bf16, 1 GB shards), once."""
    import torch
    import transformers

    d = out / name
    if (d / ".complete").exists():
        return d
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_of(name), dtype=torch.bfloat16)
    model.save_pretrained(d, max_shard_size="1GB")
    del model
    gc.collect()
    (d / ".complete").write_text("ok\n")
    return d


def weight_names(ckpt: Path) -> list[str]:
    from safetensors import safe_open

    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        return sorted(json.loads(index.read_text())["weight_map"])
    names = []
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), "np") as st:
            names += list(st.keys())
    return sorted(names)


def hub_layout_mixtral(ckpt: Path) -> Path:
    """The Mixtral checkpoint with per-expert w1/w2/w3 and `block_sparse_moe` names, as on the Hub.

    If `save_pretrained` already wrote that layout, the same folder; else a copy rewritten from the
    fused tensors (gate_up_proj[e] = [w1; w3], down_proj[e] = w2) beside it."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    names = weight_names(ckpt)
    if any(".block_sparse_moe.experts.0.w1.weight" in n for n in names):
        return ckpt
    out = ckpt.parent / f"{ckpt.name}-hub"
    if (out / ".complete").exists():
        return out
    out.mkdir(exist_ok=True)
    for f in ckpt.iterdir():
        if f.suffix == ".json" and not f.name.endswith(".index.json"):
            shutil.copy(f, out / f.name)
    weight_map = {}
    for k, f in enumerate(sorted(ckpt.glob("*.safetensors"))):
        src, dst = load_file(str(f)), {}
        for n, t in src.items():
            if n.endswith(".mlp.experts.gate_up_proj"):
                p = n[:-len(".mlp.experts.gate_up_proj")] + ".block_sparse_moe.experts"
                inter = t.shape[1] // 2
                for e in range(t.shape[0]):
                    dst[f"{p}.{e}.w1.weight"] = t[e, :inter].contiguous()
                    dst[f"{p}.{e}.w3.weight"] = t[e, inter:].contiguous()
            elif n.endswith(".mlp.experts.down_proj"):
                p = n[:-len(".mlp.experts.down_proj")] + ".block_sparse_moe.experts"
                for e in range(t.shape[0]):
                    dst[f"{p}.{e}.w2.weight"] = t[e].contiguous()
            elif n.endswith(".mlp.gate.weight"):
                dst[n.replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")] = t
            else:
                dst[n] = t
        fname = f"model-{k + 1:05d}.safetensors"
        save_file(dst, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in dst})
        del src, dst
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / ".complete").write_text("ok\n")
    return out


def write_spec(out: Path, base: str, ckpt: Path, dtype: str, name: str) -> Path:
    """A copy of `specs/{base}.yaml` pointing at `ckpt`; for fp16 every loading rule converts."""
    import yaml

    doc = yaml.safe_load((SPECS / f"{base}.yaml").read_text())
    doc["checkpoint"] = str(ckpt)
    if dtype == "fp16":
        for r in doc["rules"]:
            if not r.get("skip"):
                r["dtype"] = "float16"
    p = out / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


# ------------------------------------------------------------------------------------------
# timed loads


BREAKDOWN: list = []  # per planc load: where the time went


def _sync():
    import torch

    torch.cuda.synchronize()


def hf_load(ckpt: Path, dtype: str):
    import torch
    import transformers

    t0 = time.perf_counter()
    m = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, TORCH_DTYPES[dtype]),
                                                          device_map="cuda")
    m.eval()
    _sync()
    return m, time.perf_counter() - t0, None


def planc_load(ckpt: Path, dtype: str, target):
    import torch
    import transformers

    import planc

    t0 = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(ckpt)
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    t1 = time.perf_counter()
    res = planc.load_into(m, target)
    m.eval()
    _sync()
    t2 = time.perf_counter()
    rep = res.report.as_json()
    # where the time goes: the meta-device module, planc's prepare (fingerprints, live room, device),
    # the streaming load itself, and the rest (compile or plan decode, hand-off, buffers)
    BREAKDOWN.append({"meta_s": t1 - t0, "load_into_s": t2 - t1, "prepare_s": rep["timings"].get("prepare"),
                      "load_s": rep["wall_seconds"], "target": str(target)})
    return m, t2 - t0, res


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(ids).logits


def _drop(*objs):
    import torch

    for o in objs:
        if o is not None and hasattr(o, "model") and hasattr(o.model, "free"):
            o.model.free()
    del objs
    gc.collect()
    torch.cuda.empty_cache()


def compare(name: str, ckpt: Path, dtype: str, out: Path, args) -> dict:
    import torch

    from planc.compiler.compile import compile_spec
    from planc.plan.codec import save_plan

    family = MODELS[name][0]
    spec = write_spec(out, SPEC_OF[family], ckpt, dtype, f"{name}.{dtype}")
    plan_path = out / f"{name}.{dtype}.plan.json"
    save_plan(compile_spec(spec), plan_path)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, MODELS[name][1]["vocab_size"], (1, args.tokens), generator=g).cuda()
    loaders = {"from_pretrained": lambda: hf_load(ckpt, dtype),
               "planc_spec": lambda: planc_load(ckpt, dtype, spec),
               "planc_plan": lambda: planc_load(ckpt, dtype, plan_path)}
    times = {k: [] for k in loaders}
    first, equal, report = {}, {}, None
    for rnd in range(args.repeats + 1):
        order = list(loaders) if rnd % 2 == 0 else list(reversed(loaders))
        for k in order:
            m, sec, res = loaders[k]()
            if rnd == 0:
                first[k] = sec
                if k == "from_pretrained":
                    ref = logits(m, ids).cpu()
                else:
                    equal[k] = bool(torch.equal(ref, logits(m, ids).cpu()))
                    report = report or {"missing": res.missing_keys, "unexpected": res.unexpected_keys,
                                        "rebuilt_buffers": res.rebuilt_buffers,
                                        "gb_per_s": res.report.get("gb_per_s"),
                                        "load_seconds": res.report.get("wall_seconds")}
            else:
                times[k].append(sec)
            _drop(res)
            del m
            _drop()
    med = {k: statistics.median(v) for k, v in times.items()}
    split = {}
    for kind, suffix in (("planc_spec", ".yaml"), ("planc_plan", ".json")):
        rows = [b for b in BREAKDOWN[-2 * (args.repeats + 1):] if b["target"].endswith(suffix)][1:]
        split[kind] = {k: statistics.median([r[k] for r in rows if r[k] is not None] or [0])
                       for k in ("meta_s", "load_into_s", "prepare_s", "load_s")}
    return {"model": name, "dtype": dtype, "checkpoint": str(ckpt), "first_seconds": first,
            "median_seconds": med, "seconds": times, "logits_equal": equal,
            "speedup_spec": med["from_pretrained"] / med["planc_spec"],
            "speedup_plan": med["from_pretrained"] / med["planc_plan"], "planc": report, "breakdown": split}


def fused_rate(ckpt: Path, out: Path, repeats: int) -> dict:
    """GB/s of the transformers 5 fused-experts load against a plain copy of the same files.

    Three plans, loaded in turn round by round (the first round warms up and is left out):
    `fused` (the shipped spec, as compiled), `plain` (every tensor as stored) and `fused_direct`
    (the shipped spec with no request scattered: every piece its own copy, no device staging), so
    that the scatter kernel's share is measured beside the rest."""
    import yaml

    import planc
    from planc.compiler import schedule
    from planc.compiler.compile import compile_spec

    fused = write_spec(out, "transformers-mixtral", ckpt, "bf16", "mixtral.fused")
    doc = yaml.safe_load(fused.read_text())
    doc["rules"] = [{"match": "*"}]
    plain = out / "mixtral.plain.yaml"
    plain.write_text(yaml.safe_dump(doc, sort_keys=False))
    plans = {"fused": compile_spec(fused), "plain": compile_spec(plain)}
    keep = schedule.SCATTER_MIN_COPIES
    try:  # this bench's variants only: no request scattered; every request of two places or more
        for name, least in (("fused_direct", 1 << 62), ("fused_scatter2", 2)):
            schedule.SCATTER_MIN_COPIES = least
            plans[name] = compile_spec(fused)
    finally:
        schedule.SCATTER_MIN_COPIES = keep
    rates = {k: [] for k in plans}
    walls = {k: [] for k in plans}
    for i in range(repeats + 1):  # round 0 warms up
        order = list(plans) if i % 2 == 0 else list(reversed(plans))
        for k in order:
            m = planc.load(plans[k])
            if i:
                rates[k].append(m.report["gb_per_s"])
                walls[k].append(m.report["wall_seconds"])
            m.free()
    result = {}
    for k, plan in plans.items():
        totals = plan.totals._asdict()
        result[k] = {"gb_per_s": statistics.median(rates[k]), "all_gb_per_s": rates[k],
                     "wall_seconds": statistics.median(walls[k]),
                     "requests": totals["requests"], "copies": totals["copies"], "kernels": totals["kernels"],
                     "scatters": totals["scatters"], "staging_bytes": plan.layout.staging_bytes,
                     "payload_bytes": totals["payload_bytes"]}
    result["ratio"] = result["fused"]["gb_per_s"] / result["plain"]["gb_per_s"]
    result["ratio_direct"] = result["fused_direct"]["gb_per_s"] / result["plain"]["gb_per_s"]
    result["ratio_scatter2"] = result["fused_scatter2"]["gb_per_s"] / result["plain"]["gb_per_s"]
    result["ratio_by_round"] = [f / p for f, p in zip(rates["fused"], rates["plain"])]
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    if not torch.cuda.is_available():
        print("bench/handoff.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.zeros(1, device="cuda")  # the CUDA context, before any timing
    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0]}
    results, moe = [], None
    for name in models_of(args):
        ckpt = write_model(args.out, name, args.seed)
        if MODELS[name][0] == "mixtral":
            ckpt = hub_layout_mixtral(ckpt)
        for dtype in args.dtypes:
            r = compare(name, ckpt, dtype, args.out, args)
            results.append(r)
            print(json.dumps({k: r[k] for k in ("model", "dtype", "median_seconds", "logits_equal")}), file=sys.stderr)
        if MODELS[name][0] == "mixtral":
            moe = fused_rate(ckpt, args.out, args.repeats)
    doc = {"env": env, "results": results, "fused_moe": moe}
    (args.out / "handoff.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile-time scaling: compile + explain of DeepSeek-V3-shaped checkpoints from ~1k to ~100k tensors.

    python bench/compile_scale.py OUT_DIR [--sizes 1k,3k,10k,30k,91k,100k] [--repeat 3]

Writes sparse checkpoints (headers plus a hole: no data on disk) into OUT_DIR, once, with a
`model.safetensors.index.json` each, and a spec beside each: experts stacked per layer and
projection and dequantized from FP8 to bfloat16, the other FP8 weights dequantized, the rest
copied. Then, for each size and each repeat, a fresh Python process imports planc and times
`compile_spec`, `explain_doc` and `planc.plan.codec.encode` separately (wall clock; the CPU time of compile +
explain beside it, since other work on the machine stretches the wall clock) and reports its peak
RSS (VmHWM) at the end. The table shows the median of the repeats. One JSON line per run goes to
OUT_DIR/compile_scale.jsonl; `plan_sha256` is the digest of the plan's JSON, so a faster compiler
can be checked to write the same plan.

The layout is DeepSeek-V3's (hidden 7168, MLA attention, 3 dense layers then MoE layers of 256
routed experts of width 2048 and one shared expert, vocabulary 129,280): linear weights are
F8_E4M3 with an F32 `{name}_scale_inv` of 128x128 blocks, norms, router, embeddings and heads BF16.
`91k` is the full model, layer 61 being the multi-token-prediction layer: 91,991 tensors in 163
shards. The other sizes keep the dimensions and change the number of MoE layers and experts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HIDDEN = 7168
VOCAB = 129280
INTERMEDIATE = 18432
MOE_INTERMEDIATE = 2048
Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD, HEADS = 1536, 512, 64, 128, 128, 128
BLOCK = 128
DENSE_LAYERS = 3
FULL_SHARDS = 163


@dataclass(frozen=True)
class Variant:
    label: str
    moe_layers: int
    experts: int
    mtp: bool = False  # the multi-token-prediction layer after the last decoder layer


# Sizes from ~1k to ~100k tensors. 91k is DeepSeek-V3 itself (58 MoE layers + the MTP layer).
VARIANTS = {v.label: v for v in (
    Variant("1k", 2, 74),
    Variant("3k", 4, 119),
    Variant("10k", 6, 256),
    Variant("30k", 19, 256),
    Variant("91k", 58, 256, mtp=True),
    Variant("100k", 64, 256),
)}


def _scale(r: int, c: int) -> tuple[int, int]:
    return -(-r // BLOCK), -(-c // BLOCK)


def _fp8(name: str, r: int, c: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(name, "F8_E4M3", (r, c)), (f"{name}_scale_inv", "F32", _scale(r, c))]


def _decoder_layer(i: int, experts: int) -> list[tuple[str, str, tuple[int, ...]]]:
    p = f"model.layers.{i}"
    out = [(f"{p}.input_layernorm.weight", "BF16", (HIDDEN,))]
    a = f"{p}.self_attn"
    out += _fp8(f"{a}.q_a_proj.weight", Q_LORA, HIDDEN)
    out.append((f"{a}.q_a_layernorm.weight", "BF16", (Q_LORA,)))
    out += _fp8(f"{a}.q_b_proj.weight", HEADS * (NOPE + ROPE), Q_LORA)
    out += _fp8(f"{a}.kv_a_proj_with_mqa.weight", KV_LORA + ROPE, HIDDEN)
    out.append((f"{a}.kv_a_layernorm.weight", "BF16", (KV_LORA,)))
    out += _fp8(f"{a}.kv_b_proj.weight", HEADS * (NOPE + V_HEAD), KV_LORA)
    out += _fp8(f"{a}.o_proj.weight", HIDDEN, HEADS * V_HEAD)
    out.append((f"{p}.post_attention_layernorm.weight", "BF16", (HIDDEN,)))
    m = f"{p}.mlp"
    if i < DENSE_LAYERS:
        out += _fp8(f"{m}.gate_proj.weight", INTERMEDIATE, HIDDEN)
        out += _fp8(f"{m}.up_proj.weight", INTERMEDIATE, HIDDEN)
        out += _fp8(f"{m}.down_proj.weight", HIDDEN, INTERMEDIATE)
        return out
    out.append((f"{m}.gate.weight", "BF16", (experts, HIDDEN)))
    out.append((f"{m}.gate.e_score_correction_bias", "F32", (experts,)))
    for e in range(experts):
        out += _fp8(f"{m}.experts.{e}.gate_proj.weight", MOE_INTERMEDIATE, HIDDEN)
        out += _fp8(f"{m}.experts.{e}.up_proj.weight", MOE_INTERMEDIATE, HIDDEN)
        out += _fp8(f"{m}.experts.{e}.down_proj.weight", HIDDEN, MOE_INTERMEDIATE)
    out += _fp8(f"{m}.shared_experts.gate_proj.weight", MOE_INTERMEDIATE, HIDDEN)
    out += _fp8(f"{m}.shared_experts.up_proj.weight", MOE_INTERMEDIATE, HIDDEN)
    out += _fp8(f"{m}.shared_experts.down_proj.weight", HIDDEN, MOE_INTERMEDIATE)
    return out


def tensors(v: Variant) -> list[tuple[str, str, tuple[int, ...]]]:
    """The checkpoint's tensors in model order: (name, safetensors dtype, shape)."""
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    layers = DENSE_LAYERS + v.moe_layers
    for i in range(layers):
        out += _decoder_layer(i, v.experts)
    out.append(("model.norm.weight", "BF16", (HIDDEN,)))
    out.append(("lm_head.weight", "BF16", (VOCAB, HIDDEN)))
    if v.mtp:
        p = f"model.layers.{layers}"
        out += [(f"{p}.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)),
                (f"{p}.enorm.weight", "BF16", (HIDDEN,)),
                (f"{p}.hnorm.weight", "BF16", (HIDDEN,)),
                (f"{p}.eh_proj.weight", "BF16", (HIDDEN, 2 * HIDDEN)),
                (f"{p}.shared_head.norm.weight", "BF16", (HIDDEN,)),
                (f"{p}.shared_head.head.weight", "BF16", (VOCAB, HIDDEN))]
        out += _decoder_layer(layers, v.experts)
    return out


def _nbytes(dtype: str, shape) -> int:
    from planc.base.dtypes import DTYPES

    return DTYPES[dtype].nbytes(math.prod(shape))


def write_variant(out: Path, v: Variant, full_bytes: int) -> tuple[Path, int, int]:
    """Write the sparse checkpoint and its spec once; returns (spec path, tensors, shards)."""
    from planc.tools.synth import METADATA, shard_name, split_balanced, write_safetensors

    ts = tensors(v)
    sizes = [_nbytes(dt, shape) for _, dt, shape in ts]
    # Shards of about the full model's shard size (~4.2 GB), as the real checkpoint has.
    shards = max(1, min(len(ts), round(sum(sizes) * FULL_SHARDS / full_bytes)))
    ckpt = out / f"dsv3-{v.label}"
    spec = out / f"dsv3-{v.label}.yaml"
    marker = ckpt / ".complete"
    want = {"tensors": len(ts), "shards": shards, "bytes": sum(sizes)}
    if not (marker.exists() and json.loads(marker.read_text()) == want and spec.exists()):
        ckpt.mkdir(parents=True, exist_ok=True)
        for p in ckpt.iterdir():
            p.unlink()
        starts = split_balanced(sizes, shards) + [len(ts)]
        weight_map = {}
        for k in range(shards):
            name = shard_name(k + 1, shards)
            group = ts[starts[k]:starts[k + 1]]
            write_safetensors(ckpt / name, [(n, dt, shape, None) for n, dt, shape in group], METADATA, sparse=True)
            weight_map.update({n: name for n, _, _ in group})
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        spec.write_text(_spec_text(ckpt))
        marker.write_text(json.dumps(want))
    return spec, len(ts), shards


def _spec_text(ckpt: Path) -> str:
    return f"""# DeepSeek-V3 shaped: experts stacked per layer and projection, FP8 dequantized to bfloat16.
checkpoint: {json.dumps(str(ckpt))}
budget:
  host: 8GiB
rules:
  - match: "model.layers.{{L}}.mlp.experts.{{E}}.{{W}}.weight"
    source_dtype: [F8_E4M3]
    dequantize: {{}}
    dtype: bfloat16
    stack: {{into: "model.layers.{{L}}.mlp.experts.{{W}}", over: E}}
  - match: "*"
    source_dtype: [F8_E4M3]
    dequantize: {{}}
  - match: "*"
"""


# --------------------------------------------------------------------------- one measured run


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def worker(spec: str) -> None:
    import hashlib

    t0 = time.perf_counter()
    from planc.compiler.compile import compile_spec
    from planc.plan.explain import explain_doc
    from planc.plan.codec import encode

    t1, c1 = time.perf_counter(), time.process_time()
    plan = compile_spec(spec)
    t2 = time.perf_counter()
    explain_doc(plan)
    t3, c3 = time.perf_counter(), time.process_time()
    text = encode(plan)
    t4 = time.perf_counter()
    print(json.dumps({
        "import_s": t1 - t0, "compile_s": t2 - t1, "explain_s": t3 - t2, "to_json_s": t4 - t3,
        "compile_explain_cpu_s": c3 - c1,
        "peak_rss_bytes": _vm("VmHWM"), "plan_bytes": len(text),
        "plan_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "parts": len(plan.parts), "steps": len(plan.steps), "fits": plan.fits,
    }))


def _run_once(spec: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--worker", str(spec)], capture_output=True, text=True,
                       cwd=ROOT, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"worker failed on {spec}:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- driver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--sizes", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker)
        return 0
    if not a.out_dir:
        ap.error("OUT_DIR is required")
    out = Path(a.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    full_bytes = sum(_nbytes(dt, s) for _, dt, s in tensors(VARIANTS["91k"]))
    labels = [s.strip() for s in a.sizes.split(",") if s.strip()]
    unknown = [s for s in labels if s not in VARIANTS]
    if unknown:
        ap.error(f"unknown sizes {unknown}; known: {', '.join(VARIANTS)}")

    rows = []
    log = out / "compile_scale.jsonl"
    for label in labels:
        spec, n, shards = write_variant(out, VARIANTS[label], full_bytes)
        runs = []
        for k in range(a.repeat):
            r = _run_once(spec)
            r.update(size=label, tensors=n, shards=shards, repeat=k)
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            runs.append(r)
        digests = {r["plan_sha256"] for r in runs}
        if len(digests) != 1:
            raise SystemExit(f"{label}: the plan differs between runs: {sorted(digests)}")
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("import_s", "compile_s", "explain_s", "to_json_s", "compile_explain_cpu_s", "peak_rss_bytes")}
        rows.append((label, n, shards, runs[0]["parts"], runs[0]["steps"], med, runs[0]["plan_sha256"]))
        print(f"{label}: {n} tensors, {shards} shards: compile {med['compile_s']:.3f} s, "
              f"explain {med['explain_s']:.3f} s, peak {med['peak_rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nmedian of {a.repeat} fresh processes; python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
          f"load average {load} at the end\n")
    print("| size | tensors | shards | parts | steps | compile s | explain s | compile + explain s "
          "| (cpu s) | to_json s | import s | peak RSS MiB | plan sha256 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, n, shards, parts, steps, m, digest in rows:
        print(f"| {label} | {n:,} | {shards} | {parts:,} | {steps:,} | {m['compile_s']:.3f} | {m['explain_s']:.3f} | "
              f"{m['compile_s'] + m['explain_s']:.3f} | {m['compile_explain_cpu_s']:.3f} | {m['to_json_s']:.3f} | "
              f"{m['import_s']:.3f} | {m['peak_rss_bytes'] / 2**20:.0f} | {digest[:12]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

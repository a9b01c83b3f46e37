"""Tensor-parallel compile bench: bytes read, requests, plan size and compile time per rank (CPU only).

    python bench/tp_compile.py OUT_DIR [--models llama3-70b,mixtral-8x7b,qwen3-30b-a3b] [--tp 1,2,4,8]
                                       [--ranks all|ends] [--repeat 3] [--io merge_gap=64KiB] [--quick]

Writes sparse checkpoints (headers plus a hole: no data on disk) with the real Hub tensor names and
shapes of Llama-3-70B, Mixtral-8x7B and Qwen3-30B-A3B (bf16), once, and for each tensor-parallel
size a spec with the usual split: q/k/v (fused per rank), gate/up, embeddings and lm_head along
dim 0, o_proj and down_proj along dim 1, norms and the MoE router replicated; for MoE, tensor
parallel within every expert (w1/w3 or gate/up along dim 0, w2 or down along dim 1).

For every size and rank a fresh Python process compiles the rank's plan (`compile_spec`, timed
alone, as bench/compile_scale.py does), explains it, and writes it as `planc compile SPEC --rank R
-o FILE` would (`save_plan`). The median of the repeats is kept. One JSON line per process goes to
OUT_DIR/tp_compile.jsonl; the table and the targets follow on stdout:

- every rank's bytes read <= 1.25x its payload (a rank reads its own bytes, not whole rows);
- every rank's plan file and compile time <= 1.5x those of the TP 1 plan of the same model.

A target that is not met is reported as FAIL; the exit status is 0 unless `--strict`.
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
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

READ_RATIO_MAX = 1.25  # bytes read / payload, per rank
PLAN_RATIO_MAX = 1.5  # plan file bytes, rank / TP 1
COMPILE_RATIO_MAX = 1.5  # compile seconds, rank / TP 1


@dataclass(frozen=True)
class Model:
    """A model's shape as its Hub config gives it. `experts` 0 is a dense model."""

    name: str
    family: str  # "llama", "mixtral" or "qwen3_moe": picks the tensor names
    layers: int
    hidden: int
    intermediate: int  # the MLP width; per expert for MoE
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    shards: int  # as many shards as the Hub checkpoint has


MODELS = {m.name: m for m in (
    Model("llama3-70b", "llama", 80, 8192, 28672, 64, 8, 128, 128256, 0, 30),
    Model("mixtral-8x7b", "mixtral", 32, 4096, 14336, 32, 8, 128, 32000, 8, 19),
    Model("qwen3-30b-a3b", "qwen3_moe", 48, 2048, 768, 32, 4, 128, 151936, 128, 16),
)}


def quick(m: Model) -> Model:
    """Two layers and at most four experts: the real widths, compiled in well under a second."""
    return replace(m, name=f"{m.name}-quick", layers=2, experts=min(m.experts, 4), shards=2)


# --------------------------------------------------------------------------- checkpoints


def _attention(p: str, m: Model) -> list[tuple[str, tuple[int, ...]]]:
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    out = [(f"{p}.self_attn.q_proj.weight", (q, m.hidden)),
           (f"{p}.self_attn.k_proj.weight", (kv, m.hidden)),
           (f"{p}.self_attn.v_proj.weight", (kv, m.hidden)),
           (f"{p}.self_attn.o_proj.weight", (m.hidden, q))]
    if m.family == "qwen3_moe":  # per-head RMS norms of q and k
        out += [(f"{p}.self_attn.q_norm.weight", (m.head_dim,)), (f"{p}.self_attn.k_norm.weight", (m.head_dim,))]
    return out


def _mlp(p: str, m: Model) -> list[tuple[str, tuple[int, ...]]]:
    h, i = m.hidden, m.intermediate
    if m.family == "llama":
        return [(f"{p}.mlp.gate_proj.weight", (i, h)), (f"{p}.mlp.up_proj.weight", (i, h)),
                (f"{p}.mlp.down_proj.weight", (h, i))]
    if m.family == "mixtral":
        out = [(f"{p}.block_sparse_moe.gate.weight", (m.experts, h))]
        for e in range(m.experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            out += [(f"{q}.w1.weight", (i, h)), (f"{q}.w2.weight", (h, i)), (f"{q}.w3.weight", (i, h))]
        return out
    out = [(f"{p}.mlp.gate.weight", (m.experts, h))]
    for e in range(m.experts):
        q = f"{p}.mlp.experts.{e}"
        out += [(f"{q}.gate_proj.weight", (i, h)), (f"{q}.up_proj.weight", (i, h)), (f"{q}.down_proj.weight", (h, i))]
    return out


def tensors(m: Model) -> list[tuple[str, str, tuple[int, ...]]]:
    """The checkpoint's tensors in model order: (name, safetensors dtype, shape), all bf16."""
    out = [("model.embed_tokens.weight", (m.vocab, m.hidden))]
    for k in range(m.layers):
        p = f"model.layers.{k}"
        out.append((f"{p}.input_layernorm.weight", (m.hidden,)))
        out += _attention(p, m)
        out.append((f"{p}.post_attention_layernorm.weight", (m.hidden,)))
        out += _mlp(p, m)
    out += [("model.norm.weight", (m.hidden,)), ("lm_head.weight", (m.vocab, m.hidden))]
    return [(n, "BF16", s) for n, s in out]


def write_model(out: Path, m: Model) -> Path:
    """Write the sparse checkpoint and its index once (a marker says it is complete); returns its folder."""
    from planc.tools.synth import METADATA, shard_name, split_balanced, write_safetensors

    ts = tensors(m)
    sizes = [2 * math.prod(s) for _, _, s in ts]
    ckpt = out / m.name
    marker = ckpt / ".complete"
    want = {"tensors": len(ts), "shards": m.shards, "bytes": sum(sizes)}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return ckpt
    ckpt.mkdir(parents=True, exist_ok=True)
    for p in ckpt.iterdir():
        p.unlink()
    starts = split_balanced(sizes, m.shards) + [len(ts)]
    weight_map = {}
    for k in range(m.shards):
        name = shard_name(k + 1, m.shards)
        group = ts[starts[k]:starts[k + 1]]
        write_safetensors(ckpt / name, [(n, dt, s, None) for n, dt, s in group], METADATA, sparse=True)
        weight_map.update({n: name for n, _, _ in group})
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    marker.write_text(json.dumps(want))
    return ckpt


# --------------------------------------------------------------------------- specs

_ATTENTION_RULES = """\
  - match: "model.layers.{L}.self_attn.{P}.weight"      # column parallel, fused per rank
    split: {dim: 0}
    fuse: {into: "model.layers.{L}.self_attn.qkv_proj.weight", over: P, order: [q_proj, k_proj, v_proj]}
  - match: "model.layers.*.self_attn.o_proj.weight"      # row parallel
    split: {dim: 1}
"""

_MLP_RULES = {
    "llama": """\
  - match: "model.layers.{L}.mlp.{P}.weight"            # column parallel, gate and up fused per rank
    split: {dim: 0}
    fuse: {into: "model.layers.{L}.mlp.gate_up_proj.weight", over: P, order: [gate_proj, up_proj]}
  - match: "model.layers.*.mlp.down_proj.weight"        # row parallel
    split: {dim: 1}
""",
    "mixtral": """\
  - match: "model.layers.*.block_sparse_moe.gate.weight"  # the router: replicated
  - match: "model.layers.*.block_sparse_moe.experts.*.w2.weight"  # down: row parallel within each expert
    split: {dim: 1}
  - match: "model.layers.*.block_sparse_moe.experts.*.weight"     # w1 (gate), w3 (up): column parallel
    split: {dim: 0}
""",
    "qwen3_moe": """\
  - match: "model.layers.*.mlp.gate.weight"              # the router: replicated
  - match: "model.layers.*.mlp.experts.*.down_proj.weight"  # row parallel within each expert
    split: {dim: 1}
  - match: "model.layers.*.mlp.experts.*.weight"         # gate, up: column parallel within each expert
    split: {dim: 0}
""",
}

_TAIL_RULES = """\
  - match: "model.embed_tokens.weight"                  # vocab parallel
    split: {dim: 0}
  - match: "lm_head.weight"
    split: {dim: 0}
  - match: "*"                                          # norms: replicated
"""


def spec_text(ckpt: Path, m: Model, tp: int, io: dict) -> str:
    """The spec of docs/tp.md for this model and size (TP 1 keeps the same rules: splits are then no-ops)."""
    io_line = f"io: {json.dumps(io)}\n" if io else ""
    head = (f"# {m.name}, tensor parallel over {tp}\ncheckpoint: {json.dumps(str(ckpt))}\n"
            f"budget: {{host: 8GiB}}\ntensor_parallel: {{size: {tp}}}\n{io_line}rules:\n")
    return head + _ATTENTION_RULES + _MLP_RULES[m.family] + _TAIL_RULES


def write_spec(out: Path, ckpt: Path, m: Model, tp: int, io: dict) -> Path:
    p = out / f"{m.name}.tp{tp}.yaml"
    text = spec_text(ckpt, m, tp, io)
    if not p.exists() or p.read_text() != text:
        p.write_text(text)
    return p


# --------------------------------------------------------------------------- one measured process


def _methods(strided: list) -> dict:
    """How many row-parallel inputs each read method took (explain's `strided_reads`)."""
    out: dict = {}
    for x in strided:
        out[x["method"]] = out.get(x["method"], 0) + 1
    return dict(sorted(out.items()))


def worker(spec: str, rank: int, plan_path: str) -> None:
    """Compile one rank in this fresh process; print one JSON line of what the plan reads and weighs."""
    t0 = time.perf_counter()
    from planc.compiler.compile import compile_spec
    from planc.plan.explain import explain_doc
    from planc.plan.codec import save_plan

    t1 = time.perf_counter()
    plan = compile_spec(spec, rank)
    t2 = time.perf_counter()
    doc = explain_doc(plan)
    save_plan(plan, plan_path)
    tot = doc["totals"]
    print(json.dumps({
        "import_s": t1 - t0, "compile_s": t2 - t1, "fits": doc["fits"],
        "read_bytes": tot["read_bytes"], "payload_bytes": tot["payload_bytes"],
        "requests": tot["requests"], "requests_uncoalesced": tot.get("requests_uncoalesced"),
        "copies": tot["copies"], "kernels": tot.get("kernels"), "scatters": tot.get("scatters"),
        "tensors": tot["tensors"], "parts": len(plan.parts), "host_peak_bytes": doc["peak"]["host_bytes"],
        "strided_reads": _methods(doc.get("strided_reads", [])), "merge_gap_bytes": doc["io"].get("merge_gap_bytes"),
        "plan_bytes": os.path.getsize(plan_path),
    }))


def run_once(spec: Path, rank: int, plan_path: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(spec), str(rank), str(plan_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-1500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- medians and targets


def ranks_of(tp: int, which: str) -> list[int]:
    """Every rank, or the first and the last (the last holds any padding and the end of each file)."""
    return list(range(tp)) if which == "all" or tp <= 2 else [0, tp - 1]


def median_row(runs: list[dict]) -> dict:
    """One row from the repeats of one (model, tp, rank): figures that do not vary, and median times."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"]}
    row = {k: ok[0][k] for k in ("read_bytes", "payload_bytes", "requests", "copies", "plan_bytes", "fits",
                                 "tensors", "parts", "strided_reads", "merge_gap_bytes")}
    row["compile_s"] = statistics.median(r["compile_s"] for r in ok)
    row["n"] = len(ok)
    return row


def evaluate(rows: list[dict]) -> list[dict]:
    """The issue's targets per (model, tp), each {model, tp, target, worst, limit, ok}; TP 1 is the reference."""
    base = {r["model"]: r for r in rows if r["tp"] == 1 and "error" not in r}
    checks = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["tp"]), []).append(r)
    for (model, tp), rs in sorted(groups.items()):
        bad = [r for r in rs if "error" in r]
        if bad:
            checks.append({"model": model, "tp": tp, "target": "compiles", "worst": None, "limit": None, "ok": False})
            continue
        worst_read = max(r["read_bytes"] / max(1, r["payload_bytes"]) for r in rs)
        checks.append(_check(model, tp, "read / payload", worst_read, READ_RATIO_MAX))
        ref = base.get(model)
        if ref is None or tp == 1:  # TP 1 is the reference of the ratios below
            continue
        checks.append(_check(model, tp, "plan size / TP 1", max(r["plan_bytes"] for r in rs) / ref["plan_bytes"],
                             PLAN_RATIO_MAX))
        checks.append(_check(model, tp, "compile s / TP 1",
                             max(r["compile_s"] for r in rs) / max(1e-9, ref["compile_s"]), COMPILE_RATIO_MAX))
    return checks


def _check(model: str, tp: int, target: str, worst: float, limit: float) -> dict:
    return {"model": model, "tp": tp, "target": target, "worst": worst, "limit": limit, "ok": worst <= limit}


def print_table(rows: list[dict], checks: list[dict], repeat: int) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nmedian of {repeat} fresh processes per rank; python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
          f"load average {load} at the end\n")
    print("| model | TP | rank | payload GiB | read GiB | read / payload | requests | copies | plan MiB "
          "| compile s | read as |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['tp']} | {r['rank']} | error: {r['error'].splitlines()[-1][:80]} |")
            continue
        how = ", ".join(f"{k} ({n})" for k, n in r["strided_reads"].items()) or "-"
        print(f"| {r['model']} | {r['tp']} | {r['rank']} | {r['payload_bytes'] / 2**30:.3f} | "
              f"{r['read_bytes'] / 2**30:.3f} | {r['read_bytes'] / max(1, r['payload_bytes']):.2f} | "
              f"{r['requests']:,} | {r['copies']:,} | {r['plan_bytes'] / 2**20:.2f} | {r['compile_s']:.3f} | {how} |")
    print("\n| model | TP | target | worst rank | limit | met |")
    print("|---|---|---|---|---|---|")
    for c in checks:
        worst = "-" if c["worst"] is None else f"{c['worst']:.2f}"
        limit = "-" if c["limit"] is None else f"{c['limit']:.2f}"
        print(f"| {c['model']} | {c['tp']} | {c['target']} | {worst} | {limit} | {'PASS' if c['ok'] else 'FAIL'} |")
    met = sum(c["ok"] for c in checks)
    print(f"\ntargets: {met} of {len(checks)} met: {'PASS' if met == len(checks) else 'FAIL'}", flush=True)


# --------------------------------------------------------------------------- driver


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", type=Path, help="where the sparse checkpoints, specs and plans go")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--tp", default="1,2,4,8", help="tensor-parallel sizes (1 is the reference and always run)")
    ap.add_argument("--ranks", choices=["all", "ends"], default="all", help="every rank, or rank 0 and the last")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per rank (median kept)")
    ap.add_argument("--io", default="", help="io settings for the specs, e.g. merge_gap=64KiB,slot=16MiB")
    ap.add_argument("--quick", action="store_true", help="two layers, <= 4 experts, TP 1 and 2, one repeat")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    ap.add_argument("--keep-plans", action="store_true",
                    help="keep the plan files in OUT_DIR/plans (by default each is removed once measured: "
                         "today's row-parallel plans reach hundreds of MiB per rank)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return a
    if a.out_dir is None:
        ap.error("OUT_DIR is required")
    names = [s.strip() for s in a.models.split(",") if s.strip()]
    unknown = [s for s in names if s not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    a.models = [quick(MODELS[n]) if a.quick else MODELS[n] for n in names]
    a.tp = sorted({1, *(int(x) for x in a.tp.split(",") if x.strip())})
    if a.quick:
        a.tp, a.repeat = [t for t in a.tp if t <= 2] or [1], 1
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    a.io = dict(kv.split("=", 1) for kv in a.io.split(",") if kv)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        worker(a.worker[0], int(a.worker[1]), a.worker[2])
        return 0
    out = a.out_dir.resolve()
    (out / "plans").mkdir(parents=True, exist_ok=True)
    log = out / "tp_compile.jsonl"
    rows = []
    for m in a.models:
        ckpt = write_model(out, m)
        for tp in a.tp:
            spec = write_spec(out, ckpt, m, tp, a.io)
            for rank in ranks_of(tp, a.ranks):
                plan_path = out / "plans" / f"{m.name}.tp{tp}.rank-{rank}.json"
                runs = []
                for k in range(a.repeat):
                    r = run_once(spec, rank, plan_path)
                    r.update(model=m.name, tp=tp, rank=rank, repeat=k, io=a.io, time=time.time())
                    with log.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                    runs.append(r)
                if not a.keep_plans:
                    plan_path.unlink(missing_ok=True)
                row = {"model": m.name, "tp": tp, "rank": rank, **median_row(runs)}
                rows.append(row)
                _progress(row)
    checks = evaluate(rows)
    with log.open("a") as f:
        f.write(json.dumps({"summary": checks, "io": a.io, "time": time.time()}) + "\n")
    print_table(rows, checks, a.repeat)
    return 1 if a.strict and not all(c["ok"] for c in checks) else 0


def _progress(row: dict) -> None:
    if "error" in row:
        print(f"{row['model']} tp{row['tp']} rank {row['rank']}: ERROR {row['error'][-400:]}", file=sys.stderr)
        return
    print(f"{row['model']} tp{row['tp']} rank {row['rank']}: read/payload "
          f"{row['read_bytes'] / max(1, row['payload_bytes']):.2f}, {row['requests']:,} requests, "
          f"plan {row['plan_bytes'] / 2**20:.2f} MiB, compile {row['compile_s']:.3f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Reload and digest benchmark: new weights into live device memory, and loads verified as they stream.

    python3 bench/reload.py DATA OUT [--size 15GiB] [--shards 4] [--repeats 3] [--no-transformers]

In one process, side by side (the first round warms up and is reported apart; then `repeats`
rounds alternate the order, medians reported):

1. `dense`: the synthetic dense checkpoint (`planc synth --family dense --size SIZE --shards N`,
   written once under DATA): a fresh `planc.load` (arena allocated, freed after) against
   `LoadedModel.reload` of a model that stays loaded: GB/s, device bytes allocated during each
   (`device_memory.measured_allocated_bytes`), host growth against the plan's predicted peak.
2. `digest`: `planc digest` of that checkpoint (GB/s of writing it), then the same plan loaded
   plain and with `verify="digest"`: GB/s, and what the verifier hashed and read besides.
3. `transformers` (needs transformers): two Llama checkpoints of one shape (other weights) written
   with `save_pretrained`; a meta-device module filled by `planc.load_into(spec_a)`, then
   `planc.load_into(module, spec_b, inplace=True)`: logits against `from_pretrained(b)`, and every
   parameter's `data_ptr()` before and after; then `result.model.reload(spec_a)` likewise against a.

Results go to OUT/reload.json (also printed); docs/benchmarks.md quotes them.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ensure_checkpoint, write_spec  # noqa: E402


def _args(argv=None):
    from planc.base.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="15GiB", type=parse_bytes)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-transformers", dest="transformers", action="store_false")
    p.add_argument("--llama", default="llama-2GB", help="bench/handoff.py model name for part 3")
    p.add_argument("--leaf", default="", help="digest leaf sizes to compare, comma-separated (e.g. 2MiB,16MiB; default: the digest's own)")
    p.add_argument("--hasher", default="native", help="digest hashing to compare, comma-separated: native (the "
                   "reader's read-and-hash loop), python")
    p.add_argument("--native-piece", default="", help="read-and-hash loop piece sizes to compare, comma-separated "
                   "(default: planc.execute.io.readhash.PIECE)")
    p.add_argument("--simd", default="best", help="read-and-hash loop levels to compare, comma-separated: best, "
                   "scalar, avx2, avx512 (PLANC_DIGEST_HASH)")
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the whole run "
                   "(seconds; default: the interpreter's 0.005)")
    p.add_argument("--only", default=None, type=lambda v: set(v.split(",")), help="only these parts: dense,digest,transformers")
    return p.parse_args(argv)


def _row(rep) -> dict:
    r = rep.as_json() if hasattr(rep, "as_json") else dict(rep)
    host, dev = r["host"], r["device_memory"]
    return {"gb_per_s": r["gb_per_s"], "wall_s": r["wall_seconds"],
            "host_growth_bytes": host["growth_bytes"], "host_predicted_bytes": host["predicted_peak_bytes"],
            "host_growth_over_predicted": host["growth_bytes"] / host["predicted_peak_bytes"]
            if host["predicted_peak_bytes"] else None,
            "device_allocated_bytes": dev["measured_allocated_bytes"], "digest": r.get("digest"),
            "timings": r.get("timings")}


def _med(rows, key):
    vals = [r[key] for r in rows if r[key] is not None]
    return statistics.median(vals) if vals else None


def dense(args, out: Path) -> dict:
    import planc
    from planc.compiler.compile import compile_spec

    ckpt = ensure_checkpoint(args.data, "dense", args.size, args.shards)
    spec = write_spec(ckpt, "copy")
    plan = compile_spec(spec)
    live = planc.load(plan)
    rows = {"fresh": [], "reload": []}
    first = {}
    for rnd in range(args.repeats + 1):
        order = ["fresh", "reload"] if rnd % 2 == 0 else ["reload", "fresh"]
        for k in order:
            if k == "fresh":
                m = planc.load(plan)
                row = _row(m.report)
                m.free()
                del m
            else:
                row = _row(live.reload(plan))
            gc.collect()
            (rows[k] if rnd else first.setdefault(k, [])).append(row)
    live.free()
    med = {k: {f: _med(v, f) for f in ("gb_per_s", "host_growth_bytes", "host_growth_over_predicted",
                                        "device_allocated_bytes")} for k, v in rows.items()}
    return {"checkpoint": str(ckpt), "payload_bytes": plan.totals.payload_bytes, "first": first, "rounds": rows,
            "median": med, "reload_over_fresh": med["reload"]["gb_per_s"] / med["fresh"]["gb_per_s"]}


def digest(args, out: Path) -> dict:
    """Plain loads and digest-verified loads alternated in one process: one digest file per leaf size
    in `--leaf` (the default leaf when empty), loaded with each hasher in `--hasher` (native: each
    piece size in `--native-piece` and level in `--simd`; python: after each read); each variant's
    ratio is against the plain loads of the same rounds."""
    import planc
    from planc.base.units import parse_bytes
    from planc.compiler.compile import compile_spec
    from planc.manifest import digest as dg
    from planc.execute.io import readhash
    from planc.manifest import digestcheck as dgc

    ckpt = ensure_checkpoint(args.data, "dense", args.size, args.shards)
    plan = compile_spec(write_spec(ckpt, "copy"))
    leaves = [parse_bytes(v) for v in args.leaf.split(",") if v] or [None]
    native_pieces = [parse_bytes(v) for v in args.native_piece.split(",") if v] or [readhash.PIECE]
    simds = [v for v in args.simd.split(",") if v]
    variants = [("native", (p, simd)) for p in native_pieces for simd in simds if "native" in args.hasher.split(",")]
    variants += [("python", None)] if "python" in args.hasher.split(",") else []
    if any(h == "native" for h, _ in variants) and readhash.load() is None:
        raise SystemExit(f"no read-and-hash loop here: {readhash.why_not}")
    docs = {}
    for leaf in leaves:
        t0 = time.perf_counter()
        doc = dg.make_digest(ckpt, workers=args.shards, leaf_bytes=leaf)
        made = time.perf_counter() - t0
        path = out / f"dense.leaf_{doc['leaf_bytes'] >> 20}MiB.digest.json"
        path.write_bytes(dg.encode(doc))
        for hasher, piece in variants:
            key = f"leaf_{doc['leaf_bytes'] >> 20}MiB_{hasher}" + (
                f"_{piece[1]}_piece_{piece[0] >> 10}KiB" if hasher == "native" else "")
            docs[key] = (path, doc, made, piece, hasher)
    total = sum(f["size_bytes"] for f in next(iter(docs.values()))[1]["files"])
    rows = {"plain": [], **{k: [] for k in docs}}
    first = {}
    for rnd in range(args.repeats + 1):
        order = list(rows) if rnd % 2 == 0 else list(reversed(rows))
        for k in order:
            if k != "plain":  # read when each load begins
                if docs[k][4] == "native":
                    readhash.PIECE = docs[k][3][0]
            extra = {"verify": "digest", "digest": docs[k][0]} if k != "plain" else {}
            if k != "plain":
                extra["settings"] = {"digest_hash": docs[k][3][1] if docs[k][4] == "native" else "python"}
            m = planc.load(plan, **extra)
            row = _row(m.report)
            m.free()
            del m
            gc.collect()
            (rows[k] if rnd else first.setdefault(k, [])).append(row)
    med = {k: _med(v, "gb_per_s") for k, v in rows.items()}
    per_leaf = {k: {"digest_seconds": made, "digest_gb_per_s": total / made / 1e9, "digest_file_bytes": path.stat().st_size,
                    "coverage": dgc.coverage(plan, doc["extent_bytes"], doc["leaf_bytes"]),
                    "hasher": hasher, "piece_bytes": piece, "over_plain": med[k] / med["plain"]}
                for k, (path, doc, made, piece, hasher) in docs.items()}
    first_key = next(iter(docs))
    return {"leaves": per_leaf, "first": first, "rounds": rows, "median_gb_per_s": med,
            "digest_over_plain": per_leaf[first_key]["over_plain"]}


def transformers_inplace(args, out: Path) -> dict:
    import torch
    import transformers
    from handoff import MODELS, config_of, logits, write_model
    from handoff import write_spec as hf_spec

    import planc

    a = write_model(out / "a", args.llama, 0)
    b = write_model(out / "b", args.llama, 1)
    spec_a = hf_spec(out, "transformers-llama", a, "bf16", "llama-a")
    spec_b = hf_spec(out, "transformers-llama", b, "bf16", "llama-b")
    ids = torch.randint(0, MODELS[args.llama][1]["vocab_size"], (1, 64), generator=torch.Generator().manual_seed(0)).cuda()

    def reference(ckpt):
        m = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, device_map="cuda").eval()
        got = logits(m, ids).cpu()
        del m
        gc.collect()
        torch.cuda.empty_cache()
        return got

    ref_a, ref_b = reference(a), reference(b)
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(config_of(args.llama), dtype=torch.bfloat16)
    res = planc.load_into(module, spec_a)
    module.eval()
    ptrs = {n: p.data_ptr() for n, p in module.state_dict().items()}
    first_equal = bool(torch.equal(logits(module, ids).cpu(), ref_a))
    t0 = time.perf_counter()
    inplace = planc.load_into(module, spec_b, inplace=True)
    torch.cuda.synchronize()
    t_inplace = time.perf_counter() - t0
    equal_b = bool(torch.equal(logits(module, ids).cpu(), ref_b))
    same_b = all(p.data_ptr() == ptrs[n] for n, p in module.state_dict().items())
    t0 = time.perf_counter()
    rep = res.model.reload(spec_a)
    t_reload = time.perf_counter() - t0
    equal_a = bool(torch.equal(logits(module, ids).cpu(), ref_a))
    same_a = all(p.data_ptr() == ptrs[n] for n, p in module.state_dict().items())
    res.model.free()
    return {"model": args.llama, "load_into_logits_equal": first_equal,
            "inplace_b": {"logits_equal_from_pretrained": equal_b, "data_ptr_unchanged": same_b,
                          "seconds": t_inplace, **_row(inplace.report)},
            "reload_a": {"logits_equal_from_pretrained": equal_a, "data_ptr_unchanged": same_a,
                         "seconds": t_reload, **_row(rep)},
            "parameters": len(ptrs)}


def main(argv=None) -> int:
    args = _args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    args.data.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"size_bytes": args.size, "shards": args.shards, "repeats": args.repeats,
           "switch_interval": sys.getswitchinterval()}
    parts = [("dense", dense), ("digest", digest)] + ([("transformers", transformers_inplace)] if args.transformers else [])
    parts = [(n, f) for n, f in parts if args.only is None or n in args.only]
    for name, fn in parts:
        t0 = time.perf_counter()
        try:
            res[name] = fn(args, args.out)
        except Exception as e:  # noqa: BLE001 - one part failing still reports the others
            import traceback

            res[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        res[name]["part_seconds"] = time.perf_counter() - t0
        (args.out / "reload.json").write_text(json.dumps(res, indent=2, default=str))
        print(json.dumps({name: {k: v for k, v in res[name].items() if k not in ("rounds", "first", "traceback")}},
                         indent=1, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

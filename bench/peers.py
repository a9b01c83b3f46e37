"""planc against the peers, side by side, in one run, on the same files (run on the GPU machine).

    python3 bench/peers.py DATA_DIR OUT_DIR [--cases dense] [--modes warm,cold] [--repeat 3]
                                            [--loaders planc,st_load_file,...] [--size 15GiB]

A loader named `NAME@VAR=VALUE[+VAR=VALUE...]` is NAME in an environment with those variables: an
A/B of a setting in the same alternation, e.g. `--loaders planc,planc@PLANC_RING=kept`
(each variant of planc is printed with its ratio to plain `planc`).

Writes the checkpoints once (reused after), then for each case and cache mode runs every loader
in a fresh process `--repeat` times (page cache warmed by a read first, or dropped before each cold
run), appending one JSON line per load to OUT_DIR/peers.jsonl and printing medians and ratios.
Cases: dense (Llama-3-8B-shaped bf16, 4 shards), dense_fp16 (the same files, bf16->fp16 on the
device), moe (>= 10,000 small expert tensors), fp8 (F8_E4M3 + 128x128 block scales, dequantized).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import drop_page_cache, ensure_checkpoint, write_spec  # noqa: E402

from planc.base.units import parse_bytes  # noqa: E402

HERE = Path(__file__).resolve().parent
ALL = ["pinned_copy", "plain_warm", "reference", "plain_direct", "planc", "st_load_file", "st_safe_open",
       "fastsafetensors", "fastsafetensors_direct", "runai"]
CEILINGS = ("pinned_copy", "plain_warm", "reference", "plain_direct")  # not peers: what a load could reach
CASES = {  # case -> (family, size divisor, planc rules, peers run?)
    "dense": ("dense", 1, "copy", True),
    "dense_fp16": ("dense", 1, "fp16", False),
    "moe": ("moe", 4, "copy", True),
    "fp8": ("fp8", 2, "fp8", False),
    "fp8_copy": ("fp8", 2, "copy", False),  # the same bytes as fp8, loaded as they are: its reference
}


def warm(files) -> None:
    """Read every file not already (almost) wholly in the page cache."""
    from planc.execute.io.reader import page_cache_fraction

    for f in files:
        frac = page_cache_fraction(f, os.path.getsize(f))
        if frac is not None and frac >= 0.999:
            continue
        with open(f, "rb", buffering=0) as h:
            while h.read(64 << 20):
                pass


def variant(label: str) -> tuple[str, dict]:
    """`NAME@VAR=VALUE+VAR=VALUE` -> (NAME, {VAR: VALUE, ...}); a plain NAME -> (NAME, {})."""
    name, _, rest = label.partition("@")
    env = {}
    for kv in filter(None, rest.split("+")):
        var, eq, value = kv.partition("=")
        if not eq or not var:
            raise SystemExit(f"loader {label!r}: expected NAME@VAR=VALUE[+VAR=VALUE...]")
        env[var] = value
    return name, env


def one(loader: str, ckpt: Path, spec: Path | None, timeout: int = 600) -> dict:
    name, env = variant(loader)
    cmd = [sys.executable, str(HERE / "loaders.py"), name, str(ckpt)] + ([str(spec)] if spec else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    if p.returncode != 0:
        return {"loader": loader, "error": p.stderr[-1500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--cases", default="dense")
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--loaders", default=",".join(ALL))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", default="15GiB")
    ap.add_argument("--planc-io", default="", help="extra io settings for planc, e.g. workers=16,slots=16")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    size = parse_bytes(a.size)
    io = dict(kv.split("=") for kv in a.planc_io.split(",") if kv)
    log = (a.out / "peers.jsonl").open("a")
    for case in a.cases.split(","):
        family, div, rules, peers = CASES[case]
        t0 = time.time()
        ck = ensure_checkpoint(a.data, family, size // div, 4)
        files = sorted(str(p) for p in ck.glob("*.safetensors"))
        print(f"[{case}] checkpoint {ck} ({sum(os.path.getsize(f) for f in files) / 2**30:.2f} GiB, "
              f"ready in {time.time() - t0:.0f} s)", flush=True)
        for mode in a.modes.split(","):
            direct = "auto"
            spec = write_spec(ck, rules, direct=direct, name=f"{ck.name}.{rules}.yaml",
                              **{k: (int(v) if v.isdigit() else v) for k, v in io.items()})
            loaders = [x for x in a.loaders.split(",") if peers or variant(x)[0] in CEILINGS + ("planc",)]
            if mode == "warm":
                loaders = [x for x in loaders if variant(x)[0] not in ("plain_direct", "fastsafetensors_direct")]
            else:
                loaders = [x for x in loaders if variant(x)[0] not in ("pinned_copy", "plain_warm", "reference")]
            results: dict = {}
            for rep in range(a.repeat):
                for ld in loaders:
                    if mode == "warm":
                        warm(files)
                    else:
                        if not drop_page_cache():
                            print("cannot drop the page cache here: cold runs skipped", flush=True)
                            break
                    r = one(ld, ck, spec if variant(ld)[0] == "planc" else None)
                    r.update(case=case, mode=mode, rep=rep, time=time.time(), loader=ld)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    results.setdefault(ld, []).append(r)
                    if "error" in r:
                        print(f"  {mode} {ld}: ERROR {r['error'][-600:]}", flush=True)
            summarize(case, mode, results)
    return 0


def summarize(case: str, mode: str, results: dict) -> None:
    med = {}
    for ld, rs in results.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            continue
        gbs = statistics.median(r.get("inner_gb_per_s", r["gb_per_s"]) for r in ok)
        growth = statistics.median(r["hwm_bytes"] - r["baseline_rss_bytes"] for r in ok)
        med[ld] = (gbs, growth, statistics.median(r["hwm_bytes"] for r in ok), len(ok))
    print(f"== {case} / {mode}: median GB/s, peak RSS growth, peak RSS (n)", flush=True)
    for ld, (gbs, growth, hwm, n) in sorted(med.items(), key=lambda kv: -kv[1][0]):
        print(f"  {ld:24s} {gbs:7.2f} GB/s  growth {growth / 2**30:6.2f} GiB  peak {hwm / 2**30:6.2f} GiB  (n={n})",
              flush=True)
    if "planc" in med:
        p = med["planc"][0]
        for ref in CEILINGS:
            if ref in med:
                print(f"  planc / {ref} = {p / med[ref][0]:.2f}", flush=True)
        for k, v in med.items():
            if k.startswith("planc@"):
                print(f"  {k} / planc = {v[0] / p:.2f}", flush=True)
        peers = [v[0] for k, v in med.items() if variant(k)[0] not in CEILINGS + ("planc",)]
        if peers:
            print(f"  planc / best peer = {p / max(peers):.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

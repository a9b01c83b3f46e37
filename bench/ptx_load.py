"""On a GPU: loads with kernels take their code from the shipped PTX, with no numba compile.

    python3 bench/ptx_load.py OUT_DIR [--size MiB]

Writes small dense, FP8 and MoE checkpoints, then loads each with kernels (bf16 -> fp16 in place,
bf16 -> fp32 plus a transpose, FP8 dequantization, stacked experts through the scatter kernel) in
fresh processes, each verified bit-exact:

* ptx-first: an empty ~/.cache/planc/kernels (PLANC_KERNEL_DIR) and an empty driver JIT cache
  (CUDA_CACHE_PATH): the driver JIT-compiles the shipped PTX;
* ptx-later (x2): the same folders again: the driver's cache serves the PTX's machine code;
* numba-first / numba-later: the shipped index hidden, empty folders: the earlier path, numba
  compiling each kernel and then the cubins it wrote, for comparison.

Every process also loads every shipped launch (`planc.execute.kernels.signatures`) once, to check that the
driver takes all of the PTX, and counts numba's compiled overloads (0 is the goal). Prints one line
per process and writes OUT_DIR/ptx_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

RULES = {
    "fp16": [{"match": "*", "dtype": "float16"}],
    "fp32+transpose": [{"match": "model.embed_tokens.weight", "transpose": True}, {"match": "*", "dtype": "float32"}],
    "fp8": [{"match": "*", "source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": "bfloat16"}, {"match": "*"}],
    "moe-stack": [{"match": "model.layers.{L}.mlp.experts.{E}.{W}.weight",
                   "stack": {"into": "model.layers.{L}.mlp.experts.{W}", "over": "E"}}, {"match": "*"}],
}
CASES = (("dense", "fp16"), ("dense", "fp32+transpose"), ("fp8", "fp8"), ("moe", "moe-stack"))


def _child(specs: list[str], hide_index: bool) -> dict:
    t_start = time.perf_counter()
    from planc.compiler.compile import compile_spec
    from planc.execute import execute
    from planc.execute.device import launch, seam
    from planc.execute.kernels import ptxbuild, ptxindex, signatures

    if hide_index:
        ptxindex.INDEX = Path("/nonexistent/index.json")
    t_import = time.perf_counter() - t_start
    loads = []
    for s in specs:
        plan = compile_spec(s)
        t0 = time.perf_counter()
        m = execute(plan, verify=True)
        dt = time.perf_counter() - t0
        rep = m.report.as_json()
        loads.append({"spec": Path(s).name, "execute_s": round(dt, 4), "wall_s": round(rep["wall_seconds"], 4),
                      "wait_warm_s": rep["timings"].get("wait_warm"), "verify_ok": rep["verify"]["ok"],
                      "host_growth_mib": round(rep["host"]["growth_bytes"] / 2**20, 1),
                      "kernel_code": rep["kernel_code"]})
        m.free()
    t_loads = time.perf_counter() - t_start
    before = launch.LAUNCHER.stats()
    t0 = time.perf_counter()
    unusable = []
    for name, sig in signatures.launches() if launch.enabled() else ():
        fn, why = launch.LAUNCHER.load(seam.device(), name, sig)
        if fn is None:
            unusable.append(why)
    t_all = time.perf_counter() - t0
    overloads = {n: len(k.overloads) for n, k in ptxbuild.registry().items() if len(k.overloads)}
    return {"import_s": round(t_import, 4), "process_to_loaded_s": round(t_loads, 4), "loads": loads,
            "all_launches": {"load_s": round(t_all, 4), "unusable": unusable, **launch.since(before, launch.LAUNCHER.stats())},
            "numba_overloads": overloads, "kernels": launch.LAUNCHER.stats()}


def _run(name: str, specs, env: dict, hide: bool) -> dict:
    e = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    e.setdefault("NUMBA_ENABLE_CUDASIM", "0")  # =1 runs the script's plumbing on a machine without a GPU
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps({"specs": specs, "hide": hide})],
                       capture_output=True, text=True, env=e, timeout=900)
    wall = time.perf_counter() - t0
    if p.returncode:
        return {"name": name, "error": p.stderr[-3000:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out.update(name=name, process_wall_s=round(wall, 3))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--size", type=int, default=256, help="MiB per checkpoint")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        arg = json.loads(a.child)
        print(json.dumps(_child(arg["specs"], arg["hide"])))
        return 0
    from planc.tools.synth import write_checkpoint

    out = a.out
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    specs = []
    for family, rules in CASES:
        ck = work / family
        if not ck.exists():
            write_checkpoint(ck, family, size_bytes=a.size << 20)
        files = sorted(ck.glob("*.safetensors"))
        spec = {"checkpoint": str(files[0] if len(files) == 1 else ck), "budget": {"host": "4GiB"},
                "io": {"workers": 8, "slot": "8MiB", "slots": 8, "run": "256MiB"}, "rules": RULES[rules]}
        p = work / f"{family}.{rules}.yaml"
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
        specs.append(str(p))
    dirs = {k: work / k for k in ("kernels-ptx", "nv-ptx", "kernels-numba", "nv-numba", "numba-cache")}
    for d in dirs.values():
        d.mkdir()
    ptx_env = {"PLANC_KERNEL_DIR": str(dirs["kernels-ptx"]), "CUDA_CACHE_PATH": str(dirs["nv-ptx"])}
    nb_env = {"PLANC_KERNEL_DIR": str(dirs["kernels-numba"]), "CUDA_CACHE_PATH": str(dirs["nv-numba"]),
              "NUMBA_CACHE_DIR": str(dirs["numba-cache"])}
    runs = [_run("ptx-first", specs, ptx_env, False), _run("ptx-later", specs, ptx_env, False),
            _run("ptx-later", specs, ptx_env, False), _run("numba-first", specs, nb_env, True),
            _run("numba-later", specs, nb_env, True)]
    runs[0]["cubins_written"] = len(list(dirs["kernels-ptx"].glob("*.cubin")))
    for r in runs:
        if "error" in r:
            print(f"{r['name']:12s} FAILED\n{r['error']}")
            continue
        k = r["kernels"]
        print(f"{r['name']:12s} process {r['process_wall_s']:.2f} s, import {r['import_s']:.2f} s, "
              f"to loaded {r['process_to_loaded_s']:.2f} s | shipped cubin {k.get('kernels_from_shipped_cubin', 0)}, "
              f"from PTX {k['kernels_from_ptx']}, from cubin "
              f"{k['kernels_from_cubin']}, compiled {k['kernels_compiled']}, numba overloads "
              f"{sum(r['numba_overloads'].values())} | all {len(r['all_launches']['unusable'])} unusable, "
              f"loaded in {r['all_launches']['load_s']:.3f} s")
        for ld in r["loads"]:
            kc = ld["kernel_code"]
            print(f"    {ld['spec']:32s} execute {ld['execute_s']:.3f} s (wait_warm {ld['wait_warm_s']}), "
                  f"verify {ld['verify_ok']}, growth {ld['host_growth_mib']} MiB, "
                  f"shipped cubin {kc.get('kernels_from_shipped_cubin', 0)} ptx {kc['kernels_from_ptx']} "
                  f"cubin {kc['kernels_from_cubin']} compiled {kc['kernels_compiled']}")
        for why in r["kernels"]["fallbacks"][:5]:
            print(f"    fallback: {why}")
    (out / "ptx_load.json").write_text(json.dumps(runs, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    ok = all("error" not in r for r in runs) and all(
        r["kernels"]["kernels_compiled"] == 0 and not r["numba_overloads"] and not r["all_launches"]["unusable"]
        for r in runs[:3]) and (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
                                or all(r["kernels"]["kernels_from_ptx"] + r["kernels"].get("kernels_from_shipped_cubin", 0)
                                       > 0 for r in runs[:3]))
    print("PASS: no numba compile with the shipped PTX" if ok else "FAIL: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Plan files: is a saved plan the fast path? compile -o, explain and run from a plan file against the spec.

    python bench/plan_file.py OUT_DIR [--sizes 1k,10k,30k,91k] [--host 1000,3000] [--repeat 3]

Part 1, the DeepSeek-V3-shaped sparse checkpoints of `bench/compile_scale.py` (its writer, its
specs, written once into OUT_DIR): for each size and each repeat, in fresh processes,

* `planc compile SPEC -o plan.json`: process wall, CPU (user + sys) and peak RSS (the child's
  `ru_maxrss` from `wait4`), and the plan file's size;
* `planc explain PLAN --json` and `planc explain SPEC --json`, one after the other in the same
  repeat (so the two see the same machine load): wall, CPU, peak RSS;
* an in-process breakdown (one fresh process): import, `compile_spec`, `encode`, writing the file,
  `load_plan` (read + `decode`, which validates every field and replays admission), and
  `explain_doc` of the decoded plan and of the compiled one.

Part 2, host-path tensors under the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`): a checkpoint of N
tiny F32 tensors (64 elements each) with the one rule `{match: "*", dtype: bfloat16, on: host}`.
For each N and repeat, `planc run PLAN --json` and `planc run SPEC --json` one after the other
(process wall, CPU, peak RSS), then one fresh process each that times obtaining the plan
(`load_plan` or `compile_spec`) and `planc.execute.execute` of it (the first execute of the
process, which includes the simulator's kernel set-up, and a second, warm one).

planc is byte-compiled before the processes start, as pip does when it installs a package
(`--source` leaves that out, so that each process compiles the planc sources it imports: an
editable install where PYTHONDONTWRITEBYTECODE is set). Tables give medians of the repeats and ratios PLAN / SPEC of the medians; each measured process
is one JSON line in OUT_DIR/plan_file.jsonl. The machine's load average is printed beside them.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

HOST_ELEMS = 64  # elements per host-path tensor: small, so the simulator is not what is measured


# --------------------------------------------------------------------------- measured processes


def _proc(argv: list[str], env: dict | None = None, stdout=subprocess.DEVNULL) -> dict:
    """Run argv in a fresh process; its wall clock, CPU time and peak RSS (from wait4)."""
    e = dict(os.environ, **(env or {}))
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=ROOT, env=e, stdout=stdout, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}:\n{err[-4000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_bytes": ru.ru_maxrss * 1024}


def _planc(*args) -> list[str]:
    return [sys.executable, "-m", "planc", *map(str, args)]


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _child(argv: list[str], env: dict | None = None) -> dict:
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, cwd=ROOT, env=e,
                       timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"worker {argv} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def breakdown_worker(spec: str, plan_path: str) -> None:
    """In one process: import, compile, encode, write, load (read + decode), explain of each."""
    t0 = time.perf_counter()
    from planc.compiler.compile import compile_spec
    from planc.plan.explain import explain_doc
    from planc.plan.codec import encode, load_plan

    t1 = time.perf_counter()
    plan = compile_spec(spec)
    t2 = time.perf_counter()
    text = encode(plan)
    t3 = time.perf_counter()
    Path(plan_path).write_text(text, encoding="utf-8")
    t4 = time.perf_counter()
    loaded = load_plan(plan_path)
    t5 = time.perf_counter()
    a = explain_doc(loaded)
    t6 = time.perf_counter()
    b = explain_doc(plan)
    t7 = time.perf_counter()
    print(json.dumps({
        "import_s": t1 - t0, "compile_s": t2 - t1, "encode_s": t3 - t2, "write_s": t4 - t3,
        "load_plan_s": t5 - t4, "explain_loaded_s": t6 - t5, "explain_compiled_s": t7 - t6,
        # the same explanation but for where the plan came from (`source`: "plan file" / "compiled")
        "same_explain": json.dumps({**a, "source": None}, sort_keys=True) == json.dumps({**b, "source": None},
                                                                                       sort_keys=True),
        "plan_bytes": len(text.encode()), "peak_rss_bytes": _vm("VmHWM"),
        "tensors": len(plan.tensors), "parts": len(plan.parts), "runs": len(plan.runs),
    }))


def execute_worker(mode: str, target: str) -> None:
    """In one process: obtain the plan (load_plan of a file, or compile_spec of a spec), execute it twice."""
    t0 = time.perf_counter()
    from planc.compiler.compile import compile_spec
    from planc.execute import execute
    from planc.plan.codec import load_plan

    t1 = time.perf_counter()
    plan = load_plan(target) if mode == "plan" else compile_spec(target)
    t2 = time.perf_counter()
    times = []
    for _ in range(2):
        s = time.perf_counter()
        model = execute(plan)
        times.append(time.perf_counter() - s)
        model.free()
    print(json.dumps({"import_s": t1 - t0, "obtain_s": t2 - t1, "execute_first_s": times[0],
                      "execute_warm_s": times[1], "peak_rss_bytes": _vm("VmHWM")}))


# --------------------------------------------------------------------------- checkpoints


def host_checkpoint(out: Path, n: int) -> tuple[Path, Path]:
    """N tiny F32 tensors in one file, a host-path spec beside them; written once."""
    import numpy as np
    import yaml
    from safetensors.numpy import save_file

    ckpt = out / f"host-{n}"
    spec = out / f"host-{n}.yaml"
    marker = ckpt / ".complete"
    if not (marker.exists() and spec.exists()):
        ckpt.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(n)
        tensors = {f"t.{i:05d}.weight": rng.standard_normal(HOST_ELEMS, dtype=np.float32) for i in range(n)}
        save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
        spec.write_text(yaml.safe_dump({
            "checkpoint": str(ckpt), "budget": {"host": "1GiB"},
            "rules": [{"match": "*", "dtype": "bfloat16", "on": "host"}]}, sort_keys=False))
        marker.write_text(json.dumps({"tensors": n}))
    return ckpt, spec


# --------------------------------------------------------------------------- driver


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _log(log: Path, rec: dict) -> None:
    with log.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def scale_part(out: Path, labels: list[str], repeat: int, log: Path) -> list[dict]:
    from compile_scale import VARIANTS, _nbytes, tensors, write_variant

    full_bytes = sum(_nbytes(dt, s) for _, dt, s in tensors(VARIANTS["91k"]))
    rows = []
    for label in labels:
        spec, n, shards = write_variant(out, VARIANTS[label], full_bytes)
        plan = out / f"dsv3-{label}.plan.json"
        runs = {"compile": [], "explain_plan": [], "explain_spec": [], "breakdown": []}
        for k in range(repeat):
            for what, argv in (("compile", _planc("compile", spec, "-o", plan)),
                               ("explain_plan", _planc("explain", plan, "--json")),
                               ("explain_spec", _planc("explain", spec, "--json"))):
                r = _proc(argv)
                r.update(bench="dsv3", what=what, size=label, tensors=n, shards=shards, repeat=k,
                         load=os.getloadavg()[0])
                if what == "compile":
                    r["plan_file_bytes"] = plan.stat().st_size
                runs[what].append(r)
                _log(log, r)
            r = _child(["--breakdown", str(spec), str(out / f"dsv3-{label}.plan.bd.json")])
            r.update(bench="dsv3", what="breakdown", size=label, tensors=n, shards=shards, repeat=k,
                     load=os.getloadavg()[0])
            runs["breakdown"].append(r)
            _log(log, r)
        rows.append({"size": label, "tensors": n, "shards": shards, "runs": runs, "load": _load()})
        c, ep, es = runs["compile"], runs["explain_plan"], runs["explain_spec"]
        print(f"{label}: compile -o {_med(c, 'wall_s'):.2f} s, {_med(c, 'peak_rss_bytes') / 2**20:.0f} MiB, "
              f"plan {c[0]['plan_file_bytes'] / 1e6:.1f} MB; explain plan {_med(ep, 'wall_s'):.2f} s, "
              f"spec {_med(es, 'wall_s'):.2f} s (load {_load()})", file=sys.stderr)
    return rows


def host_part(out: Path, counts: list[int], repeat: int, log: Path) -> list[dict]:
    sim = {"NUMBA_ENABLE_CUDASIM": "1"}
    rows = []
    for n in counts:
        ckpt, spec = host_checkpoint(out, n)
        plan = out / f"host-{n}.plan.json"
        _proc(_planc("compile", spec, "-o", plan))
        runs = {"run_plan": [], "run_spec": [], "exec_plan": [], "exec_spec": []}
        for k in range(repeat):
            for what, argv in (("run_plan", _planc("run", plan, "--json")),
                               ("run_spec", _planc("run", spec, "--json"))):
                r = _proc(argv, env=sim)
                r.update(bench="host", what=what, tensors=n, repeat=k, load=os.getloadavg()[0])
                runs[what].append(r)
                _log(log, r)
            for what, mode, target in (("exec_plan", "plan", plan), ("exec_spec", "spec", spec)):
                r = _child(["--execute", mode, str(target)], env=sim)
                r.update(bench="host", what=what, tensors=n, repeat=k, load=os.getloadavg()[0])
                runs[what].append(r)
                _log(log, r)
        rows.append({"tensors": n, "runs": runs, "load": _load(), "plan_file_bytes": plan.stat().st_size})
        rp, rs = runs["run_plan"], runs["run_spec"]
        print(f"host {n}: run plan {_med(rp, 'wall_s'):.2f} s, spec {_med(rs, 'wall_s'):.2f} s (load {_load()})",
              file=sys.stderr)
    return rows


def print_tables(scale: list[dict], host: list[dict], repeat: int) -> None:
    print(f"\nmedian of {repeat} fresh processes per cell; python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
          f"load average {_load()} at the end\n")
    if scale:
        print("Processes (wall s / cpu s / peak RSS MiB):\n")
        print("| size | tensors | compile -o wall s | (cpu s) | compile RSS MiB | plan file MB "
              "| explain PLAN wall s | (cpu s) | RSS MiB | explain SPEC wall s | (cpu s) | RSS MiB "
              "| PLAN / SPEC wall | (cpu) | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in scale:
            c, ep, es = (row["runs"][k] for k in ("compile", "explain_plan", "explain_spec"))
            print(f"| {row['size']} | {row['tensors']:,} | {_med(c, 'wall_s'):.2f} | {_med(c, 'cpu_s'):.2f} | "
                  f"{_med(c, 'peak_rss_bytes') / 2**20:.0f} | {c[0]['plan_file_bytes'] / 1e6:.1f} | "
                  f"{_med(ep, 'wall_s'):.2f} | {_med(ep, 'cpu_s'):.2f} | {_med(ep, 'peak_rss_bytes') / 2**20:.0f} | "
                  f"{_med(es, 'wall_s'):.2f} | {_med(es, 'cpu_s'):.2f} | {_med(es, 'peak_rss_bytes') / 2**20:.0f} | "
                  f"{_med(ep, 'wall_s') / _med(es, 'wall_s'):.2f} | {_med(ep, 'cpu_s') / _med(es, 'cpu_s'):.2f} | "
                  f"{row['load']} |")
        print("\nIn one process (s):\n")
        print("| size | import | compile_spec | encode | write | load_plan (read + decode) | explain (loaded) "
              "| explain (compiled) | µs per tensor: compile + encode | load_plan | peak RSS MiB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in scale:
            b = row["runs"]["breakdown"]
            n = row["tensors"]
            print(f"| {row['size']} | {_med(b, 'import_s'):.3f} | {_med(b, 'compile_s'):.3f} | "
                  f"{_med(b, 'encode_s'):.3f} | {_med(b, 'write_s'):.3f} | {_med(b, 'load_plan_s'):.3f} | "
                  f"{_med(b, 'explain_loaded_s'):.3f} | {_med(b, 'explain_compiled_s'):.3f} | "
                  f"{(_med(b, 'compile_s') + _med(b, 'encode_s')) / n * 1e6:.1f} | "
                  f"{_med(b, 'load_plan_s') / n * 1e6:.1f} | {_med(b, 'peak_rss_bytes') / 2**20:.0f} |")
        if not all(r["same_explain"] for row in scale for r in row["runs"]["breakdown"]):
            print("\n**explain of the loaded plan differs from explain of the compiled plan**")
    if host:
        print("\nHost-path tensors under the CUDA simulator (s):\n")
        print("| tensors | run PLAN wall | (cpu) | run SPEC wall | (cpu) | PLAN / SPEC wall | (cpu) "
              "| load_plan | compile_spec | execute (plan) first / warm | execute (spec) first / warm | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in host:
            rp, rs, xp, xs = (row["runs"][k] for k in ("run_plan", "run_spec", "exec_plan", "exec_spec"))
            print(f"| {row['tensors']:,} | {_med(rp, 'wall_s'):.2f} | {_med(rp, 'cpu_s'):.2f} | "
                  f"{_med(rs, 'wall_s'):.2f} | {_med(rs, 'cpu_s'):.2f} | "
                  f"{_med(rp, 'wall_s') / _med(rs, 'wall_s'):.2f} | {_med(rp, 'cpu_s') / _med(rs, 'cpu_s'):.2f} | "
                  f"{_med(xp, 'obtain_s'):.3f} | {_med(xs, 'obtain_s'):.3f} | "
                  f"{_med(xp, 'execute_first_s'):.3f} / {_med(xp, 'execute_warm_s'):.3f} | "
                  f"{_med(xs, 'execute_first_s'):.3f} / {_med(xs, 'execute_warm_s'):.3f} | {row['load']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--sizes", default="1k,10k,30k,91k", help="compile_scale sizes, comma-separated ('' for none)")
    ap.add_argument("--host", default="1000,3000", help="host-path tensor counts, comma-separated ('' for none)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", action="store_true",
                    help="leave planc's bytecode uncompiled (each process compiles the sources it imports, as "
                         "an editable install under PYTHONDONTWRITEBYTECODE does); by default planc is "
                         "byte-compiled first, as pip does when it installs a package")
    ap.add_argument("--breakdown", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--execute", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.breakdown:
        breakdown_worker(*a.breakdown)
        return 0
    if a.execute:
        execute_worker(*a.execute)
        return 0
    if not a.out_dir:
        ap.error("OUT_DIR is required")
    from compile_scale import VARIANTS

    out = Path(a.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    labels = [s.strip() for s in a.sizes.split(",") if s.strip()]
    unknown = [s for s in labels if s not in VARIANTS]
    if unknown:
        ap.error(f"unknown sizes {unknown}; known: {', '.join(VARIANTS)}")
    counts = [int(s) for s in a.host.split(",") if s.strip()]
    log = out / "plan_file.jsonl"
    if not a.source:
        import compileall

        compileall.compile_dir(str(ROOT / "planc"), quiet=1)
    print(f"planc bytecode: {'compiled from source in every process' if a.source else 'compiled ahead'}")
    scale = scale_part(out, labels, a.repeat, log)
    host = host_part(out, counts, a.repeat, log)
    print_tables(scale, host, a.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

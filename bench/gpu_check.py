"""Load each shape family onto the GPU with --verify and record the reports (run on the GPU machine).

    python3 bench/gpu_check.py DATA_DIR OUT_DIR [--size 4GiB]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ensure_checkpoint, planc, write_spec  # noqa: E402

from planc.base.units import parse_bytes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--cases", default="dense:copy,dense:fp16,dense:fp16-host,moe:copy,moe:moe-stack,fp8:fp8")
    a = ap.parse_args()
    a.data.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    size = parse_bytes(a.size)
    results = []
    for case in a.cases.split(","):
        fam, rules = case.split(":")
        t0 = time.time()
        ck = ensure_checkpoint(a.data, fam, size if fam != "moe" else size // 2, 4)
        spec = write_spec(ck, rules)
        rc, out, err = planc("run", spec, "--json", "--verify")
        rec = {"case": case, "rc": rc, "stderr": err[-2000:], "seconds": time.time() - t0}
        if rc == 0:
            rep = json.loads(out)
            rec["report"] = rep
            h = rep["host"]
            print(f"{case}: rc=0 {rep['payload_bytes'] / 2**30:.2f} GiB {rep['gb_per_s']:.2f} GB/s "
                  f"verify={rep['verify']['ok']} req {rep['requests']} copies {rep['copies']} kernels {rep['kernels']} "
                  f"host growth {h['growth_bytes'] / 2**20:.1f} MiB / predicted {h['predicted_peak_bytes'] / 2**20:.1f} MiB "
                  f"= {h['growth_bytes'] / max(1, h['predicted_peak_bytes']):.3f} (pinned {h['pinned_bytes'] / 2**20:.0f} MiB)",
                  flush=True)
        else:
            print(f"{case}: rc={rc} {err[-1500:]}", flush=True)
        results.append(rec)
    (a.out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["rc"] == 0 and r["report"]["verify"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

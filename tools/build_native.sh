#!/usr/bin/env bash
# Build the digest's read-and-hash loop (planc/execute/io/native/readhash.c) in place, for x86-64 Linux,
# with native.json naming the sha256 of the source it was built from: what installing planc does
# (setup.py's build step), for a checkout run without installing (the GPU machine's) or after an edit
# of readhash.c (tests/test_readhash.py fails until it is rebuilt). Warnings are errors here.
#   bash tools/build_native.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import runpy, sys
from pathlib import Path
ns = runpy.run_path("setup.py", run_name="planc_setup")
why = ns["build_native"](ns["NATIVE"], werror=True)
if why:
    sys.exit(f"not built: {why}")
obj = Path(ns["NATIVE"]) / ns["OBJECT"]
print(f"built {obj} ({obj.stat().st_size} bytes)")
PY

#!/usr/bin/env bash
# One call on the GPU machine that checks the executor and measures the headline cells:
#   GPU suites (execute, tensor parallel and API, faults, hand-off, FP4, GGUF, reload), predicted against issued on every
#   shape family (gpu_check, 2 GiB, --verify) and on loads of a kept ring (kept_check), one load's steps thread by
#   thread (timeline), then dense / fp16 / fp8 / MoE warm loads (n=3).
# Usage, from the repository root on the GPU machine (carry .whl): bash bench/gpu_validate.sh OUT_DIR
# About 4 minutes on the H200 once the checkpoints exist (writing them adds about 30 s).
set -u
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
source bench/device_env.sh || exit 1
DATA=${PLANC_BENCH_DATA:-/tmp/data}
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
python3 -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from common import ensure_checkpoint
for fam, size in (('dense', 15 << 30), ('fp8', (15 << 30) // 2), ('moe', (15 << 30) // 4)):
    print(ensure_checkpoint(Path('$DATA'), fam, size, 4))" > "$OUT/write.log" 2>&1 &
W=$!
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q tests/test_execute_gpu.py 2>&1 | tail -3
NUMBA_ENABLE_CUDASIM=0 python3 -m pytest -p no:cacheprovider -o addopts="" -q tests/test_tp.py tests/test_api.py 2>&1 | tail -1
PLANC_FAULTS_LOG="$OUT/faults_gpu.jsonl" python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q \
    tests/test_faults_gpu.py 2>&1 | tail -3
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q tests/test_handoff_gpu.py 2>&1 | tail -1
for t in fp4 gguf reload; do  # the formats' kernels from the shipped cubins, the reload in place
    python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q tests/test_${t}_gpu.py 2>&1 | tail -1
done
el tests
wait $W
sync  # the checkpoints just written are on disk before any load is timed (write-back slowed them)
el checkpoints
python3 bench/gpu_check.py "$DATA" "$OUT/check" --size 2GiB 2>&1 | tail -6
python3 bench/kept_check.py "$DATA" "$OUT/kept" --size 2GiB 2>&1 | tail -9  # the kept ring's and readers' loads
python3 -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from common import ensure_checkpoint, write_spec
import planc.compiler.compile, planc.plan.codec
ck = ensure_checkpoint(Path('$DATA'), 'dense', 2 << 30, 4)
planc.plan.codec.save_plan(planc.compiler.compile.compile_spec(write_spec(ck, 'copy')), '$OUT/dense-2GiB.plan.json')"
python3 bench/timeline.py "$OUT/dense-2GiB.plan.json" "$OUT/timeline" --repeat 1 --loads 2 --pin register,alloc 2>&1 \
    | tail -5
el checks
python3 bench/peers.py "$DATA" "$OUT/peers" --cases dense --modes warm --repeat 3 \
    --loaders planc,fastsafetensors,plain_warm,pinned_copy 2>&1 | grep -v "^\["
python3 bench/peers.py "$DATA" "$OUT/peers" --cases dense_fp16,fp8,fp8_copy,moe --modes warm --repeat 3 \
    --loaders planc 2>&1 | grep "planc "
python3 bench/predicted.py "$DATA" "$OUT/predicted" --cases dense,dense_fp16,fp8,moe --modes warm --repeat 3 2>&1 \
    | grep "wall "
el done

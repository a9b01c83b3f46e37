#!/usr/bin/env bash
# Build the PTX shipped in planc/execute/kernels/ptx (every kernel launch, sm_80 and sm_90) and its machine
# code (ptxas, one cubin per PTX), on any machine:
# no GPU or driver is needed, only libNVVM, which a pinned CUDA 12.4 NVVM wheel brings into a venv of
# its own. An older NVVM writes an older PTX ISA (8.4), which more drivers accept (r550 and later);
# a newer driver JIT-compiles it just the same.
#   bash tools/build_ptx.sh [--out DIR]          (then commit planc/execute/kernels/ptx)
# Run it after any change to planc/execute/kernels/kernels.py, scatter.py or gguf_kernels.py: tests/test_ptx.py fails until then.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PLANC_PTX_VENV:-/tmp/planc-ptx-venv}
PINS=(numba==0.68.1 numba-cuda==0.30.4 nvidia-cuda-nvcc-cu12==12.4.131 nvidia-cuda-nvrtc-cu12==12.4.127)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "${PINS[@]}" numpy ml_dtypes pydantic PyYAML networkx safetensors typer rich
PYTHONHASHSEED=0 NUMBA_ENABLE_CUDASIM=0 PYTHONPATH="$PWD" "$VENV/bin/python" -m planc.execute.kernels.ptxbuild "$@"

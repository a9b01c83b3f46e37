#!/usr/bin/env bash
# The measurements the open issues still need, on the GPU machine, after bench/gpu_validate.sh.
# Usage, from the repository root (carry .whl): bash bench/gpu_open.sh OUT_DIR [a|b|c|d|e|f]
#   a (about 6 minutes): the hand-off (Llama 2.2 GB and the small Mixtral, bf16 and fp16; the fused-MoE
#     rate against a plain copy of the same files and against the fused plan with no request
#     scattered), then `planc run` of the 2.2 GB and the 14.96 GiB plans in fresh processes.
#   b (about 5 minutes): rank 0 of TP 8 alone against the whole load (warm, n=3), with the default
#     ring (16 x 16 MiB) and with 32 x 4 MiB slots (half the memory to pin), then that rank's load
#     step by step (timeline; again after 32 GiB of memory were written once, for the share of the
#     pinning that is the virtual machine backing memory on first use).
#   c (about 4 minutes): the host-side strided-read sweeps (threads x mapping windows; io_uring
#     against mapped windows), and the ring's populating lanes against the memory-map lock (a mapping
#     per slot against one for the ring; 1, 2 and 4 lanes).
#   d (about 6 minutes): whether mapped strided reads slow the plain reads beside them
#     (bench/probe_mixed.py), rank 0 of TP 8 alone step by step with its reads' rates by kind, on 4
#     pinning lanes and on 1, and `planc run` of the 14.96 GiB plan with a clock on reading the plan,
#     on `execute` and on freeing, beside the exit of a process holding or freeing 15 GiB.
#   e (about 6 minutes): numpy's bytecode on this machine; rank 0 of TP 8 alone with one mapping per
#     strided request (4 and 16 lanes x 128 MiB windows), step by step, and with a shorter GIL switch
#     interval; `planc run` cells with and without bytecode for the libraries it imports.
#   f (about 7 minutes): rank 0 alone of TP 2, 4 and 8 against mapping lanes x windows (io.map_lanes, io.map_window;
#     the default first and last), with its host growth against the plan's; `planc run` n=5.
#   g (about 6 minutes): the ceiling of a rank's load: rank 0 alone of TP 2, 4 and 8 against the same
#     bytes written as a checkpoint of their own and loaded whole (`bench/tp.py --cases sharded`), warm,
#     n=3; the TP 8 pre-sharded load step by step; mapped windows against one `preadv` per 512 rows
#     with the bytes between segments into a scratch buffer (`bench/probe_strided.py`, 4 and 16 threads).
#   h (about 5 minutes): populated mapping windows: rank 0 alone of TP 2, 4 and 8 and its pre-sharded
#     ceiling at the default window (warm, n=3, one --verify run per case); whole, alone and all 8
#     ranks at 32 MiB windows (warm, n=3); the whole load and all 8 ranks cold at the default (n=1).
#   i (about 3 minutes): windows faulted in before their copies: rank 0 alone of TP 2, 4 and 8 and its
#     pre-sharded ceiling at the default window, then whole, alone and all 8 ranks at 32 MiB windows
#     (warm, n=3 each).
#   j (about 4 minutes): every case of bench/tp.py at the defaults: whole, alone (TP 2, 4, 8), their
#     pre-sharded ceilings and all 8 ranks at once, warm (n=3, one --verify run per case), then cold (n=1).
#   k (about 2 minutes): every page of a window faulted in: whole and rank 0 alone (TP 2, 4, 8) warm
#     (n=3, one --verify run per case), then rank 0 of TP 8 alone and all 8 ranks cold (n=1).
# Without a part, all three, one after the other (more than one call's ten minutes: pass a part).
set -u
OUT=${1:?OUT_DIR}
PART=${2:-abc}
mkdir -p "$OUT"
source bench/device_env.sh || exit 1
DATA=${PLANC_BENCH_DATA:-/tmp/data}
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
if [[ $PART == *a* ]]; then
    python3 bench/handoff.py "$OUT/handoff" --repeats 3 > "$OUT/handoff.log" 2>&1
    python3 -c "
import json; d = json.load(open('$OUT/handoff/handoff.json'))
for r in d['results']: print(r['model'], r['dtype'], r['median_seconds'], r['logits_equal'])
m = d['fused_moe']
if m:
    for k in ('fused', 'plain', 'fused_direct', 'fused_scatter2'):
        print(k, round(m[k]['gb_per_s'], 2), 'GB/s', m[k]['copies'], 'copies', m[k]['scatters'], 'scatters')
    print('ratio', round(m['ratio'], 3), 'direct', round(m['ratio_direct'], 3), 'scatter2',
          round(m['ratio_scatter2'], 3), 'by round', m['ratio_by_round'])" \
        2>&1 || tail -20 "$OUT/handoff.log"
    el handoff
    python3 bench/startup.py "$DATA" "$OUT/startup" --repeat 3 --no-torch --cells run 2>&1 | tail -12
    el startup
fi
if [[ $PART == *b* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone --tp 8 --modes warm --repeat 3 --no-verify 2>&1 | tail -12
    el tp
    python3 bench/tp.py "$DATA" "$OUT/tp-slot4" --cases whole,alone --tp 8 --modes warm --repeat 3 --no-verify \
        --io slot=4MiB,slots=32 2>&1 | tail -12
    el tp-slot4
    if [ -f "$OUT/tp/plans/tp8-rank-0.json" ]; then
        python3 bench/timeline.py "$OUT/tp/plans/tp8-rank-0.json" "$OUT/timeline-tp8" --repeat 2 --loads 2 \
            --pin register --touch 32 2>&1 | tail -40
    fi
    el timeline
fi
if [[ $PART == *c* ]]; then
    python3 bench/probe_strided.py "$DATA" --gib 4 --threads 1,4,8,16 --windows 2,8,32 --repeat 3 \
        --shapes 1024:8192,3584:28672,4096:8192 --out "$OUT/probe_strided.jsonl" 2>&1 | grep -v "^h2d" | tail -40
    python3 bench/probe_uring.py "$DATA" --threads 1,4,16 2>&1 | tail -30
    python3 bench/probe_maplock.py "$DATA/strided-4g.bin" 2>&1 | tail -8  # written by probe_strided above
    el probes
fi
if [[ $PART == *d* ]]; then
    python3 bench/probe_mixed.py "$DATA" --repeat 3 --out "$OUT/probe_mixed.jsonl" 2>&1 | tail -16
    el probe_mixed
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone --tp 8 --modes warm --repeat 1 --no-verify 2>&1 | tail -6
    el tp
    for lanes in 4 1; do
        PLANC_BENCH_LANES=$lanes python3 bench/timeline.py "$OUT/tp/plans/tp8-rank-0.json" "$OUT/timeline-tp8-lanes$lanes" \
            --repeat 2 --loads 2 --pin register 2>&1 | grep -E "load [01]:|read|pin |copy|run |medians|GB/s" | tail -24
    done
    el timeline
    python3 bench/startup.py "$DATA" "$OUT/startup" --repeat 3 --no-torch --cells runclock-dense,run-dense,exit 2>&1 | tail -24
    el startup
fi
if [[ $PART == *e* ]]; then
    python3 -c "import numpy, os, importlib.util as u; f = numpy.__file__; print('numpy', numpy.__version__, f, \
        'bytecode' if os.path.exists(u.cache_from_source(f)) else 'no bytecode', \
        'writable' if os.access(os.path.dirname(f), os.W_OK) else 'read-only', 'PYTHONDONTWRITEBYTECODE', \
        os.environ.get('PYTHONDONTWRITEBYTECODE'))"
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone --tp 8 --modes warm --repeat 2 --no-verify 2>&1 | grep -E "^\| (whole|alone)" | head -4
    for m in 4:128 16:128; do
        python3 bench/tp.py "$DATA" "$OUT/tp-$m" --cases alone --tp 8 --modes warm --repeat 2 --no-verify \
            --io map_lanes=${m%:*},map_window=${m#*:}MiB 2>&1 | grep -E "^\| alone|host growth" | head -3
    done
    el tp
    for v in default map4:128 switch; do
        plan="$OUT/tp/plans/tp8-rank-0.json"; envs=""
        [ $v = map4:128 ] && plan="$OUT/tp-4:128/plans/tp8-rank-0.json"
        [ $v = switch ] && envs="PLANC_BENCH_SWITCH=0.0002"
        echo "== timeline $v"
        env $envs python3 bench/timeline.py "$plan" "$OUT/timeline-$v" --repeat 1 --loads 2 --pin register 2>&1 \
            | grep -E "load [01]:|read|lane_wait|map_copy|pin |run |GB/s" | tail -16
    done
    el timeline
    python3 bench/startup.py "$DATA" "$OUT/startup" --repeat 3 --no-torch --cells run 2>&1 | tail -14
    el startup
fi
if [[ $PART == *f* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole --modes warm --repeat 2 --no-verify 2>&1 | grep -E "^\| whole .* / "
    for m in ${MAPS:-4:8 4:32 8:32 16:32 4:128 16:128 4:8}; do
        echo "== io.map_lanes:io.map_window MiB = $m"
        python3 bench/tp.py "$DATA" "$OUT/tp-${m/:/x}" --cases alone --tp ${TPS:-2,4,8} --modes warm --repeat 2 \
            --no-verify --io map_lanes=${m%:*},map_window=${m#*:}MiB 2>&1 | grep -E "^\| alone .* / "
    done
    el sweep
    python3 bench/startup.py "$DATA" "$OUT/startup" --repeat 5 --no-torch --cells run-pyc,run-dense,run-llama 2>&1 | tail -8
    el startup
fi
if [[ $PART == *g* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone,sharded --tp 2,4,8 --modes warm --repeat 3 \
        --no-verify > "$OUT/tp.log" 2>&1
    grep -E "^\| (whole|alone|sharded|[248]) |ready after|^\[" "$OUT/tp.log" | head -40
    el tp
    python3 bench/timeline.py "$OUT/tp/plans/sharded-tp8-rank-0.json" "$OUT/timeline-sharded8" --repeat 1 --loads 2 \
        > "$OUT/timeline-sharded8.log" 2>&1
    tail -25 "$OUT/timeline-sharded8.log"
    el timeline
    python3 bench/probe_strided.py "$DATA" --gib 4 --threads 4,16 --windows 8,32 --repeat 3 --no-gpu \
        --shapes 1024:8192,3584:28672,4096:8192,14336:28672 --methods mmap8,mmap32,pread-gap \
        --out "$OUT/probe_strided.jsonl" 2>&1 | tail -30
    el probe
fi
if [[ $PART == *h* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone,sharded --tp 2,4,8 --modes warm --repeat 3 \
        > "$OUT/tp.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp.log" | head -40
    el tp
    python3 bench/tp.py "$DATA" "$OUT/tp-32" --cases whole,alone,all --tp 2,4,8 --modes warm --repeat 3 \
        --no-verify --io map_window=32MiB > "$OUT/tp-32.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp-32.log" | head -40
    el tp-32
    python3 bench/tp.py "$DATA" "$OUT/tp-cold" --cases whole,all --modes cold --repeat 1 --no-verify \
        > "$OUT/tp-cold.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp-cold.log" | head -30
    el tp-cold
fi
if [[ $PART == *i* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone,sharded --tp 2,4,8 --modes warm --repeat 3 \
        --no-verify > "$OUT/tp.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp.log" | head -40
    el tp
    python3 bench/tp.py "$DATA" "$OUT/tp-32" --cases whole,alone,sharded,all --tp 2,4,8 --modes warm --repeat 3 \
        --no-verify --io map_window=32MiB > "$OUT/tp-32.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp-32.log" | head -40
    el tp-32
fi
if [[ $PART == *j* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone,sharded,all --tp 2,4,8 --modes warm --repeat 3 \
        > "$OUT/tp.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp.log" | head -50
    el tp
    python3 bench/tp.py "$DATA" "$OUT/tp-cold" --cases whole,alone,all --tp 2,4,8 --modes cold --repeat 1 --no-verify \
        > "$OUT/tp-cold.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp-cold.log" | head -30
    el tp-cold
fi
if [[ $PART == *k* ]]; then
    python3 bench/tp.py "$DATA" "$OUT/tp" --cases whole,alone --tp 2,4,8 --modes warm --repeat 3 > "$OUT/tp.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp.log" | head -30
    el tp
    python3 bench/tp.py "$DATA" "$OUT/tp-cold" --cases alone,all --tp 8 --modes cold --repeat 1 --no-verify \
        > "$OUT/tp-cold.log" 2>&1
    grep -E "^\| |^targets" "$OUT/tp-cold.log" | head -30
    el tp-cold
fi

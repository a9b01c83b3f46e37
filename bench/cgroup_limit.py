"""A real memory limit: `planc run` under a cgroup v2 memory.max is refused by name, never OOM-killed.

Run on the GPU machine, as root (it creates cgroups directly under /sys/fs/cgroup):

    python3 bench/cgroup_limit.py OUT.json [--data DIR] [--size 512MiB] [--no-hog] [--dry-run]

Each case is `python3 -m planc run SPEC --json` (this interpreter) in a cgroup of its own, with
memory.swap.max 0, and PLANC_HOST_RESERVE set:

  roomy  memory.max = predicted host peak + reserve + 4 GiB: exit 0. Its report gives the live room
         at admission, so the process's own use then (`baseline` below: Python, numba, the CUDA
         context) = memory.max - reserve - live room; the next limits are set from it.
  tight  memory.max = baseline + reserve + half the predicted host peak: refused before allocating,
         `[live-room]`, exit 3.
  hog    (optional) a plan of 64 MiB runs admitted with 256 MiB to spare, a reserve of 512 MiB; once
         the load runs (its reader holds the shards open), a second process in the same cgroup takes
         memory until planc's live room is a quarter of the smallest run's host bytes: refused at a
         later run, `[live-room]`, exit 3. The reserve leaves room for the host part in progress
         whenever the hog strikes. Should the load end first, the case is inconclusive, not failed.

Every case must end without an OOM kill: the exit status is not -9 / 137 and memory.events'
oom_kill stays 0. A JSON summary per case is printed and all of them are written to OUT.json; the
exit status is 0 when every case met its expectation, 1 when one did not, 2 when no cgroup could be
made (the reason is printed and written).

How planc sees the limit (planc/execute/device/memory.py): live room = min(MemAvailable, memory.max -
memory.current + inactive_file) - reserve, the reserve being $PLANC_HOST_RESERVE (256 MiB by
default; this script sets it explicitly). `execute` refuses the plan before allocating when the
plan's host peak exceeds the live room, and a host-path run whose host bytes exceed it once the
runs in flight are done. planc reads a cgroup v2 limit from the process's own cgroup; on a host
that mounts cgroup v1 it reads /sys/fs/cgroup/memory itself, so a child v1 cgroup would not be seen:
this script needs v2.

`--paths` runs instead one case per path that holds host memory, each `planc run` under a
memory.max just above what it should need (nothing held uncounted makes each complete):

  direct      BF16 copied through the ring (the host peak is the ring)
  host        BF16 -> F32 on the host (`on: host`)
  fp8-block   FP8 dequantized on the host, 128 x 128 block scales
  fp8-tensor  FP8 dequantized on the host, one scale for the whole tensor (block = the matrix)
  verify      `--verify` after a load that transposes on the device (the verify holds the most)
  tp-rank     rank 0 of tensor_parallel size 2, weights split along dim 1 (strided reads)

Each case runs twice: roomy (memory.max = need + 2 GiB) for the process's baseline at admission,
then limited at baseline + need + PATHS_RESERVE + PATHS_MARGIN with PLANC_HOST_RESERVE =
PATHS_RESERVE, where need = the plan's predicted host peak (and, with --verify, what the verify
holds, `planc.plan.verifycost`, when more). It passes when the limited run exits 0 without an OOM kill;
the summary gives predicted and measured (memory.peak of the cgroup less the baseline) per case.

The plan: every tensor converted BF16 -> F32 on the host (`on: host`), so the host peak is the
host-path buffers of two runs in flight (hundreds of MiB from a 512 MiB checkpoint), not just the
ring. bench/common.py's `write_spec` has no host-path rule set, so the specs are written here the
same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, ensure_checkpoint  # noqa: E402

from planc.base.units import fmt_bytes, parse_bytes  # noqa: E402

MIB = 2**20
GIB = 2**30
CG = Path("/sys/fs/cgroup")
# The files of a cgroup's memory controller: v2, or v1 (`--paths` on a host that mounts cgroup v1,
# in a child of this process's own v1 memory cgroup: planc does not read that limit, so there the
# cases show only that the load completes under it).
FILES = {"max": "memory.max", "current": "memory.current", "peak": "memory.peak", "events": "memory.events"}
FILES_V1 = {"max": "memory.limit_in_bytes", "current": "memory.usage_in_bytes", "peak": "memory.max_usage_in_bytes",
            "events": "memory.oom_control"}
V1_PARENT: Path | None = None  # set by --paths when cgroup v2 is not usable and v1 is


def v1_parent() -> Path | None:
    """This process's own v1 memory cgroup, when a child can be made in it."""
    for line in (_read(Path("/proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            d = CG / "memory" / parts[2].lstrip("/")
            probe = d / f"planc-limit-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError:
                return None
            _rmdir(probe)
            return d
    return None
RESERVE = 256 * MIB  # PLANC_HOST_RESERVE for roomy and tight (planc's default)
HOG_RESERVE = 512 * MIB  # for the hog case: room for one host part on top of the hog, whatever the timing
ADMIT_SPARE = 256 * MIB  # the hog case's plan is admitted with this much room to spare

# The second process of the hog case: numpy imported before it says ready, so that once told how
# many bytes to take it takes them at once; it holds them until its stdin closes.
HOG = r"""
import sys
import numpy as np
print("ready", flush=True)
n = int(sys.stdin.readline())
held = np.ones(n, dtype=np.uint8)  # written, so resident and charged to the cgroup
print("held", flush=True)
sys.stdin.read()
"""


# ------------------------------------------------------------------------------------------
# the checkpoint, the specs, the plans


def write_host_spec(ckpt: Path, name: str, run: str) -> Path:
    """A spec like common.write_spec's, converting every tensor to float32 on the host, read slowly
    (one reader, a two-slot ring of 512 KiB) so that a load lasts long enough to be hogged."""
    spec = {"checkpoint": str(ckpt), "budget": {"host": "16GiB"},
            "io": {"workers": 1, "slot": "512KiB", "slots": 2, "run": run, "direct": "off", "merge_gap": "1MiB"},
            "rules": [{"match": "*", "dtype": "float32", "on": "host"}]}
    p = ckpt.parent / f"{ckpt.name}.{name}.yaml"
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


def plan_figures(spec: Path) -> dict:
    """What the compiler predicts (`planc explain --json` says the same): host peak, each run's host bytes."""
    from planc.compiler.compile import compile_spec

    plan = compile_spec(spec)
    if not plan.fits:
        raise SystemExit(f"{spec}: refused at compile time: {plan.refusal.message}")
    host_runs = [r["host_bytes"] for r in plan.to_dict()["runs"] if r["host_bytes"]]
    return {"spec": str(spec), "host_peak_bytes": plan.peak.host_bytes,
            "device_peak_bytes": plan.peak.device_bytes, "ring_bytes": plan.layout.ring_bytes,
            "runs": len(plan.to_dict()["runs"]), "host_runs": len(host_runs), "run_host_bytes_min": min(host_runs),
            "run_host_bytes_max": max(host_runs), "files": [os.path.join(plan.to_dict()["checkpoint"]["root"], f["path"])
                                                            for f in plan.to_dict()["checkpoint"]["files"]]}


# ------------------------------------------------------------------------------------------
# cgroups


def cgroup_v2_problem(enable: bool = True) -> str | None:
    """Why cgroups with a memory limit cannot be made under /sys/fs/cgroup, or None when they can.
    With `enable`, turns the memory controller on for child cgroups where it is off."""
    if not (CG / "cgroup.controllers").exists():
        v1 = " (this host mounts cgroup v1 hierarchies)" if (CG / "memory").is_dir() else ""
        return f"no cgroup v2 hierarchy at {CG}{v1}"
    if "memory" not in (CG / "cgroup.controllers").read_text().split():
        return f"the memory controller is not available at {CG}"
    sub = CG / "cgroup.subtree_control"
    if "memory" not in sub.read_text().split():
        if not enable:
            return f"the memory controller is not enabled for child cgroups of {CG} (this script would try)"
        try:
            sub.write_text("+memory")
        except OSError as e:
            # EBUSY: the cgroup mounted here (a container's) holds processes itself, and cgroup v2 then
            # gives no controller to its children.
            return f"cannot enable the memory controller for child cgroups of {CG}: {e.strerror}"
    if not enable:
        return None
    probe = CG / f"planc-limit-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as e:
        return f"cannot create a cgroup under {CG}: {e.strerror}"
    try:
        if not (probe / "memory.max").exists():
            return f"a new cgroup under {CG} has no memory.max"
        try:
            subprocess.run(["true"], preexec_fn=lambda: _join(probe), check=True)
        except (subprocess.SubprocessError, OSError):
            return f"cannot move a process into a new cgroup under {CG}"
    finally:
        _rmdir(probe)
    return None


def _join(cgroup: Path) -> None:
    """Move the calling process into `cgroup` (run in a child between fork and exec: plain syscalls only)."""
    fd = os.open(cgroup / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def _rmdir(cgroup: Path) -> None:
    for _ in range(100):  # empty once its processes are reaped
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def systemd_scope_ok() -> bool:
    """systemd runs this host and /sys/fs/cgroup is v2 (a scope's limit is then one planc reads)."""
    return (shutil.which("systemd-run") is not None and Path("/run/systemd/system").is_dir()
            and (CG / "cgroup.controllers").exists())


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _flat(text: str | None) -> dict:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


class Limited:
    """One process (and, for the hog case, a second) in a cgroup whose memory.max is `limit`.

    Direct: a new cgroup under /sys/fs/cgroup, joined by the child between fork and exec. Else
    `systemd-run --scope -p MemoryMax=...`, the scope's cgroup found from the child's /proc entry.
    A thread samples memory.current and memory.events while the child runs (a scope's cgroup is
    gone once it ends)."""

    def __init__(self, name: str, limit: int, direct: bool):
        self.name, self.limit, self.direct = name, limit, direct
        self.path: Path | None = None
        self.events: dict = {}
        self.current_max = 0
        self._stop = threading.Event()
        self.f = FILES_V1 if V1_PARENT is not None else FILES
        if direct:
            self.path = (V1_PARENT or CG) / f"planc-limit-{name}-{os.getpid()}"
            self.path.mkdir()
            (self.path / self.f["max"]).write_text(str(limit))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")  # the limit is real memory, not swap
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))

    def _join(self) -> None:
        _join(self.path)

    def popen(self, cmd: list[str], env: dict, **kw) -> subprocess.Popen:
        """Start `cmd` in the cgroup. Directly: joined in the child between fork and exec (call this
        before `start_sampling`: no thread of this process may hold a lock across the fork)."""
        if self.direct:
            return subprocess.Popen(cmd, env=env, preexec_fn=self._join, **kw)
        unit = f"planc-limit-{self.name}-{os.getpid()}"
        proc = subprocess.Popen(["systemd-run", "--scope", "--quiet", f"--unit={unit}", "-p", f"MemoryMax={self.limit}",
                                 "-p", "MemorySwapMax=0", "--", *cmd], env=env, **kw)
        self.path = self._scope_path(proc)
        return proc

    def start_sampling(self) -> None:
        threading.Thread(target=self._sample, name="cgroup-sampler", daemon=True).start()

    def _scope_path(self, proc: subprocess.Popen) -> Path | None:
        ours = _read(Path("/proc/self/cgroup"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            text = _read(Path(f"/proc/{proc.pid}/cgroup"))
            if text and text != ours:
                for line in text.splitlines():
                    if line.startswith("0::"):
                        return CG / line[3:].lstrip("/")
            time.sleep(0.005)
        return None

    def add(self, pid: int) -> None:
        """Move another process into this cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def room(self) -> int | None:
        """memory.max - memory.current + inactive_file now, as planc computes it."""
        cur = _read(self.path / "memory.current")
        if cur is None:
            return None
        inactive = _flat(_read(self.path / "memory.stat")).get("inactive_file", 0)
        return self.limit - int(cur) + inactive

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(0.02)

    def _take(self) -> None:
        if self.path is None:
            return
        ev = _flat(_read(self.path / self.f["events"]))
        if ev:
            self.events = ev
        cur = _read(self.path / self.f["current"])
        if cur is not None:
            self.current_max = max(self.current_max, int(cur))

    def finish(self) -> dict:
        self._stop.set()
        self._take()
        peak = _read(self.path / self.f["peak"]) if self.path else None
        out = {"cgroup": str(self.path), "memory_events": self.events, "sampled_current_max_bytes": self.current_max,
               "memory_peak_bytes": int(peak) if peak and peak.strip().isdigit() else None}
        if self.direct and self.path is not None:
            _rmdir(self.path)
        return out


# ------------------------------------------------------------------------------------------
# the cases


def _env(reserve: int) -> dict:
    env = dict(os.environ, PLANC_HOST_RESERVE=str(reserve), PYTHONUNBUFFERED="1")
    if os.environ.get("PLANC_CGROUP_SIM") != "1":  # PLANC_CGROUP_SIM=1: keep the simulator (no GPU here)
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.pop("PLANC_DEBUG", None)
    return env


def _holds_open(pid: int, paths: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in paths:
                return True
        except OSError:
            pass
    return False


def run_case(name: str, spec: Path, limit: int, reserve: int, direct: bool, hog: dict | None = None,
             args: list | None = None, env_extra: dict | None = None) -> dict:
    """`planc run SPEC --json` under memory.max = `limit`; with `hog`, a second process in the cgroup
    takes memory once the load runs, leaving planc a live room of hog['room'] bytes."""
    box = Limited(name, limit, direct)
    rec = {"case": name, "limit_bytes": limit, "reserve_bytes": reserve,
           "mechanism": "cgroup" if direct else "systemd-run --scope"}
    hog_proc = proc = None
    t0 = time.monotonic()
    try:
        if hog is not None:  # started first, so that numpy is imported before the load begins
            hog_proc = subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=box._join if direct else None,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if hog_proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the hog process did not start")
        proc = box.popen([sys.executable, "-m", "planc", "run", str(spec), "--json", *(args or [])],
                         {**_env(reserve), **(env_extra or {})}, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        box.start_sampling()
        if hog is not None and box.path is None:
            rec["hog"] = {"started": False, "why": "the scope's cgroup was not found"}
        elif hog is not None:
            if not direct:  # moved into the scope systemd made for planc; it has allocated nothing yet
                box.add(hog_proc.pid)
            rec["hog"] = _hog(box, proc, hog_proc, hog)
        out, err = proc.communicate(timeout=900)
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        raise
    finally:
        if hog_proc is not None and hog_proc.poll() is None:
            hog_proc.stdin.close()
            try:
                hog_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                hog_proc.kill()
                hog_proc.wait()
        rec.update(box.finish())
    rec.update(rc=proc.returncode, seconds=round(time.monotonic() - t0, 2), stderr=err.strip()[-2000:])
    if proc.returncode == 0:
        rep = json.loads(out)
        h = rep["host"]
        rec["report"] = {"live_room_bytes": h["live_room_bytes"], "baseline_rss_bytes": h["baseline_rss_bytes"],
                         "hwm_bytes": h["hwm_bytes"], "growth_bytes": h["growth_bytes"],
                         "predicted_peak_bytes": h["predicted_peak_bytes"], "gb_per_s": rep["gb_per_s"],
                         "run_waits": rep["run_waits"],
                         "verify": {k: rep["verify"].get(k) for k in ("ok", "chunk_bytes", "predicted_host_bytes")}
                         if rep.get("verify") else None}
    rec["planc_killed"] = proc.returncode in (-signal.SIGKILL, 137)
    rec["oom_kills"] = rec["memory_events"].get("oom_kill", 0)
    return rec


def _hog(box: Limited, proc: subprocess.Popen, hog_proc: subprocess.Popen, hog: dict) -> dict:
    """Wait until planc's reader holds the shards open (admitted, allocated, loading), then have the
    hog take the cgroup's room down to hog['reserve'] + hog['room'] bytes."""
    deadline = time.monotonic() + 300
    while not _holds_open(proc.pid, hog["files"]):
        if proc.poll() is not None or time.monotonic() > deadline:
            return {"started": False}
        time.sleep(0.005)
    room = box.room()
    if room is None:
        return {"started": False, "why": f"cannot read {box.path}/memory.current"}
    take = max(0, room - hog["reserve"] - hog["room"])
    t0 = time.monotonic()
    hog_proc.stdin.write(f"{take}\n")
    hog_proc.stdin.flush()
    held = hog_proc.stdout.readline().strip() == "held"
    return {"started": True, "room_before_bytes": room, "took_bytes": take, "held": held,
            "seconds_to_hold": round(time.monotonic() - t0, 3), "load_running_when_held": proc.poll() is None}


def rc_text(rc: int) -> str:
    return f"{rc} ({signal.Signals(-rc).name})" if rc < 0 else str(rc)


def judge(rec: dict, expect: str) -> dict:
    """ok: True / False, or None for an inconclusive hog case."""
    last = rec["stderr"].splitlines()[-1] if rec["stderr"] else ""
    if rec["planc_killed"] or rec["oom_kills"]:
        rec.update(ok=False, why=f"an OOM kill in the cgroup (planc exit {rc_text(rec['rc'])}, oom_kill "
                                 f"{rec['oom_kills']}): the limit was reached")
    elif expect == "loads":
        rec.update(ok=rec["rc"] == 0, why="loaded" if rec["rc"] == 0 else f"expected exit 0, got {rec['rc']}: {last}")
    elif rec["rc"] == 3 and last.endswith("[live-room]") and expect in last:
        rec.update(ok=True, why=f"refused: {last}")
    elif expect == "refused at run" and rec["rc"] == 0:
        if rec.get("hog", {}).get("load_running_when_held"):
            why = "the hog held its memory while the load ran, yet no run was refused (check the figures)"
        else:
            why = "the load ended before the hog held its memory"
        rec.update(ok=None, why=f"inconclusive: {why}; run_waits {rec['report']['run_waits']}")
    else:
        rec.update(ok=False, why=f"expected exit 3 and '{expect}' [live-room], got {rec['rc']}: {last}")
    print(json.dumps(rec, sort_keys=True), flush=True)
    return rec


# ------------------------------------------------------------------------------------------
# --paths: one case per path that holds host memory

PATHS_RESERVE = 16 * MIB  # PLANC_HOST_RESERVE of the limited runs
PATHS_MARGIN = 32 * MIB  # memory.max above baseline + need + reserve


def write_fp8(d: Path, block: int | None, n: int = 8, rows: int = 2048, cols: int = 4096) -> Path:
    """n FP8 weights [rows, cols] (8 MiB each) with their scales: `block` x `block` blocks, or one scale
    per tensor (None: a [1, 1] grid, dequantized with a block as large as the matrix)."""
    import math

    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    if (d / ".complete").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    b = block or max(rows, cols)
    out = {}
    for i in range(n):
        name = f"model.layers.{i}.mlp.w.weight"
        out[name] = (rng.standard_normal((rows, cols), dtype=np.float32) * 2).astype(ml_dtypes.float8_e4m3fn)
        out[f"{name}_scale_inv"] = (rng.random((math.ceil(rows / b), math.ceil(cols / b))) * 0.01 + 0.001
                                    ).astype(np.float32)
    save_file(out, str(d / "model.safetensors"))
    (d / ".complete").write_text("ok")
    return d


def path_specs(data: Path, size: int) -> dict:
    """name -> (spec path, run arguments beyond the spec)."""
    dense = ensure_checkpoint(data, "dense", size, 2)
    fp8b, fp8t = write_fp8(data / "fp8-block", 128), write_fp8(data / "fp8-tensor", None)
    io = {"workers": 4, "slot": "4MiB", "slots": 8, "run": "64MiB", "direct": "off", "merge_gap": "1MiB"}
    weights = "*proj.weight"
    cases = {
        "direct": (dense, [{"match": "*"}], {}),
        "host": (dense, [{"match": "*", "dtype": "float32", "on": "host"}], {}),
        "fp8-block": (fp8b, [{"match": "*", "source_dtype": ["F8_E4M3"], "dtype": "bfloat16", "on": "host", "dequantize": {"block": 128}}], {}),
        "fp8-tensor": (fp8t, [{"match": "*", "source_dtype": ["F8_E4M3"], "dtype": "bfloat16", "on": "host", "dequantize": {"block": 4096}}], {}),
        # a two-slot ring, so that what the verify holds after the load is more than the load's peak
        "verify": (dense, [{"match": weights, "transpose": True}, {"match": "*"}], {"io": {**io, "slots": 2}}),
        "tp-rank": (dense, [{"match": weights, "split": {"dim": 1}}, {"match": "*"}], {"tensor_parallel": {"size": 2}}),
    }
    if os.environ.get("PLANC_CGROUP_SIM") == "1":  # the simulator's transposes take minutes: verify copies
        cases["verify"] = (dense, [{"match": "*"}], cases["verify"][2])
    out = {}
    for name, (ckpt, rules, extra) in cases.items():
        spec = {"checkpoint": str(ckpt), "budget": {"host": "16GiB"}, "io": io, "rules": rules}
        spec.update(extra)
        p = data / f"paths.{name}.yaml"
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
        out[name] = (p, ["--verify"] if name == "verify" else [], 0 if name == "tp-rank" else None)
    return out


def path_need(spec: Path, verify: bool, rank) -> dict:
    from planc.compiler.compile import compile_spec
    from planc.plan.verifycost import verify_host_bytes

    plan = compile_spec(spec, rank=rank) if rank is not None else compile_spec(spec)
    if not plan.fits:
        raise SystemExit(f"{spec}: refused at compile time: {plan.refusal.message}")
    peak, v = plan.peak.host_bytes, verify_host_bytes(plan)
    need = max(peak, v) if verify else peak
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # the simulator's device memory is host memory
        need += plan.layout.device_bytes
    return {"host_peak_bytes": peak, "verify_host_bytes": v, "need_bytes": need,
            "ring_bytes": plan.layout.ring_bytes, "map_bytes": plan.layout.map_bytes,
            "device_peak_bytes": plan.peak.device_bytes}


def paths_main(data: Path, size: int, direct: bool, summary: dict) -> int:
    for name, (spec, extra, rank) in path_specs(data, size).items():
        need = path_need(spec, bool(extra), rank)
        env_rank = {} if rank is None else {"RANK": str(rank), "WORLD_SIZE": "2"}
        roomy = need["need_bytes"] + RESERVE + 2 * GIB
        rec = run_case(f"{name}-roomy", spec, roomy, RESERVE, direct, args=extra, env_extra=env_rank)
        judge(rec, "loads")
        case = {"case": name, "predicted": need, "roomy": rec}
        summary["cases"].append(case)
        if rec["rc"] != 0:
            case.update(ok=False, why=f"the roomy run failed: {rec['why']}")
            continue
        if V1_PARENT is not None:
            # planc does not see a child v1 limit, and its RSS counts pages charged elsewhere: the
            # process's own use is taken from the first case (direct: the ring alone), its cgroup
            # peak less its need, and held for every case.
            if "v1_baseline_bytes" not in summary:
                summary["v1_baseline_bytes"] = rec["memory_peak_bytes"] - need["need_bytes"]
            baseline = summary["v1_baseline_bytes"]
        else:
            baseline = roomy - RESERVE - rec["report"]["live_room_bytes"]
        # v1: planc sees no limit, so no reserve; the margin is half of v2's (a 3.67x float32 temporary
        # of one 8 MiB FP8 weight, ~30 MiB, would not fit in it)
        limit = baseline + need["need_bytes"] + (PATHS_MARGIN // 2 if V1_PARENT is not None else PATHS_RESERVE + PATHS_MARGIN)
        lim = judge(run_case(f"{name}-limited", spec, limit, PATHS_RESERVE, direct, args=extra, env_extra=env_rank),
                    "loads")
        peak = lim.get("memory_peak_bytes") or lim.get("sampled_current_max_bytes")
        case.update(limited=lim, baseline_bytes=baseline, limit_bytes=limit, ok=lim["ok"], why=lim["why"],
                    measured_above_baseline_bytes=(peak - baseline) if peak else None)
        print(f"planc cgroup_limit --paths: {name}: predicted {fmt_bytes(need['need_bytes'])}, limit {fmt_bytes(limit)} "
              f"(baseline {fmt_bytes(baseline)}), cgroup peak {fmt_bytes(peak or 0)} -> {lim['why']}", flush=True)
    return _done(summary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="where the JSON summary is written")
    ap.add_argument("--data", type=Path, help="folder for the checkpoint (default: a temporary one, removed)")
    ap.add_argument("--size", default="512MiB", help="checkpoint size (default 512MiB)")
    ap.add_argument("--no-hog", action="store_true", help="skip the case of a second process taking memory")
    ap.add_argument("--paths", action="store_true",
                    help="one case per path that holds host memory, each under a limit just above its need")
    ap.add_argument("--dry-run", action="store_true",
                    help="write the checkpoint and specs, print the plans and the limits; no cgroup, no load")
    a = ap.parse_args()
    try:
        size = parse_bytes(a.size)
    except ValueError as e:
        ap.error(f"--size: {e}")
    data = a.data or Path(tempfile.mkdtemp(prefix="planc-cgroup-"))
    summary: dict = {"size_bytes": size, "cases": []}
    try:
        if a.paths:
            global V1_PARENT
            problem = cgroup_v2_problem()
            if problem and v1_parent() is not None:
                V1_PARENT = v1_parent()
                summary["mechanism"] = f"cgroup v1 child of {V1_PARENT} ({problem})"
                print(f"planc cgroup_limit: {problem}; using a child of this process's v1 memory cgroup", flush=True)
                problem = None
            elif problem and not systemd_scope_ok():
                summary["skipped"] = problem
                print(f"planc cgroup_limit: skipped: {problem}", flush=True)
                return 2
            summary["mem_available_bytes"] = mem_available()
            return paths_main(data, size, problem is None, summary)
        ckpt = ensure_checkpoint(data, "dense", size, 2)
        # tight and roomy: 128 MiB runs, a host peak of ~760 MiB from 512 MiB, so half of it is a wide
        # margin against the baseline moving between processes; hog: 64 MiB runs, more of them to refuse.
        limit_plan = plan_figures(write_host_spec(ckpt, "limit", "128MiB"))
        hog_plan = plan_figures(write_host_spec(ckpt, "hog", "64MiB"))
        summary["plans"] = {"limit": limit_plan, "hog": hog_plan}
        problem = cgroup_v2_problem() if not a.dry_run else None
        direct = problem is None
        if problem and systemd_scope_ok():
            print(f"planc cgroup_limit: {problem}; using systemd-run --scope instead", flush=True)
        elif problem:
            summary["skipped"] = (f"{problem}. Run as root on a host (or a container) whose /sys/fs/cgroup is "
                                  f"cgroup v2 with the memory controller delegable, or where systemd-run works.")
            print(f"planc cgroup_limit: skipped: {summary['skipped']}", flush=True)
            return 2
        summary["mem_available_bytes"] = mem_available()
        peak = limit_plan["host_peak_bytes"]
        roomy = peak + RESERVE + 4 * GIB
        if a.dry_run:
            assumed = 1 * GIB
            summary["dry_run"] = {
                "assumed_baseline_bytes": assumed, "roomy_limit_bytes": roomy,
                "tight_limit_bytes": assumed + RESERVE + peak // 2,
                "hog_limit_bytes": assumed + HOG_RESERVE + hog_plan["host_peak_bytes"] + ADMIT_SPARE,
                "hog_room_bytes": hog_plan["run_host_bytes_min"] // 4,
                "cgroup_problem": _probe_quietly(), "systemd_scope": systemd_scope_ok()}
            print(json.dumps(summary, indent=1), flush=True)
            return 0
        if summary["mem_available_bytes"] < 2 * roomy:
            print(f"planc cgroup_limit: MemAvailable {fmt_bytes(summary['mem_available_bytes'])} is not well above "
                  f"the roomy limit {fmt_bytes(roomy)}: planc's live room would not be the cgroup's", flush=True)
        rec = judge(run_case("roomy", Path(limit_plan["spec"]), roomy, RESERVE, direct), "loads")
        summary["cases"].append(rec)
        if rec["rc"] != 0:
            return _done(summary)
        # What the process used at admission, as planc saw it: limit - reserve - live room.
        baseline = roomy - RESERVE - rec["report"]["live_room_bytes"]
        summary["baseline_bytes"] = baseline
        if not 0 < baseline < roomy - RESERVE - peak:
            rec.update(ok=False, why=f"planc's live room at admission ({fmt_bytes(rec['report']['live_room_bytes'])}) "
                                     f"is not the cgroup's room under {fmt_bytes(roomy)}: planc did not see the limit")
            print(f"planc cgroup_limit: {rec['why']}", flush=True)
            return _done(summary)
        tight = baseline + RESERVE + peak // 2
        summary["cases"].append(judge(run_case("tight", Path(limit_plan["spec"]), tight, RESERVE, direct),
                                      "refused before allocating"))
        if not a.no_hog:
            hp = hog_plan
            # The hog's own interpreter (tens of MiB) is in the cgroup at admission: ADMIT_SPARE covers it.
            limit = baseline + HOG_RESERVE + hp["host_peak_bytes"] + ADMIT_SPARE
            hog = {"files": {os.path.realpath(f) for f in hp["files"]}, "reserve": HOG_RESERVE,
                   "room": hp["run_host_bytes_min"] // 4}
            summary["cases"].append(judge(run_case("hog", Path(hp["spec"]), limit, HOG_RESERVE, direct, hog),
                                          "refused at run"))
        return _done(summary)
    finally:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
        if a.data is None:
            shutil.rmtree(data, ignore_errors=True)


def _probe_quietly() -> str | None:
    """cgroup_v2_problem() without changing anything (for --dry-run)."""
    try:
        return cgroup_v2_problem(enable=False)
    except OSError as e:
        return str(e)


def _done(summary: dict) -> int:
    oks = [c["ok"] for c in summary["cases"]]
    summary["ok"] = bool(oks) and all(ok is not False for ok in oks)
    print(f"planc cgroup_limit: {'ok' if summary['ok'] else 'FAILED'}: "
          + ", ".join(f"{c['case']} {c['why']}" for c in summary["cases"]), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

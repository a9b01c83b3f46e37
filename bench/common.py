"""Shared helpers for benchmarks: checkpoints written once, specs written beside them, fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

RULES = {
    "copy": [{"match": "*"}],
    "fp16": [{"match": "*", "dtype": "float16"}],
    "fp16-host": [{"match": "*", "dtype": "float16", "on": "host"}],
    "fp8": [{"match": "*", "source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": "bfloat16"}, {"match": "*"}],
    "moe-stack": [
        {"match": "model.layers.{L}.mlp.experts.{E}.{W}.weight",
         "stack": {"into": "model.layers.{L}.mlp.experts.{W}", "over": "E"}},
        {"match": "*"},
    ],
}


def ensure_checkpoint(data: Path, family: str, size: int, shards: int) -> Path:
    from planc.tools.synth import write_checkpoint

    d = data / f"{family}-{size >> 20}MiB-{shards}"
    marker = d / ".complete"
    if not marker.exists():
        res = write_checkpoint(d, family, size_bytes=size, shards=shards)
        marker.write_text(json.dumps({"tensors": res.tensors, "total_bytes": res.total_bytes}))
    return d


def write_spec(ckpt: Path, rules: str, *, host="8GiB", slot="16MiB", slots=16, workers=16, run="1GiB",
               direct="auto", merge_gap="1MiB", name=None) -> Path:
    spec = {"checkpoint": str(ckpt), "budget": {"host": host},
            "io": {"workers": workers, "slot": slot, "slots": slots, "run": run, "direct": direct,
                   "merge_gap": merge_gap},
            "rules": RULES[rules]}
    p = ckpt.parent / (name or f"{ckpt.name}.{rules}.{direct}.yaml")
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


def planc(*args, env=None, timeout=900) -> tuple[int, str, str]:
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, "-m", "planc", *map(str, args)], capture_output=True, text=True,
                       env=e, timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def warm_file(path: Path) -> None:
    """Read `path` once from start to end, so that its pages are in the page cache."""
    with open(path, "rb", buffering=0) as h:
        while h.read(64 << 20):
            pass


def weights_differ(a: dict, b: dict, torch) -> list[str]:
    """The names of state dict `a` whose tensor in `b` is missing, of another shape or dtype, or of
    other bits (bfloat16 compared as int16: NaNs and signed zeros too), sorted."""

    def bits(t):
        return t.view(torch.int16) if t.dtype == torch.bfloat16 else t

    return sorted(k for k in a if k not in b or a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
                  or not torch.equal(bits(a[k]), bits(b[k].to(a[k].device))))

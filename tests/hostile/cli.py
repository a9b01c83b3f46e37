"""Hostile command lines: flags, launcher variables and output paths that planc must refuse.

Each `Flag` case is one `planc ...` invocation in a folder that holds the valid checkpoint
(`model.safetensors`), a valid spec (`spec.yaml`), its plan (`plan.json`), a plain file (`afile`)
and an empty folder (`folder/`). `{d}` in an argument is that folder. tests/test_inputs.py runs
each one in process: it must exit `rc` with one line on stderr, `planc: ... [code]`, holding every
word of `words`, print nothing on stdout, and (for `run`) fail before the load starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flag:
    name: str
    args: tuple[str, ...]
    code: str
    words: tuple[str, ...]
    env: dict = field(default_factory=dict)
    rc: int = 2


FLAGS: list[Flag] = [
    Flag("device-banana", ("run", "{d}/spec.yaml", "--device", "cuda:banana"), "usage", ("--device", "'cuda:banana'")),
    Flag("local-rank-abc", ("run", "{d}/spec.yaml"), "bad-rank", ("LOCAL_RANK='abc'",), {"LOCAL_RANK": "abc"}),
    Flag("rank-abc-run", ("run", "{d}/spec.yaml"), "bad-rank", ("RANK='abc'",), {"RANK": "abc"}),
    Flag("rank-abc-compile", ("compile", "{d}/spec.yaml"), "bad-rank", ("RANK='abc'",), {"RANK": "abc"}),
    Flag("rank-abc-plan", ("explain", "{d}/plan.json"), "bad-rank", ("RANK='abc'",), {"RANK": "abc"}),
    Flag("world-size-abc", ("compile", "{d}/spec.yaml"), "bad-rank", ("WORLD_SIZE='x'",), {"WORLD_SIZE": "x"}),
    Flag("rank-flag-outside", ("compile", "{d}/spec.yaml", "--rank", "1"), "bad-rank",
         ("rank 1 is outside tensor_parallel.size 1", "--rank")),
    Flag("output-missing-folder", ("compile", "{d}/spec.yaml", "-o", "{d}/nope/plan.json"), "usage",
         ("-o", "nope", "does not exist")),
    Flag("output-is-folder", ("compile", "{d}/spec.yaml", "-o", "{d}/folder"), "usage", ("-o", "is a folder")),
    Flag("output-dev-full", ("compile", "{d}/spec.yaml", "-o", "/dev/full"), "output-not-file",
         ("-o /dev/full", "is a character device", "not a regular file")),
    Flag("rank-all-output-file", ("compile", "{d}/spec.yaml", "--rank", "all", "-o", "{d}/afile"), "usage",
         ("-o", "afile", "is a file", "--rank all")),
    Flag("report-missing-folder", ("run", "{d}/spec.yaml", "--report", "{d}/nope/r.json"), "usage",
         ("--report", "nope", "does not exist")),
    Flag("report-is-folder", ("run", "{d}/plan.json", "--report", "{d}/folder"), "usage", ("--report", "is a folder")),
    Flag("synth-into-file", ("synth", "{d}/afile"), "usage", ("OUT_DIR", "afile", "is a file")),
    Flag("synth-below-file", ("synth", "{d}/afile/sub"), "usage", ("OUT_DIR", "afile/sub", "cannot write")),
    Flag("top-negative", ("inspect", "{d}/model.safetensors", "--top", "-1"), "usage", ("--top", "-1")),
    Flag("top-not-int", ("inspect", "{d}/model.safetensors", "--top", "x"), "usage", ("'--top'", "planc inspect --help")),
    Flag("missing-argument", ("compile",), "usage", ("Missing argument", "planc compile --help")),
    Flag("unknown-option", ("compile", "{d}/spec.yaml", "--bogus"), "usage", ("--bogus",)),
    Flag("truncated-plan-explain", ("explain", "{d}/trunc.json"), "plan-syntax", ("trunc.json", "not a planc plan")),
    Flag("truncated-plan-run", ("run", "{d}/trunc.json"), "plan-syntax", ("trunc.json", "not a planc plan")),
    Flag("missing-plan", ("run", "{d}/gone.json"), "plan-missing", ("gone.json", "plan file not found")),
    Flag("missing-spec", ("explain", "{d}/gone.yaml"), "spec-missing", ("gone.yaml", "spec file not found")),
]

if not os.path.exists("/dev/full"):  # pragma: no cover - not Linux
    FLAGS = [f for f in FLAGS if f.name != "output-dev-full"]

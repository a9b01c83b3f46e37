"""Coverage-guided fuzzing of the spec loader and the compiler behind it with atheris, run by hand.

    pip install atheris
    python tests/fuzz/fuzz_spec.py -runs=100000
    python tests/fuzz/fuzz_spec.py -max_total_time=600 my-corpus/    # keep what it learns in my-corpus/

Any libFuzzer flag works. Each input is a spec file in a private temporary folder that also holds
a valid checkpoint `model.safetensors` (U8 tensors `w` and `b`). The first byte picks the spec's
suffix (even: `.yaml`, odd: `.json`); the rest is the file. The spec is compiled with
`compile_spec`, so a spec that loads goes on through bind, graph, schedule and admission.

A `PlancError` is the expected outcome for a bad spec. Any other exception is a finding: atheris
prints it and saves the input as `crash-<sha1>`; replay it with
`python tests/fuzz/fuzz_spec.py crash-<sha1>`. Unless corpus folders are given, the run starts
from the hostile corpus's specs (tests/hostile/corpus.py) and a few valid ones.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

with atheris.instrument_imports():
    from planc.compiler.compile import compile_spec
    from planc.base.errors import PlancError

from hostile.corpus import GOOD, MODEL, RULES, SPECS, VALID  # noqa: E402

WORK = Path(tempfile.mkdtemp(prefix="planc-fuzz-spec-"))
(WORK / MODEL).write_bytes(VALID)
SPEC = {0: WORK / "spec.yaml", 1: WORK / "spec.json"}


def one_input(data: bytes) -> None:
    if not data:
        return
    path = SPEC[data[0] & 1]
    path.write_bytes(data[1:])
    try:
        compile_spec(path)
    except PlancError:
        pass


def seeds() -> Path:
    out = Path(tempfile.mkdtemp(prefix="planc-fuzz-seeds-"))
    found = [b"\x00" + (GOOD + RULES).encode(),
             b"\x00" + (GOOD + "rules:\n  - {match: w, dtype: float16}\n  - {match: '*', skip: true}\n").encode(),
             b"\x01" + json.dumps({"checkpoint": MODEL, "budget": {"host": "1GiB", "device": "1GiB"},
                                   "io": {"workers": 2, "slot": "4KiB", "slots": 2, "run": "1MiB", "merge_gap": 0},
                                   "rules": [{"match": "{X}", "stack": {"into": "s", "over": "X"}}]}).encode()]
    for case in SPECS:
        if case.name == "spec-fifo":
            continue
        with tempfile.TemporaryDirectory(prefix="planc-fuzz-case-") as scratch:
            path = case.build(Path(scratch))
            found.append((b"\x01" if path.suffix == ".json" else b"\x00") + path.read_bytes()[:8192])
    for i, blob in enumerate(found):
        (out / f"seed-{i:03d}").write_bytes(blob)
    return out


def main() -> None:
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):  # no corpus folder and no input file given
        argv.append(str(seeds()))
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

"""Coverage-guided fuzzing of the safetensors manifest reader with atheris (libFuzzer), run by hand.

    pip install atheris
    python tests/fuzz/fuzz_manifest.py -runs=100000
    python tests/fuzz/fuzz_manifest.py -max_total_time=600 my-corpus/    # keep what it learns in my-corpus/

Any libFuzzer flag works (-runs, -max_total_time, -max_len, -jobs, -workers). Each input becomes
a checkpoint in a private temporary folder and is read with `read_manifest`. The first byte picks
what the rest is:

- 0: the whole `.safetensors` file;
- 1: the header JSON, behind a correct 8-byte length prefix and followed by a data region of
  (second byte) zero bytes: the shortest way to the entry, dtype, shape and offset checks;
- 2: an index JSON, next to a valid shard `a.safetensors` holding tensor `w`.

A `PlancError` is the expected outcome for a bad input. Any other exception is a finding: atheris
prints it and saves the input as `crash-<sha1>`; replay it with
`python tests/fuzz/fuzz_manifest.py crash-<sha1>`. Unless corpus folders are given, the run
starts from the hostile corpus (tests/hostile/corpus.py) and a few valid files.
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

with atheris.instrument_imports():
    from planc.base.errors import PlancError
    from planc.manifest import read_manifest

WORK = Path(tempfile.mkdtemp(prefix="planc-fuzz-manifest-"))
SHARD = WORK / "fuzz.safetensors"
INDEX = WORK / "fuzz.safetensors.index.json"
VALID_SHARD = struct.pack("<Q", 60) + json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})\
    .encode().ljust(60) + b"abcd"
(WORK / "a.safetensors").write_bytes(VALID_SHARD)


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 3, data[1:]
    if mode == 0:
        SHARD.write_bytes(rest)
        target = SHARD
    elif mode == 1:
        pad, header = (rest[0], rest[1:]) if rest else (0, b"")
        SHARD.write_bytes(struct.pack("<Q", len(header)) + header + bytes(pad))
        target = SHARD
    else:
        SHARD.unlink(missing_ok=True)  # the index names a.safetensors; a stray fuzz.safetensors would not match
        INDEX.write_bytes(rest)
        target = INDEX
    try:
        read_manifest(target)
    except PlancError:
        pass
    finally:
        INDEX.unlink(missing_ok=True)


def seeds() -> Path:
    """The hostile corpus's single files, and valid files of each mode, as starting inputs."""
    from hostile.corpus import CHECKPOINTS

    out = Path(tempfile.mkdtemp(prefix="planc-fuzz-seeds-"))
    found = []
    for case in CHECKPOINTS:
        with tempfile.TemporaryDirectory(prefix="planc-fuzz-case-") as scratch:
            path = case.build(Path(scratch))
            if path.is_file() and not path.is_symlink():
                found.append((b"\x02" if path.name.endswith(".json") else b"\x00") + path.read_bytes()[:4096])
    found.append(b"\x00" + VALID_SHARD)
    header = json.dumps({"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2, 2],
                                                                 "data_offsets": [0, 8]}}).encode()
    found.append(b"\x01\x08" + header)
    found.append(b"\x02" + json.dumps({"metadata": {}, "weight_map": {"w": "a.safetensors"}}).encode())
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

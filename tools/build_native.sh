#!/usr/bin/env bash
# Build the host machine code shipped in planc/execute/io/native (the digest's read-and-hash loop) for
# x86-64 Linux, and record the sha256 of the source it was built from (native.json):
#   bash tools/build_native.sh        (then commit planc/execute/io/native)
# The object links nothing (no libc: its calls come in as function pointers), so it loads on any
# x86-64 Linux. Run it after any change to planc/execute/io/native/readhash.c: tests/test_readhash.py
# fails until then. On other machines planc hashes in Python (slower, same digests).
set -euo pipefail
cd "$(dirname "$0")/../planc/execute/io/native"
CC=${CC:-gcc}
"$CC" -O3 -fPIC -shared -nostdlib -fno-stack-protector -fno-builtin -fno-tree-loop-distribute-patterns -Wall -Wextra -Werror \
  -Wl,-z,noexecstack -Wl,--build-id=none -o readhash.x86_64-linux.so readhash.c
strip --strip-unneeded readhash.x86_64-linux.so
python3 - <<'PY'
import hashlib, json, pathlib
src = pathlib.Path("readhash.c").read_bytes()
so = pathlib.Path("readhash.x86_64-linux.so").read_bytes()
doc = {"readhash.x86_64-linux.so": {"source": "readhash.c", "source_sha256": hashlib.sha256(src).hexdigest(),
                                    "sha256": hashlib.sha256(so).hexdigest()}}
pathlib.Path("native.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
PY
echo "built planc/execute/io/native/readhash.x86_64-linux.so ($(stat -c %s readhash.x86_64-linux.so) bytes)"

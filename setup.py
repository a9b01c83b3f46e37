"""The one build step beyond pyproject.toml: the digest's read-and-hash loop
(`planc/execute/io/native/readhash.c`) compiled for the machine that installs planc, into the
package (`build_py`; in place for an editable install). It links nothing (no libc: its calls come in
as function pointers). Where it cannot be built (not x86-64 Linux, no C compiler, the compiler
fails), the install goes on without it and digest-verified loads hash in Python (slower, the same
digests; `planc.execute.io.readhash.load` says why). `tools/build_native.sh` builds it in place.
"""

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from setuptools import setup
    from setuptools.command.build_py import build_py
except ImportError:  # run as a script to build in place (tools/build_native.sh): no setuptools needed
    setup = build_py = None

NATIVE = Path("planc") / "execute" / "io" / "native"
SOURCE, OBJECT, INDEX = "readhash.c", "readhash.x86_64-linux.so", "native.json"
FLAGS = ["-O3", "-fPIC", "-shared", "-nostdlib", "-fno-stack-protector", "-fno-builtin",
         "-fno-tree-loop-distribute-patterns", "-Wall", "-Wextra", "-Wl,-z,noexecstack", "-Wl,--build-id=none"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_native(out_dir, source_dir=NATIVE, werror: bool = False) -> str | None:
    """Compile `source_dir/readhash.c` into `out_dir/readhash.x86_64-linux.so`, with `native.json`
    naming the sha256 of the source it was built from; returns why it was not built, or None."""
    out_dir, source_dir = Path(out_dir), Path(source_dir)
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not x86-64 Linux ({sys.platform}, {platform.machine()})"
    cc = shlex.split(os.environ.get("CC", "")) or [c for c in (shutil.which("cc") or shutil.which("gcc"),) if c]
    if not cc:
        return "no C compiler (cc, gcc or $CC)"
    src = source_dir / SOURCE
    out_dir.mkdir(parents=True, exist_ok=True)
    obj, tmp, index = out_dir / OBJECT, out_dir / (OBJECT + ".tmp"), out_dir / INDEX
    for old in (obj, index):  # an object of an earlier build is never left to ship with this one
        if old.exists():
            old.unlink()
    try:
        r = subprocess.run([*cc, *FLAGS, *(["-Werror"] if werror else []), "-o", str(tmp), str(src)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            return f"{' '.join(cc)} failed: {r.stderr.strip()[-400:]}"
        strip = shutil.which("strip")
        if strip:
            subprocess.run([strip, "--strip-unneeded", str(tmp)], capture_output=True, timeout=60)
        os.replace(tmp, obj)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{' '.join(cc)}: {e}"
    finally:
        if tmp.exists():
            tmp.unlink()
    doc = {OBJECT: {"source": SOURCE, "source_sha256": _sha256(src), "sha256": _sha256(obj)}}
    index.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return None


if build_py is not None:
    class BuildPy(build_py):
        """`build_py`, then the read-and-hash loop beside the package's files (the wheel is still
        tagged pure Python: `planc.execute.io.readhash.load` uses the object only on x86-64 Linux)."""

        def run(self):
            super().run()
            editable = getattr(self, "editable_mode", False)
            why = build_native(NATIVE if editable else Path(self.build_lib) / NATIVE)
            if why:
                print(f"planc: the digest's read-and-hash loop was not built ({why}); digest-verified "
                      f"loads hash in Python", file=sys.stderr)

        def get_outputs(self, include_bytecode=True):
            out = super().get_outputs(include_bytecode)
            if not getattr(self, "editable_mode", False):
                out += [str(p) for p in (Path(self.build_lib) / NATIVE / n for n in (OBJECT, INDEX)) if p.exists()]
            return out


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPy})

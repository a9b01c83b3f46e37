"""Build the PTX of every kernel launch the executor makes (`planc.execute.kernels.signatures`).

    python -m planc.execute.kernels.ptxbuild [--out DIR]       (default: planc/execute/kernels/ptx)

Runs on any machine with libNVVM (no GPU needed): numba's `compile_ptx` turns each kernel, for
each argument signature and each compute capability of `signatures.CCS`, into PTX; the files and
`index.json` are written to DIR. Then `ptxas` (of the nvidia-cuda-nvcc wheel) turns each PTX into
machine code for its capability (`.cubin`, listed in `cubins.json`). Load time then compiles
nothing: a device of a shipped major capability loads the cubin, any other the PTX, which the
driver JIT-compiles (and caches itself).

The PTX ISA version is that of the NVVM numba finds; a driver older than that NVVM refuses the
PTX and those launches fall back to numba. `tools/build_ptx.sh` builds with a pinned, older NVVM
so that the PTX loads on older drivers too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from ...base.simulation import GPU, choose_gpu
from . import ptxindex, signatures

_ENTRY = re.compile(r"^\s*\.(?:visible\s+)?\.entry\s+([A-Za-z0-9_$.]+)\s*\(", re.M)
_VERSION = re.compile(r"^\s*\.version\s+(\d+\.\d+)", re.M)
_TOOLKIT = re.compile(r"^//.*release (\d+\.\d+)", re.M)


class PtxBuildError(RuntimeError):
    """A kernel could not be built to PTX, or its PTX is not one kernel entry."""


def _numba_signature(sig: tuple):
    import numpy as np
    from numba import from_dtype, types

    args = []
    for s in sig:
        if s[0] == "i":
            args.append(types.int64)
        else:
            args.append(types.Array(from_dtype(np.dtype(s[1])), s[2], "C"))
    return types.void(*args)


def _versions() -> dict:
    from importlib.metadata import version

    return {"numba": version("numba"), "numba_cuda": version("numba-cuda")}


def registry() -> dict:
    """Kernel name -> numba dispatcher, for every name `signatures.launches()` uses."""
    from . import fp4_kernels, gguf_kernels, kernels, scatter

    return {**kernels.KERNELS, **scatter.KERNELS, **gguf_kernels.kernels(GPU), **fp4_kernels.KERNELS}


@contextlib.contextmanager
def _device_of_capability(cc):
    """numba's device-function dispatcher asks the driver for the current device's capability when a
    kernel calls a device function; a build machine may have no driver (nor GPU), so while building,
    that question is answered with the capability being built for."""
    from numba.cuda import dispatcher

    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=tuple(cc))
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def build(out: Path, ccs=signatures.CCS, log=print) -> dict:
    """Write one PTX file per (launch, capability) and the index to `out`; returns the index."""
    from numba import cuda

    from ..device.seam import default_device

    if default_device().target != GPU:  # the device says which target this process builds for
        raise PtxBuildError("the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1); PTX needs the real target")
    reg = registry()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ptx"):
        old.unlink()
    entries = []
    for name, sig in signatures.launches():
        if name not in reg:
            raise PtxBuildError(f"no kernel named {name!r} (kernels.KERNELS, scatter.KERNELS, gguf_dispatch.NAMES)")
        fn = reg[name].py_func
        for cc in ccs:
            try:
                with _device_of_capability(cc):
                    ptx, _ = cuda.compile_ptx(fn, _numba_signature(sig), cc=tuple(cc))
            except Exception as e:  # noqa: BLE001 - reported with the launch it failed on
                raise PtxBuildError(f"{name} {signatures.sig_tag(sig)} sm_{cc[0]}{cc[1]}: "
                                    f"{type(e).__name__}: {e}") from e
            ptx = _stable(ptx)
            found = _ENTRY.findall(ptx)
            if len(found) != 1:
                raise PtxBuildError(f"{name} {signatures.sig_tag(sig)}: {len(found)} kernel entries in its PTX, "
                                    "expected 1")
            ver = _VERSION.search(ptx)
            file = f"{name}.{signatures.sig_tag(sig)}.sm{cc[0]}{cc[1]}.ptx"
            (out / file).write_text(ptx)
            entries.append({"name": name, "signature": [list(s) for s in sig], "cc": list(cc), "file": file,
                            "entry": found[0], "ptx_version": ver.group(1) if ver else "?"})
            log(f"  {file}  ({len(ptx):,} chars)")
    toolkit = sorted({m for p in out.glob("*.ptx") for m in _TOOLKIT.findall(p.read_text()[:400])})
    doc = {"format": ptxindex.FORMAT, "source_hash": signatures.source_hash(), "sources": list(signatures.SOURCES),
           "ccs": [list(c) for c in ccs], **_versions(), "nvvm_release": ",".join(toolkit) or "?",
           "kernels": entries}
    (out / "index.json").write_text(_dump(doc))
    return doc


def ptxas_path() -> str | None:
    """ptxas: $PTXAS, else the one of the nvidia-cuda-nvcc wheel beside numba, else on PATH."""
    import shutil

    if os.environ.get("PTXAS"):
        return os.environ["PTXAS"]
    try:
        import nvidia.cuda_nvcc as nvcc

        cand = Path(list(nvcc.__path__)[0]) / "bin" / "ptxas"
        if cand.is_file():
            return str(cand)
    except ImportError:
        pass
    return shutil.which("ptxas")


def build_cubins(out: Path, ptxas: str | None = None, log=print) -> dict:
    """Machine code for each PTX file of the index in `out`, for the PTX's own capability (ptxas
    -arch=sm_XY), and `cubins.json`, which names each cubin with the sha256 of its PTX."""
    import hashlib
    import subprocess

    ptxas = ptxas or ptxas_path()
    if not ptxas:
        raise PtxBuildError("no ptxas (set PTXAS, or install nvidia-cuda-nvcc-cu12)")
    for old in out.glob("*.cubin"):
        old.unlink()
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    doc = ptxindex.read(out / "index.json")
    cubins = {}
    for e in doc["kernels"]:
        ptx = out / e.file
        cubin = e.file[:-len(".ptx")] + ".cubin"
        p = subprocess.run([ptxas, f"-arch=sm_{e.cc[0]}{e.cc[1]}", "-O3", "-o", str(out / cubin), str(ptx)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise PtxBuildError(f"ptxas {e.file}: {p.stderr.strip()[:400]}")
        cubins[e.file] = {"cubin": cubin, "ptx_sha256": hashlib.sha256(ptx.read_bytes()).hexdigest()}
        log(f"  {cubin}  ({(out / cubin).stat().st_size:,} bytes)")
    release = [ln for ln in version if "release" in ln]
    body = {"format": 1, "ptxas": (release or version or ["?"])[-1], "cubins": cubins}
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in cubins.items())
    (out / "cubins.json").write_text('{\n "format": 1,\n "ptxas": ' + json.dumps(body["ptxas"]) +
                                     ',\n "cubins": {\n' + rows + "\n }\n}\n")
    return body


def _stable(ptx: str) -> str:
    """The PTX with its module-scope `.common .global` declarations (numba's per-function environment
    pointers) in sorted order: numba emits them in an order that varies between builds, and the
    order of declarations means nothing to PTX. A rebuild from the same sources then changes no file."""
    lines = ptx.split("\n")
    idx = [i for i, ln in enumerate(lines) if ln.startswith(".common .global ")]
    for i, ln in zip(idx, sorted(lines[i] for i in idx)):
        lines[i] = ln
    return "\n".join(lines)


def _dump(doc: dict) -> str:
    """The index as JSON, one line per kernel entry (a rebuild's diff then reads entry by entry)."""
    head = {k: v for k, v in doc.items() if k != "kernels"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = ",\n".join(f"  {json.dumps(e)}" for e in doc["kernels"])
    return "{\n" + "\n".join(lines) + '\n "kernels": [\n' + rows + "\n ]\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planc.execute.kernels.ptxbuild", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ptxindex.DIR, help="output folder (default: %(default)s)")
    ap.add_argument("--cubins-only", action="store_true",
                    help="only build the machine code of the PTX already in the folder (ptxas)")
    a = ap.parse_args(argv)
    try:
        if a.cubins_only:
            got = build_cubins(a.out)
            print(f"{len(got['cubins'])} cubins ({got['ptxas']}) in {a.out}")
            return 0
        doc = build(a.out)
        cubins = build_cubins(a.out)
    except PtxBuildError as e:
        print(f"ptxbuild: {e}", file=sys.stderr)
        return 1
    print(f"{len(doc['kernels'])} PTX files for {len(signatures.launches())} launches x "
          f"{len(doc['ccs'])} capabilities (NVVM of CUDA {doc['nvvm_release']}, numba-cuda {doc['numba_cuda']}) and "
          f"{len(cubins['cubins'])} cubins ({cubins['ptxas']}) in {a.out}")
    return 0


if __name__ == "__main__":
    choose_gpu()  # before numba is imported: PTX needs the real target
    sys.exit(main())

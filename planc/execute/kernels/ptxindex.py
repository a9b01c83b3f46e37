"""The PTX shipped with the package: its index, and which file serves a launch on a device.

`planc/execute/kernels/ptx/index.json` lists one entry per (kernel name, signature, compute capability):
the PTX file, its entry symbol (numba's mangled kernel name) and the PTX ISA version, plus, once for
the whole index, the hash of the kernel sources it was built from and the numba / numba-cuda /
NVVM versions that built it. The PTX is built by `planc.execute.kernels.ptxbuild`.

A device runs the entry of the highest capability not above its own: the driver JIT-compiles PTX
forward to any later GPU (and keeps the result in its own compute cache), never backward.

Beside each PTX file lies its machine code for that capability (`.cubin`, built from the PTX by
`ptxas`, listed in `cubins.json` with the sha256 of the PTX it was built from). A device of the
same major capability (sm_80 code runs on 8.6 and 8.9, sm_90 code on 9.0) loads the cubin, so
that nothing is compiled at load time, not even by the driver; any other device, or a cubin that
does not match its PTX, takes the PTX.

An index whose source hash differs from the current sources is stale (a kernel changed and the PTX
was not built again): it is not used at all, and every launch falls back to numba. This module
imports neither numba nor numpy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import signatures

DIR = Path(__file__).resolve().parent / "ptx"
INDEX = DIR / "index.json"
CUBINS = DIR / "cubins.json"
FORMAT = 1


class PtxIndexError(ValueError):
    """The shipped index is missing, unreadable or of another format."""


@dataclass(frozen=True)
class Entry:
    name: str
    signature: tuple
    cc: tuple[int, int]
    file: str  # relative to the index's folder
    entry: str  # the kernel's symbol in the PTX
    ptx_version: str


def _tuple_sig(sig) -> tuple:
    return tuple(tuple(s) for s in sig)


def read(path: Path = INDEX) -> dict:
    """The index as stored; signatures and capabilities as tuples. Raises PtxIndexError."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PtxIndexError(f"{path}: no readable PTX index ({e}); build it with `{signatures.REBUILD}`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PtxIndexError(f"{path}: PTX index format {doc.get('format') if isinstance(doc, dict) else '?'}, "
                            f"expected {FORMAT}; build it with `{signatures.REBUILD}`")
    doc["kernels"] = [Entry(k["name"], _tuple_sig(k["signature"]), tuple(k["cc"]), k["file"], k["entry"],
                            k.get("ptx_version", "?")) for k in doc.get("kernels", [])]
    return doc


def stale_reason(doc: dict) -> str | None:
    """Why the index must not be used with the current sources, or None when it may."""
    if doc.get("source_hash") != signatures.source_hash():
        return (f"the shipped PTX was built from other kernel sources ({', '.join(signatures.SOURCES)} changed "
                f"since); rebuild it with `{signatures.REBUILD}`")
    return None


@lru_cache(maxsize=1)
def usable() -> tuple[dict, str | None]:
    """({(name, signature): [entries, by capability]}, None), or ({}, why not) when the index is
    missing, unreadable or stale. Read once per process."""
    try:
        doc = read()
    except PtxIndexError as e:
        return {}, str(e)
    return table_of(doc)


def table_of(doc: dict) -> tuple[dict, str | None]:
    """`usable()` of the index `doc` (as `read` returns it)."""
    why = stale_reason(doc)
    if why:
        return {}, why
    table: dict = {}
    for e in doc["kernels"]:
        table.setdefault((e.name, e.signature), []).append(e)
    for v in table.values():
        v.sort(key=lambda e: e.cc)
    return table, None


def choose(name: str, sig: tuple, cc: tuple[int, int], index=None) -> tuple[Entry | None, str | None]:
    """(the entry to load on a device of capability `cc`, None), or (None, why there is none);
    `index`: a `usable()` answer (None: the shipped index's)."""
    table, why = usable() if index is None else index
    if why:
        return None, why
    cands = [e for e in table.get((name, tuple(sig)), []) if e.cc <= tuple(cc)]
    if not cands:
        have = [e.cc for e in table.get((name, tuple(sig)), [])]
        if have:
            return None, f"{name} {signatures.sig_tag(sig)}: shipped PTX only for sm_{min(have)[0]}{min(have)[1]} and up"
        return None, f"{name} {signatures.sig_tag(sig)}: no shipped PTX for this signature"
    return cands[-1], None


def path_of(e: Entry) -> Path:
    return DIR / e.file


@lru_cache(maxsize=1)
def _cubins() -> dict:
    """PTX file -> (cubin file, sha256 of the PTX it was built from), as `cubins.json` lists them."""
    try:
        doc = json.loads(CUBINS.read_text())
        return {k: (v["cubin"], v["ptx_sha256"]) for k, v in doc["cubins"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def cubin_for(e: Entry, cc: tuple[int, int], cubins: dict | None = None) -> Path | None:
    """The machine code of entry `e` for a device of capability `cc`, or None (take the PTX):
    present only for a device of the entry's major capability, and only when the cubin was built
    from the PTX file as it is now (`cubins`: PTX file -> (cubin file, sha256 of its PTX); None:
    as `cubins.json` lists them)."""
    if tuple(cc)[0] != e.cc[0] or tuple(cc) < e.cc:
        return None
    got = (_cubins() if cubins is None else cubins).get(e.file)
    if got is None:
        return None
    try:
        if hashlib.sha256(path_of(e).read_bytes()).hexdigest() != got[1]:
            return None
    except OSError:
        return None
    path = DIR / got[0]
    return path if path.is_file() else None

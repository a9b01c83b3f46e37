"""The PTX shipped with the package: its index, and which file serves a launch on a device.

`planc/execute/ptx/index.json` lists one entry per (kernel name, signature, compute capability):
the PTX file, its entry symbol (numba's mangled kernel name) and the PTX ISA version, plus, once for
the whole index, the hash of the kernel sources it was built from and the numba / numba-cuda /
NVVM versions that built it. The PTX is built by `planc.execute.ptxbuild`.

A device runs the entry of the highest capability not above its own: the driver JIT-compiles PTX
forward to any later GPU (and keeps the result in its own compute cache), never backward.

An index whose source hash differs from the current sources is stale (a kernel changed and the PTX
was not built again): it is not used at all, and every launch falls back to numba. This module
imports neither numba nor numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import signatures

DIR = Path(__file__).resolve().parent / "ptx"
INDEX = DIR / "index.json"
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
    why = stale_reason(doc)
    if why:
        return {}, why
    table: dict = {}
    for e in doc["kernels"]:
        table.setdefault((e.name, e.signature), []).append(e)
    for v in table.values():
        v.sort(key=lambda e: e.cc)
    return table, None


def choose(name: str, sig: tuple, cc: tuple[int, int]) -> tuple[Entry | None, str | None]:
    """(the entry to load on a device of capability `cc`, None), or (None, why there is none)."""
    table, why = usable()
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

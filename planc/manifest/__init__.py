"""Checkpoint manifests: what a checkpoint holds, read and checked from its headers alone.

One reader per format behind the same `Manifest` value: safetensors (a file, a folder of shards,
an index json) and GGUF (a `.gguf` file, or the first of a split set)."""

import os

from planc.manifest.model import Manifest, ShardInfo, TensorEntry
from planc.manifest.safetensors import read_manifest as read_safetensors


def read_manifest(path) -> Manifest:
    """Read the manifest of a checkpoint; a path ending in `.gguf` is read as GGUF."""
    try:
        name = os.fspath(path)
    except TypeError:
        name = None
    if isinstance(name, str) and name.lower().endswith(".gguf") and os.path.isfile(name):
        from planc.manifest.gguf import read_gguf

        return read_gguf(name)
    return read_safetensors(path)


__all__ = ["Manifest", "ShardInfo", "TensorEntry", "read_manifest"]

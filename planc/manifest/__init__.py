"""Checkpoint manifests: what a checkpoint holds, read and checked from its headers alone."""

from planc.manifest.model import Manifest, ShardInfo, TensorEntry
from planc.manifest.safetensors import read_manifest

__all__ = ["Manifest", "ShardInfo", "TensorEntry", "read_manifest"]

"""The `Manifest` value: what a checkpoint holds, read from headers only."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import NamedTuple


@dataclass(frozen=True)
class ShardInfo:
    """One checkpoint file. `path` is relative to the manifest root (posix separators)."""

    path: str
    size_bytes: int
    mtime_ns: int
    header_bytes: int  # the JSON header's length (the 8-byte prefix not included)
    data_start: int  # absolute file offset of the data region: 8 + header_bytes
    metadata: tuple[tuple[str, str], ...] = ()  # the header's __metadata__, sorted


class TensorEntry(NamedTuple):
    """One tensor. `start` is the absolute byte offset in `file` (data_start + data_offsets[0]).

    A tuple: a checkpoint holds tens of thousands of them, and a frozen dataclass takes several
    times longer to build (at 90k tensors, a tenth of reading the manifest)."""

    name: str
    dtype: str  # safetensors spelling: "BF16", "F8_E4M3", ...
    shape: tuple[int, ...]
    file: str  # ShardInfo.path
    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Manifest:
    """All tensors of a checkpoint, sorted by (file, start); shards sorted by path."""

    root: str  # absolute folder that shard paths are relative to
    source: str  # what the user named: a file, a folder, or an index
    shards: tuple[ShardInfo, ...]
    tensors: tuple[TensorEntry, ...]
    _by_name: dict = field(default_factory=dict, compare=False, repr=False)
    format: str = "safetensors"  # or "gguf": which reader made it

    def __post_init__(self):
        if not self._by_name:
            self._by_name.update(zip([t.name for t in self.tensors], self.tensors))

    def tensor(self, name: str) -> TensorEntry:
        return self._by_name[name]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def find(self, name: str) -> TensorEntry | None:
        """The tensor named `name`, or None: one look-up where `has` then `tensor` take two."""
        return self._by_name.get(name)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

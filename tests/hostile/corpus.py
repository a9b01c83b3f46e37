"""The hostile corpus: checkpoints and specs that planc must refuse, each with its typed error.

A `Case` writes itself into an empty folder and returns the path to hand to planc: a checkpoint
(file, folder or index) for `kind == "checkpoint"`, a spec file for `kind == "spec"`. Checkpoints
are literal bytes built here, never by a safetensors writer, so that every byte of every case is
on this page. tests/test_hostile.py runs each case through the API (`read_manifest`,
`load_spec`, `compile_spec`) and through the command line (`planc inspect`, `planc compile`):
the error must be `error` with `code`, and the command must exit 2 with one line on stderr that
names `names` (the offending file). docs/reliability.md lists the same table.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planc.base.errors import BindError, ManifestError, PlancError, SpecError
from planc.manifest.safetensors import HEADER_CAP

MODEL = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "checkpoint" | "spec"
    what: str  # one line for docs/reliability.md
    build: Callable[[Path], Path]
    error: type[PlancError]
    code: str
    names: str  # the file the error must name
    words: tuple[str, ...] = ()  # and what else its line must say (the field, the lines, the cap)


# --------------------------------------------------------------------------- bytes


def st_bytes(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: u64 little-endian header length, the header, the data region."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def ent(dtype: str, shape, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def u8_shard(**sizes: int) -> bytes:
    """A valid file of U8 tensors of the given lengths, laid out in order."""
    header, off = {}, 0
    for name, n in sizes.items():
        header[name] = ent("U8", [n], off, off + n)
        off += n
    return st_bytes(header, bytes(range(256)) * (off // 256) + bytes(off % 256))


VALID = u8_shard(w=4, b=2)  # the checkpoint the spec cases point at


# --------------------------------------------------------------------------- builders


def file(content: bytes, name: str = MODEL) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        p = folder / name
        p.write_bytes(content)
        return p

    return build


def index(weight_map: dict, shards: dict[str, bytes], *, links: dict[str, str] | None = None) -> Callable[[Path], Path]:
    """A folder `ckpt` with `shards`, symlinks `links` (name -> target) and an index over `weight_map`."""

    def build(folder: Path) -> Path:
        d = folder / "ckpt"
        d.mkdir()
        for name, content in shards.items():
            (d / name).write_bytes(content)
        for name, target in (links or {}).items():
            os.symlink(target, d / name)
        p = d / INDEX
        p.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        return p

    return build


def links_folder(links: dict[str, str]) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        d = folder / "ckpt"
        d.mkdir()
        for name, target in links.items():
            os.symlink(target, d / name)
        return d

    return build


def spec(text: str, name: str = "spec.yaml", *, raw: bytes | None = None) -> Callable[[Path], Path]:
    """A spec file next to the valid checkpoint `model.safetensors` (tensors `w` and `b`)."""

    def build(folder: Path) -> Path:
        (folder / MODEL).write_bytes(VALID)
        p = folder / name
        p.write_bytes(raw if raw is not None else text.encode())
        return p

    return build


def loop_spec(folder: Path) -> Path:
    """A spec whose checkpoint is a symlink loop: the checkpoint's error, not the spec's."""
    os.symlink("b.safetensors", folder / "a.safetensors")
    os.symlink("a.safetensors", folder / "b.safetensors")
    p = folder / "spec.yaml"
    p.write_text(GOOD.replace("model.safetensors", "a.safetensors") + RULES)
    return p


def big_spec(folder: Path) -> Path:
    """A spec one byte over the cap, as a sparse file: refused from its size, never read."""
    from planc.spec.model import SPEC_CAP

    (folder / MODEL).write_bytes(VALID)
    p = folder / "spec.yaml"
    with open(p, "wb") as f:
        f.write((GOOD + RULES).encode())
        f.truncate(SPEC_CAP + 1)
    return p


def big_index(folder: Path) -> Path:
    """An index one byte over its cap, as a sparse file: refused from its size, never read."""
    from planc.manifest.safetensors import INDEX_CAP

    p = folder / INDEX
    with open(p, "wb") as f:
        f.write(b'{"weight_map": {}}')
        f.truncate(INDEX_CAP + 1)
    return p


def fifo_spec(folder: Path) -> Path:
    (folder / MODEL).write_bytes(VALID)
    p = folder / "spec.yaml"
    os.mkfifo(p)
    return p


GOOD = "checkpoint: model.safetensors\nbudget: {host: 64MiB}\nio: {slot: 4096, slots: 2}\n"
RULES = "rules: [{match: '*'}]\n"


def _lol(levels: int = 8) -> str:
    """The billion laughs: each anchor repeats the previous one nine times (9**levels nodes expanded)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return GOOD + RULES + "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the corpus

C, S = "checkpoint", "spec"
M, SE, B = ManifestError, SpecError, BindError

CASES: list[Case] = [
    # one file: the 8-byte prefix and the header
    Case("empty-file", C, "0-byte file", file(b""), M, "empty", MODEL),
    Case("seven-bytes", C, "7-byte file (shorter than the length prefix)", file(b"\x02" + bytes(6)), M,
         "short-file", MODEL),
    Case("header-past-eof", C, "header length runs past the end of the file", file(st_bytes(b"{}", length=4096)),
         M, "header-past-eof", MODEL),
    Case("header-over-cap", C, "header length over the format's 100 MB cap",
         file(st_bytes(b"{}", length=HEADER_CAP + 1)), M, "header-too-large", MODEL),
    Case("header-u64-max", C, "header length 2**64 - 1", file(b"\xff" * 8 + b"{}"), M, "header-too-large", MODEL),
    Case("not-json", C, "header is not JSON", file(st_bytes(b"{not json}")), M, "header-not-json", MODEL),
    Case("json-nan", C, "header uses NaN (not JSON)", file(st_bytes(b'{"a": NaN}')), M, "header-not-json", MODEL),
    Case("json-deep", C, "header nested 100,000 levels deep", file(st_bytes(b"[" * 100_000 + b"]" * 100_000)), M,
         "header-not-json", MODEL),
    Case("not-object", C, "header is a JSON array", file(st_bytes(b"[1, 2]")), M, "header-not-object", MODEL),
    Case("not-utf8", C, "header is not UTF-8", file(st_bytes(b'{"\xff": 1}')), M, "header-not-utf8", MODEL),
    Case("lone-surrogate", C, "tensor name escapes an unpaired UTF-16 surrogate (\\ud800)",
         file(st_bytes(b'{"\\ud800": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"x")), M,
         "header-not-utf8", MODEL),
    Case("duplicate-key", C, "a tensor named twice in one header",
         file(st_bytes(b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                       b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"x")), M,
         "header-duplicate-key", MODEL),
    Case("metadata-not-strings", C, "__metadata__ holds a number", file(st_bytes({"__metadata__": {"k": 1}})), M,
         "bad-metadata", MODEL),
    # entries
    Case("unknown-dtype", C, "unknown dtype F128", file(st_bytes({"t": ent("F128", [1], 0, 16)}, bytes(16))), M,
         "unknown-dtype", MODEL),
    Case("shape-bytes-disagree", C, "F32 [3, 5] is 60 bytes, offsets span 56",
         file(st_bytes({"t": ent("F32", [3, 5], 0, 56)}, bytes(56))), M, "size-mismatch", MODEL),
    Case("dims-overflow-u64", C, "dims whose product overflows 64 bits ([2**32, 2**32, 2])",
         file(st_bytes({"t": ent("U8", [2**32, 2**32, 2], 0, 1)}, b"x")), M, "size-mismatch", MODEL),
    Case("dims-wrap-to-span", C, "dims whose product wraps to the span modulo 2**64 ([2**64 + 4])",
         file(st_bytes({"t": ent("U8", [2**64 + 4], 0, 4)}, bytes(4))), M, "size-mismatch", MODEL),
    Case("negative-dim", C, "a negative dim", file(st_bytes({"t": ent("U8", [-1], 0, 1)}, b"x")), M, "bad-shape",
         MODEL),
    Case("sub-byte-partial", C, "3 F4 elements: not a whole number of bytes",
         file(st_bytes({"t": ent("F4", [3], 0, 2)}, bytes(2))), M, "partial-byte", MODEL),
    # offsets and the data region
    Case("offsets-overlap", C, "two tensors share bytes",
         file(st_bytes({"a": ent("U8", [4], 0, 4), "b": ent("U8", [4], 2, 6)}, bytes(6))), M, "overlap", MODEL),
    Case("offsets-reversed", C, "data_offsets end before they begin",
         file(st_bytes({"t": ent("U8", [0], 4, 0)}, bytes(4))), M, "bad-offsets", MODEL),
    Case("offsets-hole", C, "a hole between two tensors",
         file(st_bytes({"a": ent("U8", [4], 0, 4), "b": ent("U8", [4], 6, 10)}, bytes(10))), M, "hole", MODEL),
    Case("offsets-negative", C, "a negative offset", file(st_bytes({"t": ent("U8", [1], -1, 0)}, b"x")), M,
         "bad-offsets", MODEL),
    Case("data-short", C, "data region shorter than declared",
         file(st_bytes({"a": ent("U8", [8], 0, 8)}, bytes(4))), M, "data-short", MODEL),
    Case("data-long", C, "data region longer than declared (trailing bytes)",
         file(st_bytes({"a": ent("U8", [4], 0, 4)}, bytes(8))), M, "trailing-bytes", MODEL),
    # folders, indexes, paths
    Case("index-missing-shard", C, "index names a shard that does not exist",
         index({"w": "a.safetensors", "v": "b.safetensors"}, {"a.safetensors": u8_shard(w=4)}), M,
         "index-missing-shard", "b.safetensors"),
    Case("index-tensor-missing", C, "index names a tensor its shard does not hold",
         index({"w": "a.safetensors", "ghost": "a.safetensors"}, {"a.safetensors": u8_shard(w=4)}), M,
         "index-tensor-missing", "a.safetensors"),
    Case("index-tensor-elsewhere", C, "a shard holds a tensor the index puts in another shard",
         index({"w": "b.safetensors", "v": "a.safetensors"}, {"a.safetensors": u8_shard(w=4),
                                                              "b.safetensors": u8_shard(v=2)}), M,
         "index-mismatch", "a.safetensors"),
    Case("index-tensor-in-two-shards", C, "one tensor in two shards",
         index({"w": "a.safetensors", "v": "b.safetensors"}, {"a.safetensors": u8_shard(w=4),
                                                              "b.safetensors": u8_shard(v=2, w=4)}), M,
         "duplicate-tensor", "b.safetensors"),
    Case("index-escape-dotdot", C, "shard path climbs out with ../",
         index({"w": "../outside.safetensors"}, {}), M, "path-escape", "../outside.safetensors"),
    Case("index-escape-absolute", C, "shard path is absolute (/etc/passwd)", index({"w": "/etc/passwd"}, {}), M,
         "path-escape", "/etc/passwd"),
    Case("index-escape-backslash", C, "shard path climbs out with ..\\ (Windows separators)",
         index({"w": "sub\\..\\..\\x.safetensors"}, {}), M, "path-escape", "x.safetensors"),
    Case("index-shard-symlink-loop", C, "index names a shard that is a symlink loop",
         index({"w": "a.safetensors"}, {}, links={"a.safetensors": "b.safetensors", "b.safetensors": "a.safetensors"}),
         M, "symlink-loop", "a.safetensors"),
    Case("index-over-cap", C, "index 1 byte over its 100 MB cap (sparse)", big_index, M, "index-bad", INDEX,
         ("100000000-byte cap",)),
    Case("index-not-json", C, "index is not JSON", file(b'{"weight_map": ', INDEX), M, "index-bad", INDEX),
    Case("index-lone-surrogate", C, "index names a shard with an unpaired surrogate",
         file(b'{"weight_map": {"w": "\\udc80.safetensors"}}', INDEX), M, "index-bad", INDEX),
    Case("folder-symlink-loop", C, "folder holds two shards linked to each other",
         links_folder({"a.safetensors": "b.safetensors", "b.safetensors": "a.safetensors"}), M, "symlink-loop",
         "a.safetensors"),
    Case("folder-self-link", C, "folder holds a shard linked to itself",
         links_folder({"s.safetensors": "s.safetensors"}),
         M, "symlink-loop", "s.safetensors"),
    Case("folder-broken-link", C, "folder holds a dangling symlink", links_folder({"d.safetensors": "gone"}), M,
         "missing", "d.safetensors"),
    # specs
    Case("spec-unknown-key", S, "unknown top-level key", spec(GOOD + RULES + "colour: red\n"), SE, "spec-invalid",
         "spec.yaml"),
    Case("spec-unknown-rule-key", S, "unknown key in a rule", spec(GOOD + "rules: [{match: '*', dtpye: float16}]\n"),
         SE, "spec-invalid", "spec.yaml"),
    Case("spec-bad-unit", S, "budget in parsecs", spec(GOOD.replace("64MiB", "12 parsecs") + RULES), SE,
         "spec-invalid", "spec.yaml"),
    Case("spec-fraction-of-byte", S, "budget of half a byte", spec(GOOD.replace("64MiB", "0.5") + RULES), SE,
         "spec-invalid", "spec.yaml"),
    Case("spec-negative-budget", S, "negative budget", spec(GOOD.replace("64MiB", "-1") + RULES), SE, "spec-invalid",
         "spec.yaml"),
    Case("spec-negative-unit", S, "negative budget with a unit", spec(GOOD.replace("64MiB", "-8GiB") + RULES), SE,
         "spec-invalid", "spec.yaml"),
    Case("spec-budget-overflow", S, "budget of 400 nines GiB (overflows a float)",
         spec(GOOD.replace("64MiB", "9" * 400 + "GiB") + RULES), SE, "spec-invalid", "spec.yaml"),
    Case("spec-budget-over-int64", S, "budget of 2**64 bytes", spec(GOOD.replace("64MiB", str(2**64)) + RULES), SE,
         "spec-invalid", "spec.yaml"),
    Case("spec-budget-huge-int", S, "budget of a 5000-digit integer",
         spec("", name="spec.json",
              raw=json.dumps({"checkpoint": MODEL, "budget": {"host": 0}, "rules": [{"match": "*"}]})
              .replace('"host": 0', '"host": ' + "9" * 5000).encode()), SE, "spec-syntax", "spec.json"),
    Case("spec-slot-unaligned", S, "io.slot not a multiple of 4 KiB",
         spec(GOOD.replace("slot: 4096", "slot: 5000") + RULES), SE, "spec-invalid", "spec.yaml"),
    Case("spec-no-rules", S, "empty rules list", spec(GOOD + "rules: []\n"), SE, "spec-invalid", "spec.yaml"),
    Case("spec-rules-match-nothing", S, "rules that match no tensor (every tensor unmatched)",
         spec(GOOD + "rules: [{match: 'nothing.*'}]\n"), B, "unmatched", "spec.yaml"),
    Case("spec-rules-leave-some", S, "rules that leave a tensor unmatched", spec(GOOD + "rules: [{match: w}]\n"), B,
         "unmatched", "spec.yaml"),
    Case("spec-template-index", S, "name template that indexes ({name[a]})",
         spec(GOOD + "rules: [{match: '*', dequantize: {scale: '{name[a]}'}}]\n"), SE, "spec-invalid", "spec.yaml"),
    Case("spec-not-mapping", S, "spec is a YAML list", spec("- checkpoint\n- budget\n"), SE, "spec-not-mapping",
         "spec.yaml"),
    Case("spec-empty", S, "spec is an empty file", spec(""), SE, "spec-not-mapping", "spec.yaml"),
    Case("spec-yaml-syntax", S, "YAML syntax error", spec(GOOD + "rules: [{match: '*'\n"), SE, "spec-syntax",
         "spec.yaml"),
    Case("spec-json-syntax", S, "JSON syntax error", spec('{"checkpoint": ', name="spec.json"), SE, "spec-syntax",
         "spec.json"),
    Case("spec-json-deep", S, "JSON nested 100,000 levels deep", spec("[" * 100_000 + "]" * 100_000, name="spec.json"),
         SE, "spec-syntax", "spec.json"),
    Case("spec-yaml-deep", S, "YAML nested 5,000 levels deep", spec("[" * 5_000 + "]" * 5_000), SE,
         "spec-syntax", "spec.yaml"),
    Case("spec-alias-bomb", S, "billion laughs: nine aliases of nine aliases, 8 levels", spec(_lol()), SE,
         "spec-too-large", "spec.yaml"),
    Case("spec-alias-cycle", S, "an alias inside its own anchor", spec(GOOD + RULES + "x: &x [*x]\n"), SE,
         "spec-too-large", "spec.yaml"),
    Case("spec-bad-date", S, "a scalar YAML reads as an impossible date (2024-13-45)",
         spec(GOOD.replace("model.safetensors", "2024-13-45") + RULES), SE, "spec-syntax", "spec.yaml"),
    Case("spec-not-utf8", S, "spec is not UTF-8", spec("", raw=b"checkpoint: \xff\n"), SE, "spec-unreadable",
         "spec.yaml"),
    Case("spec-nul-checkpoint", S, "checkpoint path holds a NUL",
         spec("", name="spec.json",
              raw=b'{"checkpoint": "a\\u0000b", "budget": {"host": 1}, "rules": [{"match": "*"}]}'),
         SE, "spec-invalid", "spec.json"),
    Case("spec-fifo", S, "spec is a FIFO (reading it would block)", fifo_spec, SE, "spec-unreadable", "spec.yaml"),
    Case("spec-duplicate-key-yaml", S, "a key written twice in one YAML mapping (budget.host)",
         spec(GOOD.replace("{host: 64MiB}", "{host: 64MiB,\n         host: 1GiB}") + RULES), SE, "spec-duplicate-key",
         "spec.yaml", ("spec.yaml:3", "'budget.host'", "first at line 2")),
    Case("spec-duplicate-top-yaml", S, "two `rules:` keys in a YAML spec", spec(GOOD + RULES + RULES), SE,
         "spec-duplicate-key", "spec.yaml", ("'rules'", "first at line 4, again at line 5")),
    Case("spec-duplicate-key-json", S, "two `rules` keys in a JSON spec",
         spec('{"checkpoint": "model.safetensors",\n "budget": {"host": "64MiB"},\n "rules": [{"match": "*"}],\n'
              ' "rules": []}\n', name="spec.json"), SE, "spec-duplicate-key", "spec.json",
         ("spec.json:4", "'rules'", "first at line 3")),
    Case("spec-bad-device", S, "device: cuda:banana", spec(GOOD + "device: cuda:banana\n" + RULES), SE, "spec-invalid",
         "spec.yaml", ("device", "cuda:banana", "cuda:N")),
    Case("spec-run-zero", S, "io.run: 0 (every tensor its own run)", spec(GOOD.replace("slots: 2", "slots: 2, run: 0") + RULES),
         SE, "spec-invalid", "spec.yaml", ("io.run", "at least 1 byte")),
    Case("spec-yes-is-not-a-boolean", S, "`on: yes` (YAML 1.2: a string, not true)",
         spec(GOOD + "rules: [{match: '*', on: yes}]\n"), SE, "spec-invalid", "spec.yaml", ("rules[0].on", "'yes'")),
    Case("spec-over-cap", S, "spec 1 byte over its 16 MiB cap (sparse)", big_spec, SE, "spec-too-large", "spec.yaml",
         ("16,777,217 bytes", "16,777,216-byte cap")),
    Case("spec-checkpoint-symlink-loop", S, "spec names a checkpoint that is a symlink loop", loop_spec, M,
         "symlink-loop", "a.safetensors"),
    Case("spec-missing-checkpoint", S, "spec names a checkpoint that does not exist",
         spec(GOOD.replace("model.safetensors", "nope.safetensors") + RULES), M, "missing", "nope.safetensors"),
]

CHECKPOINTS = [c for c in CASES if c.kind == C]
SPECS = [c for c in CASES if c.kind == S]


def table() -> str:
    """The corpus as a Markdown table (docs/reliability.md)."""
    rows = ["| case | input | error | code |", "|---|---|---|---|"]
    rows += [f"| `{c.name}` | {c.what} | `{c.error.__name__}` | `{c.code}` |" for c in CASES]
    return "\n".join(rows)

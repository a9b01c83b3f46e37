"""The plan codec: `ir.Plan` <-> plan file (JSON, format 8); `plancheck` checks every field on load.

Encoding is compact and byte-identical for identical inputs: small records are JSON objects, the
records a plan holds by the thousand (tensors, parts, inputs, runs, requests, copies, kernels,
host parts) are JSON arrays whose field order the file itself states under `fields`; files are
named by their index in `checkpoint.files`. The step DAG is not stored: it is derived from the
parts (`ir.part_steps`), so a file cannot carry steps that disagree with them.

Decoding trusts nothing. Before the plan reaches the executor, `decode` checks types and ids;
every read inside its file's fingerprinted size; every copy inside its ring slot and inside the
arena, its landing region or its staging slot; every kernel's source, scale and destination
inside their regions; every tensor inside the arena, its bytes equal to dtype x shape, tensors
disjoint; every part inside its tensor and consistent with its op and dtypes; runs in order, each
part in exactly one run; counts and sizes that the executor uses to allocate equal to what the
records imply; and the recorded peaks and decision equal to a fresh replay (`admission.admit`).
Any failure is a `PlanFormatError` (exit 2) whose message names the field path.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import orjson

from .costs import DEFAULTS
from ..base.errors import PlanFormatError, printable
from ..base.gcpause import gc_paused
from .records import Plan
from .check import FIELDS, FORMAT, _shown, check
from ..base.codes import Code

# A plan is about 230-290 bytes a tensor (24 MB for 91k tensors, the largest checkpoints measured):
# 128 MiB holds about 460k tensors, five times that, and is refused before it is read.
MAX_PLAN_BYTES = 128 << 20
# Decoding holds the parsed document: about 18x a plan's bytes (orjson; measured), up to about 36x
# for text made of the smallest values (`[],` or `{},`). `decode_bound` bounds it from the text's
# structure before any parse, and a text whose bound passes DECODE_RATIO x its size, or that has
# more objects than a plan has, is refused: decoding holds at most DECODE_RATIO x MAX_PLAN_BYTES.
DECODE_RATIO = 40
MAX_OBJECTS = 256  # a plan's objects: its top level and the objects that are its values (about 10)
_TOKEN_BYTES = 128  # what one JSON value holds once parsed, at most (an object, its pointer, growth)
_OBJECT_BYTES = 256  # a dict of a few keys


def encode(plan: Plan) -> str:
    """The plan file's text."""
    return encode_bytes(plan).decode("utf-8")


@gc_paused()
def encode_bytes(plan: Plan) -> bytes:
    """The plan file's bytes (UTF-8 JSON, one line)."""
    files = {f.path: i for i, f in enumerate(plan.checkpoint.files)}
    tensors = {t.name: i for i, t in enumerate(plan.tensors)}
    # Reasons and source names are numbered in the order the parts first name them.
    reasons: dict = {}
    sources: dict = {}
    reason, source = reasons.setdefault, sources.setdefault
    parts = [[tensors[p.tensor], p.index, p.op, p.path, reason(p.reason, len(reasons)),
              [[i.role, source(i.tensor, len(sources)), files[i.file], *i[3:]] for i in p.inputs], *p[7:]]
             for p in plan.parts]
    runs = [[r.parts, [[files[q.file], *q[1:]] for q in r.requests], *r[3:]] for r in plan.runs]
    cp = plan.checkpoint
    doc = {
        "kind": "planc-plan", "format": FORMAT, "planc": plan.planc, "fields": FIELDS,
        "spec": plan.spec._asdict(),
        "checkpoint": {"source": cp.source, "root": cp.root, "files": cp.files},
        "device": plan.device,
        "tensor_parallel": plan.tensor_parallel._asdict(),
        "budget": plan.budget._asdict(),
        "io": plan.io._asdict(),
        "layout": plan.layout._asdict(),
        "tensors": plan.tensors,
        "reasons": list(reasons),
        "sources": list(sources),
        "parts": parts,
        "runs": runs,
        "skipped": plan.skipped,
        "peak": plan.peak._asdict(),
        "refusal": plan.refusal.as_dict() if plan.refusal else None,
        "costs": (plan.costs or DEFAULTS)._asdict(),
    }
    # orjson writes records (named tuples) as arrays through `default`; compact, UTF-8, and the same
    # bytes for the same plan. Five times the standard library's speed on a 24 MB plan.
    return orjson.dumps(doc, default=tuple) + b"\n"


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write `plan` to `path` atomically (`planc.base.outputs`: never over a device, a FIFO, a folder or
    one of the plan's checkpoint files)."""
    from ..base import outputs

    root = Path(plan.checkpoint.root)
    outputs.write(path, encode_bytes(plan), "plan file", inputs=[root / f.path for f in plan.checkpoint.files])


# -- load -----------------------------------------------------------------------------------------

def load_plan(path: str | Path, *, max_bytes: int = MAX_PLAN_BYTES) -> Plan:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise PlanFormatError(f"{p}: plan file is {size:,} bytes, more than the {max_bytes:,}-byte cap for "
                                      f"plan files", code=Code.PLAN_TOO_LARGE)
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise PlanFormatError(f"{p}: plan file not found", code=Code.PLAN_MISSING) from None
    except IsADirectoryError:
        raise PlanFormatError(f"{p}: is a folder, not a plan file", code=Code.PLAN_UNREADABLE) from None
    except PermissionError:
        raise PlanFormatError(f"{p}: plan file cannot be read (permission denied)", code=Code.PLAN_UNREADABLE) from None
    except OSError as e:
        raise PlanFormatError(f"{p}: plan file cannot be read ({e.strerror or e})", code=Code.PLAN_UNREADABLE) from None
    if len(data) > max_bytes:
        raise PlanFormatError(f"{p}: plan file is more than the {max_bytes:,}-byte cap for plan files",
                              code=Code.PLAN_TOO_LARGE)
    return decode(data, str(p))


# The Plan values this process made itself (compiled, or decoded through every check): any other
# Plan value (built or edited by a caller: `with_budget`, `dataclasses.replace`) is checked at the
# entry it comes through (`checked`).
_TRUSTED: "weakref.WeakValueDictionary[int, Plan]" = weakref.WeakValueDictionary()


def trust(plan: Plan) -> Plan:
    """Mark `plan` as made by planc itself (the compiler, `decode`): `checked` then takes it as it is."""
    _TRUSTED[id(plan)] = plan
    return plan


def checked(plan, where: str = "the Plan given") -> Plan:
    """`plan` as the executor may run it: a Plan this process compiled or decoded is taken as it is;
    any other value goes through the plan file's checks (encoded, then decoded: every field, every
    offset, and the recorded decision against admission's replay), so an edited plan
    (`plan.with_budget(host_bytes=1)`, a changed layout) is a `PlanFormatError` before anything is
    allocated."""
    if not isinstance(plan, Plan):
        raise PlanFormatError(f"{where}: expected a planc Plan, got {type(plan).__name__}", code=Code.PLAN_KIND)
    if _TRUSTED.get(id(plan)) is plan:
        return plan
    try:
        data = encode_bytes(plan)
    except PlanFormatError:
        raise
    except Exception as e:  # a field of the wrong type cannot be encoded
        raise PlanFormatError(f"{where}: not a valid plan: {printable(str(e))[:200]}", code=Code.PLAN_INVALID) from None
    return decode(data, where)


@gc_paused()
def decode(data: bytes | str, where: str = "<plan>") -> Plan:
    return trust(_decode(data, where))


def decode_bound(raw: bytes) -> int:
    """Bytes a parse of `raw` holds at most, from its structure (every value follows a `[`, `{`, `,`
    or `:`); a test holds orjson's and the standard library's peaks under it, plans and hostile text."""
    values = raw.count(b"[") + raw.count(b",") + raw.count(b":") + 1
    return 2 * len(raw) + _TOKEN_BYTES * values + _OBJECT_BYTES * raw.count(b"{")


def _check_bound(raw: bytes, where: str) -> None:
    objects = raw.count(b"{")
    if objects > MAX_OBJECTS:
        raise PlanFormatError(f"{where}: not a planc plan ({objects:,} JSON objects; a plan has at most "
                              f"{MAX_OBJECTS})", code=Code.PLAN_TOO_LARGE)
    bound = decode_bound(raw)
    if bound > DECODE_RATIO * max(len(raw), 1 << 16):
        raise PlanFormatError(f"{where}: not a planc plan (its {len(raw):,} bytes would take up to {bound:,} "
                              f"bytes to decode, more than {DECODE_RATIO}x: a plan's values are not that small)",
                              code=Code.PLAN_TOO_LARGE)


def _decode(data: bytes | str, where: str) -> Plan:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanFormatError(f"{where}: plan is {len(raw):,} bytes, more than the {MAX_PLAN_BYTES:,}-byte cap "
                              f"for plans", code=Code.PLAN_TOO_LARGE)
    _check_bound(raw, where)
    doc = _fast_parse(raw)
    if doc is not None:
        try:
            return _checked(doc, where)
        except PlanFormatError:
            pass  # the exact parser's reading of the text decides, and names the fault
    doc = None  # not held while the exact parser builds its own
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise PlanFormatError(f"{where}: not a valid plan: key {printable(str(e))!r} appears twice",
                              code=Code.PLAN_SYNTAX) from None
    except RecursionError:
        raise PlanFormatError(f"{where}: not a planc plan (JSON nested deeper than this reader follows; a plan is a "
                              f"few levels deep)", code=Code.PLAN_SYNTAX) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise PlanFormatError(f"{where}: not a planc plan (cannot parse JSON: {printable(str(e))[:200]})",
                              code=Code.PLAN_SYNTAX) from None
    return _checked(doc, where)


def _checked(doc, where: str) -> Plan:
    if not isinstance(doc, dict) or doc.get("kind") != "planc-plan":
        raise PlanFormatError(f"{where}: not a planc plan (no kind: planc-plan)", code=Code.PLAN_KIND)
    if type(doc.get("format")) is not int or doc["format"] != FORMAT:
        raise PlanFormatError(f"{where}: plan format {_shown(doc.get('format'))[:40]}, this planc reads "
                              f"format {FORMAT}; compile the spec again", code=Code.PLAN_VERSION)
    return check(doc, where)


def _fast_parse(data):
    """The document orjson parses from `data` (three times the standard library's speed on a large
    plan), or None where only the exact parser can say. It decides only plans that pass every
    check: orjson reads an integer past 64 bits as a float, which no integer field accepts, and a
    plan it finds faulty is parsed again exactly, so the message names what the text says.

    orjson keeps the last of a repeated key without a word. A plan's objects are its top level and
    the objects that are its values; with no backslash in the text every quote delimits a string,
    and with no quote followed by white space every key is closed by `":` (compile writes plans
    without white space; a key written `"budget" :` would go uncounted and its repeat unseen). So
    when those objects hold as many keys as the text has `":`, no key repeats anywhere (an object
    deeper down or a repeat makes the counts differ). Otherwise, and for anything orjson refuses,
    the standard library's parser with a duplicate check decides.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if b"\\" in raw or any(ws in raw for ws in _QUOTE_SPACE):
        return None
    try:
        doc = orjson.loads(raw)
    except (ValueError, RecursionError):
        return None
    if type(doc) is not dict:
        return None
    keys = len(doc) + sum([len(v) for v in doc.values() if type(v) is dict])
    return doc if keys == raw.count(b'":') else None


_QUOTE_SPACE = (b'" ', b'"\t', b'"\n', b'"\r')  # a quote then JSON white space: a key may end `" :`


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d



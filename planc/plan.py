"""The plan codec: `ir.Plan` <-> plan file (JSON, format 3); `plancheck` checks every field on load.

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
from pathlib import Path

from .costmodel import DEFAULTS
from .errors import PlanFormatError, printable
from .gcpause import gc_paused
from .ir import Plan
from .plancheck import FIELDS, FORMAT, check

MAX_PLAN_BYTES = 1 << 30  # a plan file larger than this is refused before it is read


@gc_paused()
def encode(plan: Plan) -> str:
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
        "refusal": plan.refusal._asdict() if plan.refusal else None,
        "costs": (plan.costs or DEFAULTS)._asdict(),
    }
    # No cycle check: the document is built just above from tuples and lists, and cannot hold one;
    # the check would record and forget every one of its million containers.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, check_circular=False) + "\n"


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(encode(plan), encoding="utf-8")


# -- load -----------------------------------------------------------------------------------------

def load_plan(path: str | Path, *, max_bytes: int = MAX_PLAN_BYTES) -> Plan:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise PlanFormatError(f"{p}: plan file is {size:,} bytes, more than the {max_bytes:,}-byte cap for "
                                      f"plan files", code="plan-too-large")
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise PlanFormatError(f"{p}: plan file not found", code="plan-missing") from None
    except IsADirectoryError:
        raise PlanFormatError(f"{p}: is a folder, not a plan file", code="plan-unreadable") from None
    except PermissionError:
        raise PlanFormatError(f"{p}: plan file cannot be read (permission denied)", code="plan-unreadable") from None
    except OSError as e:
        raise PlanFormatError(f"{p}: plan file cannot be read ({e.strerror or e})", code="plan-unreadable") from None
    if len(data) > max_bytes:
        raise PlanFormatError(f"{p}: plan file is more than the {max_bytes:,}-byte cap for plan files",
                              code="plan-too-large")
    return decode(data, str(p))


@gc_paused()
def decode(data: bytes | str, where: str = "<plan>") -> Plan:
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise PlanFormatError(f"{where}: not a valid plan: key {printable(str(e))!r} appears twice",
                              code="plan-syntax") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlanFormatError(f"{where}: not a planc plan (cannot parse JSON: {printable(str(e))[:200]})",
                              code="plan-syntax") from None
    if not isinstance(doc, dict) or doc.get("kind") != "planc-plan":
        raise PlanFormatError(f"{where}: not a planc plan (no kind: planc-plan)", code="plan-kind")
    if type(doc.get("format")) is not int or doc["format"] != FORMAT:
        raise PlanFormatError(f"{where}: plan format {printable(repr(doc.get('format')))[:40]}, this planc reads "
                              f"format {FORMAT}; compile the spec again", code="plan-version")
    return check(doc, where)


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d



"""The `Plan` value: frozen, versioned, with a JSON form byte-identical for identical inputs.

The plan is everything `execute` needs and everything `explain` shows: fingerprints, budgets, io
settings, the device layout, every part with its path and reason, every step with its costs, the
runs with their read requests, copies and kernels, the timeline, the totals and the verdict.
Order never depends on hashing: lists are sorted or in schedule order; keys are sorted on dump.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from . import PLAN_FORMAT
from .errors import PlanFormatError


def _freeze(x):
    if isinstance(x, dict):
        return MappingProxyType({k: _freeze(v) for k, v in x.items()})
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


def _thaw(x):
    if isinstance(x, MappingProxyType):
        return {k: _thaw(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [_thaw(v) for v in x]
    return x


@dataclass(frozen=True)
class Plan:
    doc: MappingProxyType

    @staticmethod
    def from_doc(doc: dict) -> "Plan":
        return Plan(_freeze(doc))

    def to_dict(self) -> dict:
        return _thaw(self.doc)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"

    def __getitem__(self, key):
        return self.doc[key]

    @property
    def fits(self) -> bool:
        return self.doc["refusal"] is None

    @property
    def refusal(self):
        return self.doc["refusal"]


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(plan.to_json())


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanFormatError(f"{p}: plan file not found", code="plan-missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanFormatError(f"{p}: not a planc plan (cannot parse JSON: {e})", code="plan-syntax") from None
    if not isinstance(doc, dict) or doc.get("kind") != "planc-plan":
        raise PlanFormatError(f"{p}: not a planc plan (no kind: planc-plan)", code="plan-kind")
    if doc.get("format") != PLAN_FORMAT:
        raise PlanFormatError(f"{p}: plan format {doc.get('format')!r}, this planc reads format {PLAN_FORMAT}; "
                              f"compile the spec again", code="plan-version")
    return Plan.from_doc(doc)

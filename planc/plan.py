"""The `Plan` value: frozen, versioned, with a JSON form byte-identical for identical inputs.

The plan is everything `execute` needs and everything `explain` shows: fingerprints, budgets, io
settings, the device layout, every part with its path and reason, every step with its costs, the
runs with their read requests, copies and kernels, the timeline, the totals and the verdict.
Order never depends on hashing: lists are sorted or in schedule order; keys are sorted on dump.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import MappingProxyType

from . import PLAN_FORMAT
from .errors import PlanFormatError


def _freeze(x):
    t = type(x)
    if t is dict or isinstance(x, dict):
        return MappingProxyType({k: _freeze(v) for k, v in x.items()})
    if t is list or isinstance(x, list):
        return tuple([_freeze(v) for v in x])
    if t is not tuple and isinstance(x, tuple):  # a named tuple of the compiler: a plain one
        return tuple(x)
    return x


def _thaw(x):
    t = type(x)
    if t is dict or t is MappingProxyType or isinstance(x, dict):
        return {k: _thaw(v) for k, v in x.items()}
    if t is list or isinstance(x, (list, tuple)):
        return [_thaw(v) for v in x]
    return x


_MISSING = object()


class Plan:
    """A compiled (or loaded) plan: read it with `plan[key]`, `plan.doc`, `to_dict()` or `to_json()`.

    The plan owns a JSON-ready dict that nothing changes (a compiled plan shares the compiler's
    tuples where JSON wants arrays). The frozen form (`doc`: read-only mappings and tuples) is built
    only when asked for: at 100k tensors it has millions of nodes, and compiling, explaining and
    saving a plan never need it. `plan[key]` freezes that key's value alone.

    A key may also be built later, on its first read: `later` maps it (present in `doc` with a None
    placeholder, so that key order is kept) to the function that builds its value. The compiler
    defers the step list that way; `explain` never reads it, saving or freezing the plan does.
    """

    __slots__ = ("_raw", "_doc", "_keys", "_later", "_lock")

    def __init__(self, doc: dict, later: dict | None = None):
        """Takes `doc` over: the caller must not change it afterwards (`from_doc` copies)."""
        self._raw = doc
        self._doc = None
        self._keys: dict = {}
        self._later = dict(later or {})
        self._lock = threading.Lock()

    @staticmethod
    def from_doc(doc: dict) -> "Plan":
        return Plan(_thaw(doc))

    def _fill(self, keys=None) -> None:
        """Build the deferred values of `keys` (default: all) into the plain dict."""
        if not self._later:
            return
        with self._lock:
            for k in list(self._later) if keys is None else keys:
                make = self._later.pop(k, None)
                if make is not None:
                    self._raw[k] = make()

    @property
    def doc(self) -> MappingProxyType:
        if self._doc is None:
            self._fill()
            raw, keys = self._raw, self._keys
            self._doc = MappingProxyType({k: keys[k] if k in keys else _freeze(v) for k, v in raw.items()})
            # One form is enough from here on: the plain dict goes, the frozen one answers.
            self._raw, self._keys = None, {}
        return self._doc

    def _plain(self) -> dict:
        """The whole plan as dicts, lists and tuples, shared, not copied: to read, never to change."""
        self._fill()
        raw = self._raw
        return raw if raw is not None else _thaw(self._doc)

    def _read(self, key, default=None):
        """One key's value as `_plain` holds it (shared: to read, never to change), or `default`
        when the plan has no such key; builds no other deferred key."""
        raw = self._raw
        if raw is None:
            return _thaw(self._doc.get(key, default))
        self._fill((key,))
        return raw.get(key, default)

    def plain(self, key, default=None):
        """`key`'s value as plain dicts and lists, shared with the plan (read it, never change it).

        The executor reads the plan this way: freezing the runs of a 100k-tensor plan into read-only
        mappings costs a second that a load should not spend."""
        return self._read(key, default)

    def to_dict(self) -> dict:
        self._fill()
        raw = self._raw
        return _thaw(raw if raw is not None else self._doc)

    def to_json(self) -> str:
        return json.dumps(self._plain(), sort_keys=True, separators=(",", ":")) + "\n"

    def __getitem__(self, key):
        raw = self._raw
        if raw is None:
            return self._doc[key]
        v = self._keys.get(key, _MISSING)
        if v is _MISSING:
            self._fill((key,))
            v = self._keys[key] = _freeze(raw[key])
        return v

    def __eq__(self, other):
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        d = self._raw if self._raw is not None else self._doc
        return f"Plan({d['spec']['path']!r}, {len(d['parts'])} parts, fits={d['refusal'] is None})"

    @property
    def fits(self) -> bool:
        return self["refusal"] is None

    @property
    def refusal(self):
        return self["refusal"]


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
    return Plan(doc)

"""Plan file or spec? Told apart by content, in one place (`run` and `explain` take either).

Input: a path; output: whether the plan reader (`plan.load_plan`) or the spec reader
(`spec.load_spec`) should have it. Only the first 64 KiB are read (a 1 GiB plan is not read twice).

- A JSON object that carries a plan's format marker there (`"kind": "planc-plan"`, the first key
  compile writes) is a plan, whatever its name: a plan saved as `plan.txt` or `plan.yaml` is read as the
  plan it is, not as a spec with two dozen faults.
- A `.json` is also a plan when it names a key only plans have (`"runs"`, `"parts"`, `"peak"`, ...:
  a plan whose marker was edited away), when it is empty or binary (no spec is; the plan reader
  refuses it in one line), when it is larger than any spec, or when it does not exist (the plan
  reader says it is missing). A JSON spec whose quoted key is also a plan's (`"format"` of a
  dequantize) is read as a spec after all by the CLI (`_looks_like_spec`).
- Everything else is a spec (a FIFO or a device too: the spec reader refuses it without blocking).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .prestart import head
from ..base.units import SPEC_CAP

_MARKER = re.compile(rb'"kind"\s*:\s*"planc-plan"')
# Keys only a plan has (plans are written compact: `{"kind":"planc-plan","format":3,...`).
_PLAN_KEYS = re.compile(rb'"(?:kind|format|fits|layout|parts|peak|refusal|runs|steps|timeline|totals|'
                        rb'device_bytes|host_bytes|mtime_ns|size_bytes)"\s*:')


def is_plan_file(path: Path) -> bool:
    """Whether `path` should be read as a plan (else as a spec); see the module's docstring."""
    path = Path(path)
    json_name = path.suffix.lower() == ".json"
    got = head(path)
    if got is None:
        return json_name and not os.path.lexists(path)
    size, text = got
    if _written_plan(text):
        return True
    if not json_name:
        return False
    return size > SPEC_CAP or bool(_PLAN_KEYS.search(text)) or _empty_or_binary(text)


def _written_plan(text: bytes) -> bool:
    """A JSON object (what compile writes) whose head carries the plan's marker: the marker in a
    YAML spec's comment does not make the spec a plan."""
    return text.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") and bool(_MARKER.search(text))


def is_written_plan(path: Path) -> bool:
    """Whether `path` holds a plan as planc writes them (the outputs planc may replace)."""
    got = head(Path(path))
    return got is not None and _written_plan(got[1])


def _empty_or_binary(text: bytes) -> bool:
    if not text.strip() or b"\x00" in text:
        return True
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(text) - 4  # not a character cut at the end of the 64 KiB read
    return False

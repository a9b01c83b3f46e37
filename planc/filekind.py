"""Plan file or spec? Told apart by content, in one place (`run` and `explain` take either).

Input: a path; output: whether the plan reader (`plan.load_plan`) or the spec reader
(`spec.load_spec`) should have it. A file is a plan when its first 64 KiB name a key only a plan
has (`"kind"`, `"parts"`, `"runs"`, `"size_bytes"`...), whatever its name: a plan saved as
`plan.txt` or `plan.yaml` is read as the plan it is, not as a spec with two dozen faults. A `.json`
that holds no spec's `"rules"` (empty, binary, a truncated or foreign document) or is larger than
any spec goes to the plan reader too, which refuses it in one line. Everything else is a spec. A
missing `.json` is a plan (the plan reader says it is missing); a FIFO or a device is left to the
spec reader, which refuses it without blocking. Only the head is read: a 1 GiB plan is not read
twice.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .prestart import head
from .units import SPEC_CAP

# Keys only a plan has (plans are written compact: `{"kind":"planc-plan","format":3,...`).
_PLAN_KEYS = re.compile(rb'"(?:kind|format|fits|layout|parts|peak|refusal|runs|steps|timeline|totals|'
                        rb'device_bytes|host_bytes|mtime_ns|size_bytes)"\s*:')
_SPEC_KEY = re.compile(rb'"rules"\s*:')


def is_plan_file(path: Path) -> bool:
    """Whether `path` should be read as a plan (else as a spec); see the module's docstring."""
    path = Path(path)
    json_name = path.suffix.lower() == ".json"
    got = head(path)
    if got is None:
        return json_name and not os.path.lexists(path)
    size, text = got
    if _PLAN_KEYS.search(text):
        return True
    return json_name and (size > SPEC_CAP or not _SPEC_KEY.search(text))

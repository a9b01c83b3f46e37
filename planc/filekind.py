"""Plan file or spec? Told apart by content, in one place (`run` and `explain` take either).

Input: a path; output: whether the plan reader (`plan.load_plan`) or the spec reader
(`spec.load_spec`) should have it. A file whose first 64 KiB carry a plan's format marker
(`"kind": "planc-plan"`, the first key compile writes) is a plan, whatever its name: a plan saved
as `plan.txt` or `plan.yaml` is read as the plan it is, not as a spec with two dozen faults. A
`.json` is a plan too unless it holds a spec's `"rules"` there: an empty, binary, truncated or
foreign `.json` goes to the plan reader, which refuses it in one line; so does one larger than any
spec. A missing `.json` is a plan (the plan reader says it is missing); a FIFO or a device is left
to the spec reader, which refuses it without blocking. Everything else is a spec (a YAML spec may
quote its keys, `"format": mxfp4` included). Only the head is read: a 1 GiB plan is not read twice.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .prestart import head
from .units import SPEC_CAP

_MARKER = re.compile(rb'"kind"\s*:\s*"planc-plan"')
_SPEC_KEY = re.compile(rb'"rules"\s*:')


def is_plan_file(path: Path) -> bool:
    """Whether `path` should be read as a plan (else as a spec); see the module's docstring."""
    path = Path(path)
    json_name = path.suffix.lower() == ".json"
    got = head(path)
    if got is None:
        return json_name and not os.path.lexists(path)
    size, text = got
    if _MARKER.search(text):
        return True
    return json_name and (size > SPEC_CAP or not _SPEC_KEY.search(text))

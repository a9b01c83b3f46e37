"""What a format's plan checks are (`planc.plan.formatcheck`)."""

from __future__ import annotations


class FormatCheck:
    """The plan reader's checks of one kernel format (`planc.base.formats`), beyond those every part
    and kernel record gets in `planc.plan.check`:

    - `part(n, at)`: part `n` (at field path `at`) of this format: its inputs, output and the host
      or landing bytes it holds follow from its inputs;
    - `kernel(k, parts, in_run, at, limits)`: kernel record `k`, whose fields are typed and in range,
      against its parts (`parts`, those of its run `in_run`) and the regions it reads and writes
      (`limits`: space -> bytes); `at(field)` names a field of it in an error.

    Each raises `planc.plan.checkbase._bad(path, problem)`, which the reader reports."""

    name = ""

    def part(self, n, at: str) -> None:
        raise NotImplementedError

    def kernel(self, k, parts, in_run, at, limits) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<format check {self.name}>"

"""The `planc` command's entry point: `planc run` gets its head start (`planc.prestart`), then the CLI runs."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        from .prestart import start_run

        start_run(sys.argv[2:])
    from .cli import entry

    entry()

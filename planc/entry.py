"""The `planc` command's entry point: `planc run` gets its head start (`planc.prestart`), then the CLI runs."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        try:
            from .prestart import start_run

            start_run(sys.argv[2:])
        except KeyboardInterrupt:
            sys.stderr.write("planc: interrupted\n")
            sys.exit(130)
        except Exception:  # noqa: BLE001 - only a head start: the command checks and reports everything itself
            pass
    from .cli import entry

    entry()

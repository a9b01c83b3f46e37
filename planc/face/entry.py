"""The `planc` command's entry point: `planc run` gets its head start (`planc.face.prestart`), then the CLI runs."""

from __future__ import annotations

import os
import sys


def main() -> None:
    from .stdio import fill_closed_fds

    fill_closed_fds()  # `planc ... >&-`: no file opened later may take fd 1 or 2
    if sys.argv[1:2] == ["run"]:
        try:
            from .prestart import start_run

            start_run(sys.argv[2:])
        except KeyboardInterrupt:
            _interrupted()
        except Exception:  # noqa: BLE001 - only a head start: the command checks and reports everything itself
            pass
    try:
        from .cli import entry
    except KeyboardInterrupt:  # Ctrl-C while the command line's modules are still importing
        _interrupted()
    entry()


def _interrupted() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the exit
    try:
        sys.stderr.write("planc: interrupted\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed
        pass
    os._exit(130)

"""The `planc` process's standard streams when they are closed, full, or a pipe nobody reads.

Input: the process's fds 0-2 and `sys.stdout` / `sys.stderr`; output: streams every command can
write to, and a typed error for a write that fails. The convention (docs/cli.md, "Output streams"):

- A standard fd that is not open at start (`planc ... >&-`, `2>&-`) is opened on /dev/null first
  (`fill_closed_fds`), so no file planc opens later takes its number: a plan file opened as fd 1
  would otherwise receive what is printed.
- stdout closed: the first write of output fails: `planc: cannot write output to stdout: it is
  closed [output-failed]`, exit 2 (what the command did before, a plan written with `-o`, stays).
- stdout on a full disk or /dev/full (ENOSPC, EIO, EBADF...): `planc: cannot write output to
  stdout: <reason> [output-failed]`, exit 2.
- stdout a pipe whose reader has gone (EPIPE: `planc explain p.json --json | head -1`): exit 141
  (128 + SIGPIPE, what a shell reports for `cat` or `seq` in that pipe), nothing printed.
- stderr closed: the messages are lost; the exit code is the one the command would give.

`guarded()` puts stdout behind the guard for one command (the CLI's `main`); after a failed write
the rest of the output is discarded (fd 1 is pointed at /dev/null), so the exit's flush cannot
fail a second time and print "Exception ignored".
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

from ..base.errors import PlancError
from ..base.codes import Code


class OutputError(PlancError):
    """Output could not be written to stdout (closed, a full disk, /dev/full)."""

    exit_code = 2
    default_code = Code.OUTPUT_FAILED


class PipeClosed(PlancError):
    """stdout is a pipe whose reader has gone: the command ends quietly, as `cat` does."""

    exit_code = 141  # 128 + SIGPIPE
    default_code = Code.PIPE_CLOSED


def fill_closed_fds() -> None:
    """Open /dev/null on each of fds 0, 1 and 2 that is not open (so that no later file takes it)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                got = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if got != fd:  # a lower fd was free too: it is filled on its own turn
                os.dup2(got, fd)
                os.close(got)
    if sys.stderr is None:  # closed at start: messages go nowhere, exit codes stay
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


class _Closed:
    """What stdout is when it was closed at start: every write of text fails."""

    encoding, errors = "utf-8", "strict"

    def write(self, s):
        if s:
            raise OSError(errno.EBADF, "it is closed")
        return 0

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        raise OSError(errno.EBADF, "it is closed")


class _Guarded:
    """`stream` with its failed writes and flushes raised as `OutputError` / `PipeClosed`."""

    def __init__(self, stream):
        self._stream = stream

    def _failed(self, e: OSError) -> PlancError:
        _discard_rest(self._stream)
        if e.errno == errno.EPIPE:
            return PipeClosed("stdout: the reader of the pipe has gone")
        return OutputError(f"cannot write output to stdout: {e.strerror or e}")

    def write(self, s):
        try:
            return self._stream.write(s)
        except OSError as e:
            raise self._failed(e) from None

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _discard_rest(stream) -> None:
    """Point fd 1 at /dev/null: what is still buffered goes nowhere, and later flushes succeed."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


@contextlib.contextmanager
def guarded():
    """stdout behind the guard while the block runs (restored after); a closed stdout becomes `_Closed`."""
    old = sys.stdout
    sys.stdout = _Guarded(old if old is not None else _Closed())
    try:
        yield
    finally:
        sys.stdout = old


def flush_quietly() -> bool:
    """Flush both streams; False when one of them failed (or is gone)."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - at the exit, any failure only means "not flushed"
            ok = False
    return ok

"""Typed errors. Every stage raises a subclass of `PlancError` with a short `code`.

Exit codes (kept by every command): 0 success, 2 invalid input, 3 refused by admission,
130 interrupted (SIGINT), 1 anything else.
"""

from __future__ import annotations

import re

NAME_LIMIT = 120  # characters of one name (tensor, file, key) in an error line


def printable(text: str) -> str:
    """`text` for one terminal line: characters that are not printable (newlines, terminal escapes,
    unpaired surrogates from a hostile checkpoint's names) are shown as Python escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def shorten(name: str, limit: int = NAME_LIMIT) -> str:
    """`name` for an error line: at most about `limit` characters, its head and tail kept (names differ
    at either end), with its full length said: a 5,000-character tensor name must not flood a log."""
    if len(name) <= limit:
        return name
    keep = max(limit - 30, 8)
    return f"{name[:keep * 2 // 3]}...{name[-(keep // 3):]} ({len(name):,} characters)"


def shorten_words(line: str, limit: int = NAME_LIMIT) -> str:
    """`line` with every run of more than `limit` non-space characters shortened by `shorten`."""
    return re.sub(r"""(\S{%d,}?)([;,.:)\]'"]*)(?=\s|$)""" % (limit + 1),
                  lambda m: shorten(m.group(1), limit) + m.group(2), line)


class PlancError(Exception):
    """Base of every planc error. `code` is short and stable; `exit_code` maps to the CLI."""

    exit_code = 1
    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code or self.default_code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class ManifestError(PlancError):
    """A checkpoint file or index is malformed, missing or inconsistent."""

    exit_code = 2
    default_code = "manifest"


class SpecError(PlancError):
    """A placement spec is malformed or names something that does not exist."""

    exit_code = 2
    default_code = "spec"


class BindError(PlancError):
    """Rules and manifest do not fit together (unmatched tensors, bad fuse/stack groups...)."""

    exit_code = 2
    default_code = "bind"


class PlanFormatError(PlancError):
    """A plan file cannot be read (bad JSON, wrong version)."""

    exit_code = 2
    default_code = "plan"


class FingerprintError(PlancError):
    """A checkpoint file changed (size or mtime) between compile and run."""

    exit_code = 2
    default_code = "fingerprint"


class AdmissionError(PlancError):
    """The plan, or one of its runs, does not fit the budget or the live room."""

    exit_code = 3
    default_code = "refused"

    def __init__(self, message: str, *, code: str | None = None, refusal: dict | None = None):
        super().__init__(message, code=code)
        self.refusal = refusal or {}


class ExecuteError(PlancError):
    """The load failed while running (read error, device error, interrupted)."""

    exit_code = 1
    default_code = "execute"


class ReadError(ExecuteError):
    """A read from a checkpoint file failed or came back short during the load."""

    exit_code = 2
    default_code = "read"


class Interrupted(ExecuteError):
    """The load was interrupted (SIGINT / KeyboardInterrupt); everything it allocated was released."""

    exit_code = 130  # 128 + SIGINT, as shells report a process ended by Ctrl-C
    default_code = "interrupted"


class HandoffError(PlancError):
    """Loaded tensors and a PyTorch module do not fit together (missing or unexpected keys, shapes),
    or torch is not installed."""

    exit_code = 2
    default_code = "handoff"


class DigestError(PlancError):
    """A digest file cannot be used (malformed, edited, of another checkpoint), or the bytes a load
    read do not match it."""

    exit_code = 2
    default_code = "digest"


class TornModelError(ExecuteError):
    """A reload failed after it began writing: the model's bytes are neither the old weights nor the
    new ones, and reading them is refused until a reload succeeds."""

    exit_code = 1
    default_code = "torn"


class ReloadError(PlancError):
    """A reload target does not match the live model's layout (names, dtypes, shapes, offsets, size);
    nothing was written."""

    exit_code = 2
    default_code = "reload-layout"

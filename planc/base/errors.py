"""Typed errors. Every stage raises a subclass of `PlancError` with a short `code`.

Exit codes (kept by every command): 0 success, 2 invalid input, 3 refused by admission,
130 interrupted (SIGINT), 1 anything else.
"""

from __future__ import annotations

import re
from typing import Protocol

from .codes import Code


class Refusal(Protocol):
    """What an `AdmissionError` needs of the refusal it carries (`planc.plan.records.Refusal`)."""

    code: str
    message: str

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
    """Base of every planc error. `code` is short and stable; `exit_code` maps to the CLI.

    `code` is one of the closed set in `planc.base.codes` (a `Code`, or its text); any other is refused here,
    at construction (ValueError), so a typo cannot reach a user or a script that matches on codes."""

    exit_code = 1
    default_code = Code.ERROR

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        try:
            self.code = Code(code or self.default_code)
        except ValueError:
            raise ValueError(f"{code or self.default_code!r} is not an error code of planc.base.codes.Code; "
                             "add it there") from None
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class ManifestError(PlancError):
    """A checkpoint file or index is malformed, missing or inconsistent."""

    exit_code = 2
    default_code = Code.MANIFEST


class SpecError(PlancError):
    """A placement spec is malformed or names something that does not exist."""

    exit_code = 2
    default_code = Code.SPEC


class BindError(PlancError):
    """Rules and manifest do not fit together (unmatched tensors, bad fuse/stack groups...)."""

    exit_code = 2
    default_code = Code.BIND


class PlanFormatError(PlancError):
    """A plan file cannot be read (bad JSON, wrong version)."""

    exit_code = 2
    default_code = Code.PLAN


class FingerprintError(PlancError):
    """A checkpoint file changed (size or mtime) between compile and run."""

    exit_code = 2
    default_code = Code.FINGERPRINT


class AdmissionError(PlancError):
    """The plan, or one of its runs, does not fit the budget or the live room. `refusal` is the
    `Refusal` record that says which run, step and bytes (None only when none was given)."""

    exit_code = 3
    default_code = Code.REFUSED

    def __init__(self, message: str, *, code: str | None = None, refusal: Refusal | None = None):
        super().__init__(message, code=code or (refusal.code if refusal is not None else None))
        self.refusal = refusal

    @classmethod
    def of(cls, refusal: Refusal) -> AdmissionError:
        """The error for one refusal: its message and code are the record's."""
        return cls(refusal.message, code=refusal.code, refusal=refusal)


class ExecuteError(PlancError):
    """The load failed while running (read error, device error, interrupted)."""

    exit_code = 1
    default_code = Code.EXECUTE


class ReadError(ExecuteError):
    """A read from a checkpoint file failed or came back short during the load."""

    exit_code = 2
    default_code = Code.READ


class Interrupted(ExecuteError):
    """The load was interrupted (SIGINT / KeyboardInterrupt); everything it allocated was released."""

    exit_code = 130  # 128 + SIGINT, as shells report a process ended by Ctrl-C
    default_code = Code.INTERRUPTED


class HandoffError(PlancError):
    """Loaded tensors and a PyTorch module do not fit together (missing or unexpected keys, shapes),
    or torch is not installed."""

    exit_code = 2
    default_code = Code.HANDOFF


class DigestError(PlancError):
    """A digest file cannot be used (malformed, edited, of another checkpoint), or the bytes a load
    read do not match it."""

    exit_code = 2
    default_code = Code.DIGEST


class TornModelError(ExecuteError):
    """A reload failed after it began writing: the model's bytes are neither the old weights nor the
    new ones, and reading them is refused until a reload succeeds."""

    exit_code = 1
    default_code = Code.TORN


class ModelFreedError(ExecuteError, KeyError):
    """A model's tensor asked for after `LoadedModel.free()`: its device memory is given back. A
    KeyError too, so code that catches a missing name's KeyError keeps working."""

    exit_code = 1
    default_code = Code.MODEL_FREED

    def __str__(self) -> str:  # KeyError's own would quote the message
        return Exception.__str__(self)


class ReloadError(PlancError):
    """A reload target does not match the live model's layout (names, dtypes, shapes, offsets, size);
    nothing was written."""

    exit_code = 2
    default_code = Code.RELOAD_LAYOUT

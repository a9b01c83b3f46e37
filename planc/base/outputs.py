"""Every file planc writes (a plan, a report, the probe's figures, a synthetic checkpoint) goes
through here: it could be someone's only copy.

`target` decides where an output may go, before any work:
- a symlink is written through (its target is the output), never replaced;
- the output must be a new file or a regular file: a device node (`/dev/null`, `/dev/full`), a
  FIFO, a socket or a folder is refused, never renamed over;
- `ours`, when given, must accept an existing file (planc wrote it: the probe's JSON), else refused;
- the output must not be one of the `inputs` (the spec, the plan, a checkpoint file), by path or by
  identity (`os.path.samefile`: a hard link or another spelling is the same file).
`write` then writes a temporary file next to the output, flushes it to disk and renames it over the
output, so a reader sees the old file or the new one, never a part; a full disk or a read-only
folder leaves the old file as it was. Every refusal is an `OutputError` (exit 2) naming the path.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable

from .errors import PlancError, printable
from .codes import Code


class OutputError(PlancError):
    """An output path planc must not or cannot write: a device, a FIFO, an input, a file it did not make."""

    exit_code = 2
    default_code = Code.OUTPUT


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _same(a: Path, b) -> bool:
    try:
        b = Path(b)
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def target(path, what: str, *, inputs: Iterable = (), ours: Callable[[Path], bool] | None = None) -> Path:
    """The file `path` names, resolved through symlinks, checked as an output; raises `OutputError`."""
    shown = printable(str(path))
    try:
        p = Path(path)
        if not str(path):
            raise OutputError(f"{what}: an empty path; give a file name", code=Code.OUTPUT_PATH)
        real = Path(os.path.realpath(p))
        try:
            st = os.stat(real)
        except FileNotFoundError:
            st = None
    except OutputError:
        raise
    except (OSError, ValueError) as e:
        raise OutputError(f"{what} {shown}: cannot use this path ({getattr(e, 'strerror', None) or e})",
                          code=Code.OUTPUT_PATH) from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{what} {shown}: is a {_kind(st.st_mode)}, not a regular file; planc writes only a new "
                              f"file or over a regular file", code=Code.OUTPUT_NOT_FILE)
    for inp in inputs:
        if inp is not None and _same(real, inp):
            raise OutputError(f"{what} {shown}: is an input of this command ({printable(str(inp))}); planc never "
                              f"writes over what it reads", code=Code.OUTPUT_IS_INPUT)
    if st is not None and ours is not None and not ours(real):
        raise OutputError(f"{what} {shown}: holds a file planc did not write; remove it or give another path",
                          code=Code.OUTPUT_NOT_OURS)
    parent = real.parent
    if not parent.is_dir():
        raise OutputError(f"{what} {shown}: folder {printable(str(parent))} does not exist", code=Code.OUTPUT_PATH)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {shown}: folder {printable(str(parent))} is not writable", code=Code.OUTPUT_UNWRITABLE)
    return real


def write(path, data: bytes | str, what: str, *, inputs: Iterable = (),
          ours: Callable[[Path], bool] | None = None) -> Path:
    """Write `data` to the output `path` atomically, after `target`'s checks. Returns the file written."""
    inputs = tuple(inputs)
    real = target(path, what, inputs=inputs, ours=ours)
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        old = os.stat(real)
        mode = stat.S_IMODE(old.st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    except OSError:
        mode = 0o644
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".partial", dir=real.parent)
    except OSError as e:
        raise OutputError(f"{what} {printable(str(path))}: cannot write ({e.strerror or e})",
                          code=Code.OUTPUT_UNWRITABLE) from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), mode)
            target(path, what, inputs=inputs, ours=ours)  # nothing else took the path meanwhile
            os.replace(tmp, real)
        except OSError as e:  # a full disk, a file size limit, a file system gone read-only
            raise OutputError(f"{what} {printable(str(path))}: cannot write ({e.strerror or e}); the old file, "
                              f"if any, is unchanged", code=Code.OUTPUT_UNWRITABLE) from None
    except BaseException:
        _remove(tmp)
        raise
    return real


@contextmanager
def partial(final: Path):
    """A file written under a hidden name beside `final` (`.NAME.partial`, yielded) and renamed onto
    `final` when the block ends; an error in the block (a full disk, an interrupt) or in the rename
    removes the partial file before it leaves, so a failed write leaves nothing of its own behind."""
    final = Path(final)
    tmp = final.parent / f".{final.name}.partial"
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path) -> None:
    """Remove a partial file of planc's own, if it is there (an error is on its way out already)."""
    try:
        os.unlink(path)
    except OSError:
        pass

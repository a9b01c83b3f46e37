"""The process's own memory figures from /proc/self/status (VmRSS, VmHWM), as every loader of
bench/loaders.py and the reference pipeline report them: imports nothing a loader does not."""

from __future__ import annotations

from pathlib import Path


def status(key: str) -> int:
    """Bytes of `key` (a `kB` line of /proc/self/status, e.g. VmRSS); 0 where it is absent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

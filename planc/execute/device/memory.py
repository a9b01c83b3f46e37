"""Host memory as the process and the machine see it: live room, the process's RSS and high-water mark.

Live room = min(MemAvailable, cgroup limit - cgroup usage net of reclaimable file cache) - reserve.
`ru_maxrss` is inherited across fork and exec on Linux; the high-water mark is read from
/proc/self/status (VmHWM), and can be reset between loads through /proc/self/clear_refs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from ...base.codes import Code


def reserve_bytes() -> int:
    """The current settings' host reserve (a bad PLANC_HOST_RESERVE: SpecError `bad-env`, exit 2)."""
    from ...base.settings import SettingError, host_reserve_bytes

    try:
        return host_reserve_bytes()
    except SettingError as e:
        from ...base.errors import SpecError

        raise SpecError(str(e), code=Code.BAD_ENV) from None


@dataclass(frozen=True)
class LiveRoom:
    """Host memory a load may still take now: `room_bytes` = min(available, cgroup room) - reserve
    (None: not known on this machine)."""

    available_bytes: int | None
    cgroup_room_bytes: int | None
    reserve_bytes: int
    room_bytes: int

    def terms(self) -> str:
        """What the room is made of, for a refusal's message."""
        from ...base.units import fmt_bytes

        def shown(n):
            return "unknown" if n is None else f"{n:,} bytes ({fmt_bytes(n)})"

        cg = "no cgroup limit" if self.cgroup_room_bytes is None else f"cgroup room {shown(self.cgroup_room_bytes)}"
        return (f"available {shown(self.available_bytes)}, {cg}, less the reserve {shown(self.reserve_bytes)} "
                f"(host_reserve, PLANC_HOST_RESERVE)")

    def hint(self, need: int, otherwise: str) -> str:
        """`otherwise`, unless the reserve alone holds back room `need` would fit in: then the reserve."""
        free = [n for n in (self.available_bytes, self.cgroup_room_bytes) if n is not None]
        if self.reserve_bytes and free and need <= min(free):
            return "lower the reserve (host_reserve, PLANC_HOST_RESERVE) or free memory"
        return otherwise


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _read_int(p: Path) -> int | None:
    try:
        s = p.read_text().strip()
    except OSError:
        return None
    if s == "max":
        return None
    try:
        return int(s)
    except ValueError:
        return None


def _cgroup_dir() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[0] == "0":
                d = Path("/sys/fs/cgroup") / parts[2].lstrip("/")
                return d if d.exists() else Path("/sys/fs/cgroup")
    except OSError:
        return None
    return None


def cgroup_room() -> int | None:
    """Bytes left under the cgroup's memory limit (v2, then v1), or None when unlimited."""
    d = _cgroup_dir()
    if d is not None:
        limit = _read_int(d / "memory.max")
        usage = _read_int(d / "memory.current")
        if limit is not None and usage is not None:
            return limit - usage + _inactive_file(d / "memory.stat")
    v1 = Path("/sys/fs/cgroup/memory")
    limit = _read_int(v1 / "memory.limit_in_bytes")
    usage = _read_int(v1 / "memory.usage_in_bytes")
    if limit is not None and usage is not None and limit < 2**60:
        return limit - usage + _inactive_file(v1 / "memory.stat", "total_inactive_file")
    return None


def _inactive_file(p: Path, key: str = "inactive_file") -> int:
    try:
        for line in p.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def live_room(reserve: int | None = None, run: int | None = None) -> LiveRoom:
    """The live room now, keeping `reserve` bytes free (default: the current settings' host_reserve).
    `run`: the run about to start that asks (None: the whole plan's admission)."""
    avail = _meminfo("MemAvailable")
    cg = cgroup_room()
    candidates = [x for x in (avail, cg) if x is not None]
    raw = min(candidates) if candidates else 2**62
    res = reserve_bytes() if reserve is None else reserve
    return LiveRoom(avail, cg, res, max(0, raw - res))


def _status(key: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    return _status("VmRSS")


def hwm_bytes() -> int:
    return _status("VmHWM")


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False

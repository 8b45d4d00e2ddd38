"""Small /proc readers shared by the soak, the benchmarks and the tests (Linux only)."""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, ...), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def is_gone(pid: int) -> bool:
    """True when the process no longer exists or is only a zombie."""
    fields = stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def children(pid: int, zombies: bool = False) -> list[int]:
    """Direct children of ``pid`` (zombies only when asked)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields and int(fields[1]) == pid and (zombies or fields[0] != "Z"):
                out.append(int(entry))
    return out


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def zygote_of(server_pid: int) -> int:
    """The sandbox zygote started by the server process ``server_pid`` (directly, or through bubblewrap)."""
    for pid in children(server_pid):
        line = cmdline(pid)
        if b"sandbox.guest.zygote" in line:
            if line.split(b"\0", 1)[0].endswith(b"bwrap"):  # the jail: the zygote is bwrap's child
                return next(child for child in children(pid) if b"sandbox.guest.zygote" in cmdline(child))
            return pid
    raise LookupError(f"process {server_pid} has no sandbox zygote")


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup in bytes (Rss, Pss, Private_Clean, Private_Dirty, ...)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out

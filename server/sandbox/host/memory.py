"""What a worker's memory is, as the watchdog counts it: a memory cgroup per worker slot, or the process's own maps.

Why (issue 53): the watchdog read ``/proc/<pid>/statm``, resident minus shared, so memory a worker held as shared
memory was never counted. On a 1,500 MiB budget a red team's escaped worker was killed at 1.6 GiB of private memory and
kept 1.6 GiB of ``MAP_SHARED`` anonymous memory; SysV segments it made and detached were in no process's maps at all.

* **A memory cgroup per slot** (preferred; v2 where the host delegates the controller, else v1, as on this machine):
  the pool's group holds one ``slot-N`` child, which a worker joins right after fork, like its pids group. The kernel
  charges to it every page the worker brings in: private and shared anonymous memory, tmpfs and SysV segments,
  whether mapped or not. The watchdog reads ``anon``/``rss`` plus ``shmem`` from the slot's ``memory.stat`` (page
  cache is left out: it is reclaimable, and a slot's stale cache from an earlier worker is not this worker's).
* **Fallback** (no memory controller): ``Pss_Anon`` plus ``Pss_Shmem`` from ``/proc/<pid>/smaps_rollup``. Shared
  anonymous memory counts; the sealed model file, which every worker on an instance maps, counts once across them
  (proportional share). What no process maps is not seen here, which is why seccomp refuses SysV IPC and Landlock
  refuses files in ``/dev/shm`` wherever the jail is not there.

Memory limits are not set: the watchdog kills the largest worker past the pool's budget and says why; a hard limit
would have the kernel kill it with no reason the session could read.
"""

from __future__ import annotations

import contextlib
import itertools
import os

from .jail import _remove_tree, cgroup_candidates, remove_stale

_NUMBERS = itertools.count()
STAT_KEYS = {1: ("rss", "shmem"), 2: ("anon", "shmem")}


class MemoryCgroup:
    """The pool's memory cgroup: ``root`` on the host, one ``slot-N`` child per worker slot."""

    def __init__(self, root: str, version: int):
        self.root, self.version = root, version
        self.prepared: set[int] = set()

    @classmethod
    def create(cls) -> tuple[MemoryCgroup | None, str]:
        """A fresh group under this process's own group of the memory controller, or (None, why not)."""
        reasons = []
        for version, base in cls._candidates():
            remove_stale(base)
            path = os.path.join(base, f"mechsandbox-{os.getpid()}-mem{next(_NUMBERS)}")
            try:
                if version == 2:
                    with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                        f.write("+memory")
                os.makedirs(path, exist_ok=True)
                if version == 2:
                    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
                        f.write("+memory")
                return cls(path, version), f"cgroup v{version}"
            except OSError as exc:
                reasons.append(f"cgroup v{version} at {base}: {exc.strerror or exc}")
        return None, "; ".join(reasons) or "no memory cgroup controller is mounted"

    @staticmethod
    def _candidates() -> list[tuple[int, str]]:
        return [(version, folder) for version, folder, _ in cgroup_candidates("memory")]

    def prepare_slot(self, slot: int) -> None:
        if slot not in self.prepared:
            os.makedirs(os.path.join(self.root, f"slot-{slot}"), exist_ok=True)
            self.prepared.add(slot)

    def usage(self, slot: int) -> int | None:
        """Anonymous (private and shared) and tmpfs/SysV memory charged to the slot, in bytes; None if unreadable."""
        wanted = STAT_KEYS[self.version]
        try:
            with open(os.path.join(self.root, f"slot-{slot}", "memory.stat")) as f:
                stat = dict(line.split() for line in f if line.count(" ") == 1)
            return sum(int(stat[key]) for key in wanted)
        except (OSError, KeyError, ValueError):
            return None

    def remove(self, wait: float = 0.5) -> None:
        _remove_tree(self.root, wait)


def mapped_memory(pid: int) -> int:
    """The fallback count: a proportional share of anonymous and of shared memory (``smaps_rollup``'s ``Pss_Anon`` and
    ``Pss_Shmem``), in bytes; ``Anonymous`` where the kernel has no ``Pss_Anon`` (before 5.x).

    Why proportional: a worker forked from the zygote shares the zygote's heap copy-on-write (about 210 MiB here), and
    ``Anonymous`` counts all of it in every worker (217 MiB per idle worker against 10 MiB of its own), so the watchdog
    killed idle workers past about 95 live episodes (bench/capacity.py); the proportional shares add up to the memory
    actually in use."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Anonymous", "Pss_Anon", "Pss_Shmem"):
                fields[name] = int(rest.split()[0])
    anonymous = fields.get("Pss_Anon", fields.get("Anonymous", 0))
    return (anonymous + fields.get("Pss_Shmem", 0)) * 1024


def worker_memory(cgroup: MemoryCgroup | None, slot: int, pid: int, isolation: dict[str, str]) -> int:
    """What the watchdog counts for one worker: its slot's cgroup when the worker joined it, else its maps."""
    if cgroup is not None and isolation.get("memory_cgroup") == "active":
        used = cgroup.usage(slot)
        if used is not None:
            return used
    return mapped_memory(pid)

"""An LRU cache of generated instances and their sandbox payloads, keyed by (family, seed, level).

Why: generating a transformer instance costs 0.2-1.7 s (rejection sampling, ablation checks) while a
reset from the warm pool costs milliseconds, so repeated resets of the same instance (RL loops, eval
reruns) must not regenerate. The cache lives in the server process (it holds the truth); only the
payload ever goes to a worker. Concurrent misses on the same key generate once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..tasks import Instance, get_family
from .sandbox.payload import ModelPayload


@dataclass(frozen=True)
class CachedInstance:
    instance: Instance
    payload: ModelPayload

    @classmethod
    def build(cls, task_id: str, seed: int, level: str) -> CachedInstance:
        """Generate the instance and its sandbox payload (what a miss and the prefetcher both do)."""
        instance = get_family(task_id).generate(seed, level)
        return cls(instance, ModelPayload.from_instance(instance))  # sealed: a reset passes a descriptor


class InstanceCache:
    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._items: OrderedDict[tuple[str, int, str], CachedInstance] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, int, str], threading.Lock] = {}
        self.hits = self.misses = 0

    def get(self, task_id: str, seed: int, level: str) -> CachedInstance:
        family = get_family(task_id)
        key = (family.id, seed, level)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._items:
                    self.hits += 1
                    return self._items[key]
            item = CachedInstance.build(family.id, seed, level)
            with self._lock:  # kept and the key's lock dropped at once: a later miss finds one or the other
                self.misses += 1
                self._keep(item)
                self._key_locks.pop(key, None)
            return item

    def put(self, item: CachedInstance) -> None:
        """Keep an instance generated elsewhere (the prefetcher's), as the most recently used."""
        with self._lock:
            self._keep(item)

    def peek(self, task_id: str, seed: int, level: str) -> CachedInstance | None:
        """The kept instance, if any (never generates; does not count as a use)."""
        with self._lock:
            return self._items.get((get_family(task_id).id, seed, level))

    def _keep(self, item: CachedInstance) -> None:
        inst = item.instance
        key = (inst.task_id, inst.seed, inst.level)
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > self.maxsize:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

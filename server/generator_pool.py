"""Cache misses generated in child processes, so that an on-demand generation never holds the server's interpreter.

Why: a reset that misses the instance cache (a named train seed, a test instance's first reset, a seedless reset
whose pool is empty) generates its instance before it can answer: up to seconds for the transformer families,
mostly Python around small torch calls. In a request thread of the server that work holds the GIL for up to 5 ms at
a time (Python's switch interval) against every other session's requests, and two misses at once share one
interpreter instead of two cores. Here each miss goes to an idle child of its own (``generator_process.py``: the
same ``generate`` with the server's torch thread count, so the instance is the in-process one bit for bit;
tests/test_generator_pool.py compares them), and the reset thread only waits on a pipe.

The children cost memory (each imports torch and the families: about 200 MiB of its own) and a few seconds of CPU
to start, so none starts until a generation in the server took ``SLOW_S`` or more (a server that only ever serves
the small families never starts one), and then one more each time a miss finds every child busy, up to ``size``.
While a child is starting, or when all are busy, the server's interpreter generates, as it did before: a miss never
waits for a child. A child that dies mid-generation costs that reset an in-process generation and one log line;
after ``MAX_DEATHS`` deaths no child starts again (one more line) and every miss generates in the server.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .generator_process import GeneratorProcess
from .instance_cache import CachedInstance
from .prefetch import Build, BuilderGone

log = logging.getLogger("mechsandbox.server")

SLOW_S = 0.05  # a generation in the server this long starts the first child
MAX_DEATHS = 3  # children that ended unexpectedly before the pool stops starting them


class GeneratorPool:
    """A ``Build`` for the instance cache: an idle, ready child generates the instance, else the server does."""

    def __init__(self, size: int, threads: int | None = None, fallback: Build = CachedInstance.build):
        self.size, self.threads, self._fallback = size, threads, fallback
        self._lock = threading.Lock()
        self._idle: list[GeneratorProcess] = []  # started, not generating (ready or still importing)
        self._busy = 0  # children generating for a miss
        self._checking = 0  # children checked out by ``_take`` while it asks whether they are ready
        self._deaths = 0
        self._closed = False
        self.in_child = self.in_server = 0

    def __call__(self, task_id: str, seed: int, level: str) -> CachedInstance:
        child = self._take()
        if child is not None:
            try:
                item = child(task_id, seed, level)
            except BuilderGone as exc:
                with self._lock:
                    self._busy -= 1
                self._lost(child, str(exc))
            except BaseException:
                self._put(child)  # the generation itself failed: the child is fine
                raise
            else:
                self._put(child)
                with self._lock:
                    self.in_child += 1
                return item
        started = time.monotonic()
        item = self._fallback(task_id, seed, level)
        with self._lock:
            self.in_server += 1
        if time.monotonic() - started >= SLOW_S:
            self._grow(all_busy=False)
        return item

    def _take(self) -> GeneratorProcess | None:
        """An idle child that is ready, checked out as busy (one that died while idle is dropped); None if there is
        none. The idle children are checked out before ``ready()`` is asked, so that no two misses ever wait on one
        child's lock; those not chosen go back."""
        with self._lock:
            candidates, self._idle = self._idle, []
            self._checking += len(candidates)
        chosen = None
        for child in candidates:
            if chosen is None:
                try:
                    ready = child.ready()
                except BuilderGone as exc:
                    with self._lock:
                        self._checking -= 1
                    self._lost(child, str(exc))
                    continue
                if ready:
                    chosen = child
                    with self._lock:
                        self._checking -= 1
                        self._busy += 1
                    continue
            self._put(child, checking=True)
        if chosen is None:
            self._grow(all_busy=True)
        return chosen

    def _grow(self, all_busy: bool) -> None:
        """Start a child if there is room: the first one after a slow generation in the server, another when a miss
        finds every child generating (``all_busy``)."""
        with self._lock:
            started = len(self._idle) + self._busy + self._checking
            if self._closed or self._deaths >= MAX_DEATHS or started >= self.size:
                return
            if (started == 0 or self._idle or self._checking) if all_busy else started > 0:
                return
            child = GeneratorProcess(self.threads)
            self._idle.append(child)
        child.start()

    def _put(self, child: GeneratorProcess, checking: bool = False) -> None:
        """A child checked out by ``_take`` (to generate, or ``checking`` whether it is ready) is idle again; closed
        instead once the pool is."""
        with self._lock:
            if checking:
                self._checking -= 1
            else:
                self._busy -= 1
            closed = self._closed
            if not closed:
                self._idle.append(child)
        if closed:
            child.close()  # outside the lock: it waits for the child to exit

    def _lost(self, child: GeneratorProcess, why: str) -> None:
        """A child that ended unexpectedly: dropped, counted and logged (the caller generates in the server). The
        child is no longer in ``_idle`` nor counted as busy or checking."""
        with self._lock:
            self._deaths += 1
            last = self._deaths == MAX_DEATHS
        child.close()
        log.error("instance generation: %s; this instance is generated in the server process", why)
        if last:
            log.error("instance generation: %d generator processes ended unexpectedly; none starts again, every cache "
                      "miss is generated in the server process", MAX_DEATHS)  # fmt: skip

    def status(self) -> dict[str, Any]:
        """For /health: children started and generating, and where the misses were generated."""
        with self._lock:
            return {"processes": len(self._idle) + self._busy + self._checking, "busy": self._busy, "of": self.size,
                    "in_child": self.in_child, "in_server": self.in_server, "ended": self._deaths}  # fmt: skip

    def close(self) -> None:
        """End every idle child now and each busy one once its generation is handed back (``_put``); none starts
        again."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.close()

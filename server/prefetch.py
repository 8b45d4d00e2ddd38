"""Instances generated ahead of demand (issue 20): seedless train resets served from a ready pool, and the test
split's standard set generated at startup when the operator asks.

Why: an RL loop resets with a fresh server-chosen seed almost every episode, and generating a transformer instance
costs up to seconds (committee-circuit hard about 4 s on one core) where the step costs a millisecond. So for every
(task, level) that has had a seedless reset (or that the operator lists), one background thread keeps up to
``prefetch_depth`` instances of fresh random seeds ready, ``prefetch_total`` in all (memory: a transformer with its
payload is about 1.5 MiB), and a seedless reset takes one without waiting. The instance is exactly the on-demand
one for its seed (the same ``generate``; tests/test_prefetch.py compares bytes and truth), and the episode's
``instance_id`` names the seed, so nothing about an episode depends on whether it was prefetched.

The thread generates one instance at a time and then rests in proportion (``prefetch_cpu_share``: at 0.5 it
rests as long as it generated), so stepping sessions keep most of the time; a wanted pair with nothing ready comes
before the test split's pre-warm. A generation that fails is logged once
with the pair, and that pair's seedless resets generate on demand from then on; if the thread itself ends, or the
generator process it uses (``generator_process.py``, the default) dies, every pair does. Nothing here holds a lock while
generating.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .instance_cache import CachedInstance
from .splits import TRAIN_SEED_LIMIT

log = logging.getLogger("mechsandbox.server")

Pair = tuple[str, str]  # (family id, level)
Build = Callable[[str, int, str], CachedInstance]


class BuilderGone(Exception):
    """The build function itself is gone (the generator process died): the prefetcher stops, not just one pair."""


class Prefetcher:
    """Ready instances per (task, level), filled by one background thread; ``take`` never waits for it."""

    def __init__(self, depth: int, total: int, cpu_share: float, build: Build = CachedInstance.build,
                 seed: Callable[[], int] = lambda: secrets.randbelow(TRAIN_SEED_LIMIT)):  # fmt: skip
        self.depth, self.total, self.cpu_share = depth, total, cpu_share
        self._build, self._seed = build, seed
        self._ready: dict[Pair, deque[CachedInstance]] = {}  # pairs in the order they were first wanted
        self._failed: dict[Pair, str] = {}
        self._prewarm: deque[tuple[str, int, str, Callable[[CachedInstance], None]]] = deque()
        self._prewarm_done = self._prewarm_total = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._stop_reason = ""
        self._handed: weakref.WeakValueDictionary[int, CachedInstance] = weakref.WeakValueDictionary()
        self.generated = self.served = 0  # served: handed out by take and not handed back

    @property
    def enabled(self) -> bool:
        return self.depth > 0 and self.total > 0

    def start(self, pairs: Iterable[Pair] = ()) -> Prefetcher:
        """Start the thread, with ``pairs`` wanted from the start (the operator's ``prefetch_pairs``)."""
        with self._cond:
            for pair in pairs:
                self._ready.setdefault(pair, deque())
        if self.enabled or self._prewarm:
            self._thread = threading.Thread(target=self._run, name="instance-prefetch", daemon=True)
            self._thread.start()
        return self

    def prewarm(self, jobs: Iterable[tuple[str, int, str]], keep: Callable[[CachedInstance], None]) -> None:
        """Generate these (task, seed, level) instances first and hand each to ``keep`` (the instance cache)."""
        with self._cond:
            for task_id, seed, level in jobs:
                self._prewarm.append((task_id, seed, level, keep))
                self._prewarm_total += 1
            self._cond.notify()

    def take(self, task_id: str, level: str) -> CachedInstance | None:
        """A ready instance of a fresh seed for a seedless train reset, or None (then the caller generates on
        demand); either way the pair is wanted from now on, so the thread fills it."""
        if not self.enabled:
            return None
        pair = (task_id, level)
        with self._cond:
            if self._stopped or pair in self._failed:
                return None
            ready = self._ready.setdefault(pair, deque())
            item = ready.popleft() if ready else None
            if item is not None:
                self.served += 1
                self._handed[id(item)] = item
            self._cond.notify()
            return item

    def status(self) -> dict[str, Any]:
        """For /health: what is ready, what was generated and served, what failed, the pre-warm's progress."""
        with self._cond:
            report: dict[str, Any] = {
                "enabled": self.enabled and not self._stopped,
                "depth": self.depth,
                "ready": {f"{t}/{lvl}": len(q) for (t, lvl), q in self._ready.items()},
                "generated": self.generated,
                "served": self.served,
                "failed": {f"{t}/{lvl}": why for (t, lvl), why in self._failed.items()},
            }
            if self._prewarm_total:
                report["test_prewarm"] = {"done": self._prewarm_done, "of": self._prewarm_total}
            if self._stop_reason:
                report["stopped"] = self._stop_reason
            return report

    def give_back(self, item: CachedInstance | None) -> None:
        """An instance ``take`` handed out for a reset that was then refused: served next, if it still fits."""
        if item is None or not self.enabled:
            return
        pair = (item.instance.task_id, item.instance.level)
        with self._cond:
            if self._handed.get(id(item)) is item:  # one of ours (else an on-demand one the reset generated)
                del self._handed[id(item)]
                self.served -= 1
            ready = self._ready.get(pair)
            if ready is not None and self._has_room(ready):
                ready.appendleft(item)

    def _has_room(self, ready: deque) -> bool:
        """Whether one more instance fits this pair's queue and the pools' total (call under ``_cond``)."""
        return len(ready) < self.depth and sum(map(len, self._ready.values())) < self.total

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop the thread (after the instance it is generating, waiting up to ``wait_s`` for it)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if wait_s and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
        close = getattr(self._build, "close", None)
        if callable(close):  # a generator process
            close()

    # -- the thread ----------------------------------------------------------------------------------------------
    def _next_job(self) -> tuple[str, int, str, Callable[[CachedInstance], None] | None] | None:
        """Called with the lock held: a wanted pair with nothing ready first (resets are waiting on those), then a
        pre-warm job, then the wanted pair with the fewest ready."""
        open_pairs = []
        if self.enabled and sum(len(q) for q in self._ready.values()) < self.total:
            open_pairs = [p for p, q in self._ready.items() if len(q) < self.depth and p not in self._failed]
        empty = [p for p in open_pairs if not self._ready[p]]
        if not empty and self._prewarm:
            return self._prewarm.popleft()
        if not open_pairs:
            return None
        task_id, level = (empty or sorted(open_pairs, key=lambda p: len(self._ready[p])))[0]
        return task_id, self._seed(), level, None

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    job = self._next_job()
                    while job is None and not self._stopped:
                        self._cond.wait()
                        job = self._next_job()
                    if self._stopped:
                        return
                assert job is not None
                self._generate(*job)
        except BaseException as exc:  # a bug here must not leave take() waiting on a thread that is gone
            with self._cond:
                self._stopped = True
                self._stop_reason = f"{type(exc).__name__}: {exc}"
            log.error("instance prefetch stopped (%s); every seedless reset generates on demand", self._stop_reason)

    def _generate(self, task_id: str, seed: int, level: str, keep: Callable[[CachedInstance], None] | None) -> None:
        started = time.monotonic()
        try:
            item = self._build(task_id, seed, level)
        except BuilderGone:
            raise  # _run stops the prefetcher with one log line
        except Exception as exc:
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            with self._cond:
                if keep is None:
                    self._failed[(task_id, level)] = why
                else:
                    self._prewarm_done += 1
            if keep is None:  # a train seed is public (instance_id names it); a test seed never leaves the server
                log.error("instance prefetch: generating %s %s seed %d failed (%s); its seedless resets generate on "
                          "demand", task_id, level, seed, why)  # fmt: skip
            else:
                log.error("test-split pre-warm: generating a %s %s instance failed (%s); it is generated when "
                          "reset", task_id, level, why)  # fmt: skip
            self._rest(time.monotonic() - started)
            return
        spent = time.monotonic() - started
        with self._cond:
            self.generated += 1
            if keep is None:
                ready = self._ready[(task_id, level)]
                if self._has_room(ready):  # a refused reset may have handed one back while this one was generated
                    ready.append(item)
            else:
                self._prewarm_done += 1
                done, total = self._prewarm_done, self._prewarm_total
        if keep is not None:
            keep(item)
            if done == total or done % 10 == 0:
                log.info("test-split pre-warm: %d of %d instances generated", done, total)
        self._rest(spent)

    def _rest(self, spent: float) -> None:
        """Sleep in proportion to the work just done (a duty cycle of ``cpu_share``), so stepping sessions keep the
        rest of the time. Wall-clock, not CPU: one generation may use several cores if torch's intra-op threads
        are free, and it shares the GIL with the request threads."""
        if self.cpu_share < 1:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped, timeout=spent * (1 - self.cpu_share) / self.cpu_share)

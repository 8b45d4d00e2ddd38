"""Cache misses in the server's interpreter or in generator processes (issue 20, ``MECHSANDBOX_GENERATORS``): what a
generation on the reset path costs the other sessions, and how many misses two resets at once get through.

    OMP_NUM_THREADS=1 python bench/generators.py [--task committee-circuit/hard] [--misses 8]
        [--steps-task dead-neurons/easy]

For ``MECHSANDBOX_GENERATORS`` = 0 and then 2 (a local server each, nothing generated ahead, 8 warm sandbox workers):

1. beside misses: one session steps ``print(1)`` as fast as it can (a light family, HTTP) while another thread
   resets ``--misses`` fresh named seeds of ``--task`` one after the other -> the step's p50 / p95 / max ms while
   they generate, and each miss's reset time;
2. two at once: two threads each reset ``--misses`` fresh named seeds of ``--task`` -> misses per second.

Before either phase the generator processes are started and ready (misses of a small transformer until
``/health`` says the children generated some), so the figures are the steady state, not the children's start.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time

import httpx
from mechsandbox.evaluation.local_server import LocalServer

SEEDS = itertools.count(700_000)  # fresh named seeds: every reset below is a cache miss


def reset(http: httpx.Client, task: str, seed: int | None = None) -> tuple[float, dict]:
    task_id, level = task.split("/")
    started = time.perf_counter()
    params = {"task_id": task_id, "level": level, "seed": next(SEEDS) if seed is None else seed}
    reply = http.post("/reset", json=params)
    reply.raise_for_status()
    return (time.perf_counter() - started) * 1000, reply.json()


def warm_children(http: httpx.Client, generators: int) -> None:
    if not generators:
        return
    deadline = time.monotonic() + 120
    while http.get("/health").json()["generators"]["in_child"] < 4:
        assert time.monotonic() < deadline, "the generator processes never became ready"
        threads = [threading.Thread(target=reset, args=(http, "induction-circuit/easy")) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def beside_misses(http: httpx.Client, task: str, steps_task: str, misses: int) -> tuple[list[float], list[float]]:
    _, episode = reset(http, steps_task, seed=1)
    eid = episode["episode_id"]
    step_ms: list[float] = []
    miss_ms: list[float] = []
    done = threading.Event()

    def miss() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=600) as other:
            for _ in range(misses):
                miss_ms.append(reset(other, task)[0])
        done.set()

    missing = threading.Thread(target=miss)
    missing.start()
    while not done.is_set():
        started = time.perf_counter()
        reply = http.post("/step", json={"episode_id": eid, "action": {"python_code": "print(1)"}})
        reply.raise_for_status()
        step_ms.append((time.perf_counter() - started) * 1000)
        if reply.json()["done"]:
            eid = reset(http, steps_task, seed=1)[1]["episode_id"]
    missing.join()
    return step_ms, miss_ms


def two_at_once(url: str, task: str, misses: int) -> float:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            for _ in range(misses):
                reset(http, task)

    threads = [threading.Thread(target=run) for _ in range(2)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * misses / (time.perf_counter() - started)


def spread(ms: list[float]) -> str:
    ordered = sorted(ms)
    return f"{statistics.median(ordered):7.1f} / {ordered[round(0.95 * (len(ordered) - 1))]:7.1f} / {ordered[-1]:7.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="committee-circuit/hard", help="task/level of the misses")
    ap.add_argument("--misses", type=int, default=8)
    ap.add_argument("--steps-task", default="dead-neurons/easy", help="task/level of the stepping session")
    args = ap.parse_args()
    print(f"misses: fresh named seeds of {args.task}; stepping: print(1) in {args.steps_task}")
    print(f"{'generators':>10} | {'steps beside: p50 / p95 / max ms':>34} {'n':>6} | {'miss reset p50 ms':>17} | "
          f"{'two at once: misses/s':>21} | children generated / server")  # fmt: skip
    for generators in (0, 2):
        env = {"MECHSANDBOX_GENERATORS": str(generators), "MECHSANDBOX_PREFETCH_DEPTH": "0",
               "MECHSANDBOX_POOL_SIZE": "8", "MECHSANDBOX_TRAIN_MAX_STEPS": "1000",
               "MECHSANDBOX_CACHE_SIZE": "8"}  # fmt: skip
        with LocalServer(env=env) as server, httpx.Client(base_url=server.url, timeout=600) as http:
            warm_children(http, generators)
            steps, misses = beside_misses(http, args.task, args.steps_task, args.misses)
            rate = two_at_once(server.url, args.task, args.misses)
            status = http.get("/health").json()["generators"]
        print(f"{generators:>10} | {spread(steps):>34} {len(steps):>6} | {statistics.median(misses):17.0f} | "
              f"{rate:21.2f} | {status['in_child']} / {status['in_server']}")  # fmt: skip


if __name__ == "__main__":
    main()

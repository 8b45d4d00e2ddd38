"""The results database under load: what recording a counted attempt costs, and how long the leaderboard takes.

    python bench/results_db.py [--runs 50] [--threads 8] [--postgres URL]

For each back end (SQLite in a temporary folder; PostgreSQL when ``--postgres`` names one, e.g. a server started
as tests/postgres_harness.py does), it registers ``--runs`` runs and plays the standard set of each (12 families x
3 levels x 20 instances = 720 attempts a run) from ``--threads`` threads: one ``claim`` (at reset) and one
``finish`` (at the end, with a 12-step trajectory of 4 KB outputs) per attempt, then a second claim of every
instance of one run (all refused). Prints attempts per second, the median and 99th-percentile latency of claim and
finish, and the time to compute the leaderboard over everything.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mechsandbox.results import ResultStore, leaderboard

FAMILIES = [f"family-{i}" for i in range(12)]
LEVELS = ("easy", "medium", "hard")
STANDARD = 20


def trajectory() -> list[dict]:
    return [{"step": i, "action": {"python_code": "x" * 400}, "output": "y" * 4000, "reward": 0.01, "error": None}
            for i in range(12)]  # fmt: skip


def play_run(store: ResultStore, run_id: str, timings: dict[str, list[float]]) -> None:
    steps = trajectory()
    for family in FAMILIES:
        for level in LEVELS:
            for index in range(STANDARD):
                started = time.perf_counter()
                attempt = store.claim(run_id, family, "1", level, index, f"test-{family}-{level}-{index}")
                claimed = time.perf_counter()
                assert attempt is not None
                store.finish(attempt, "graded", 0.5, 12, 30.0, steps)
                timings["claim"].append(claimed - started)
                timings["finish"].append(time.perf_counter() - claimed)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench(name: str, url: str, runs: int, threads: int) -> None:
    store = ResultStore(url).open()
    try:
        ids = [store.register_run(f"agent-{i}", "", "", f"addr:{i}", "fp", "0.1.0", STANDARD)[0].run_id
               for i in range(runs)]  # fmt: skip
        timings: dict[str, list[float]] = {"claim": [], "finish": []}
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda run_id: play_run(store, run_id, timings), ids))
        elapsed = time.perf_counter() - started
        attempts = len(timings["claim"])
        refused_started = time.perf_counter()
        refused = sum(store.claim(ids[0], f, "1", lv, k, f"test-{f}-{lv}-{k}") is None
                      for f in FAMILIES for lv in LEVELS for k in range(STANDARD))  # fmt: skip
        refused_s = time.perf_counter() - refused_started
        board_started = time.perf_counter()
        board = leaderboard(store.runs(), store.attempts(), dict.fromkeys(FAMILIES, "1"), LEVELS, "fp", "0.1.0")
        board_s = time.perf_counter() - board_started
        complete = sum(r["complete"] for r in board["runs"])
        print(f"{name}: {attempts} attempts ({runs} runs x 720) from {threads} threads in {elapsed:.1f} s = "
              f"{attempts / elapsed:.0f} attempts/s")  # fmt: skip
        for op in ("claim", "finish"):
            values = timings[op]
            print(f"  {op:6}: median {statistics.median(values) * 1e3:.2f} ms, "
                  f"p99 {percentile(values, 0.99) * 1e3:.2f} ms")  # fmt: skip
        print(f"  second claims refused: {refused}/720 in {refused_s * 1e3 / 720:.2f} ms each")
        print(f"  leaderboard over {attempts} attempts: {board_s:.2f} s ({complete} complete runs)")
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--postgres", help="a PostgreSQL URL to bench as well (its database is written to)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        bench("sqlite", f"sqlite:///{Path(folder) / 'results.sqlite'}", args.runs, args.threads)
    if args.postgres:
        bench("postgresql", args.postgres, args.runs, args.threads)


if __name__ == "__main__":
    main()

"""Seedless train resets with instances generated ahead (server/prefetch.py) against resets that generate.

    python bench/prefetch.py [--pairs committee-circuit/hard,induction-circuit/hard] [--resets 6]

Starts a local server whose prefetch fills the pairs from startup, times ``--resets`` resets per pair that name a
fresh seed (each generates on demand), waits until every pair's pool is full, then times as many seedless resets
(each should take a ready instance; the pool holds ``MECHSANDBOX_PREFETCH_DEPTH`` = 8, so six never drain it).
Each reset is a start_episode call over POST /mcp in a session of its own. Prints median, p95 and max milliseconds
per pair and how many seedless resets the pool served.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.integrations.mcp_client import SyncRpc

DEFAULT_PAIRS = "committee-circuit/hard,induction-circuit/hard,fact-storage/hard,copy-head/hard,dead-neurons/easy"


def timed_reset(rpc: SyncRpc, body: dict) -> float:
    """One start_episode over POST /mcp in a session of its own (opened and closed outside the timing)."""
    session = rpc("openenv/session/create", {})["session_id"]
    try:
        started = time.perf_counter()
        result = rpc("tools/call", {"name": "start_episode", "arguments": body, "session_id": session})
        spent = (time.perf_counter() - started) * 1000
        assert not result.get("isError"), result
        return spent
    finally:
        rpc("openenv/session/close", {"session_id": session})


def summary(ms: list[float]) -> str:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):8.0f} {p95:8.0f} {ordered[-1]:8.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default=DEFAULT_PAIRS)
    ap.add_argument("--resets", type=int, default=6)
    args = ap.parse_args()
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    env = {"MECHSANDBOX_PREFETCH_PAIRS": ",".join(pairs), "MECHSANDBOX_PREFETCH_TOTAL": str(8 * len(pairs))}
    with LocalServer(env=env) as server, httpx.Client(base_url=server.url, timeout=300) as http:
        rpc = SyncRpc(server.url, 300.0)
        cold = {}
        for n, pair in enumerate(pairs):
            task_id, level = pair.split("/")
            seeds = range(900_000 + 100 * n, 900_000 + 100 * n + args.resets)
            cold[pair] = [timed_reset(rpc, {"task_id": task_id, "level": level, "seed": s}) for s in seeds]
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            ready = http.get("/health").json()["prefetch"]["ready"]
            if all(ready.get(pair, 0) >= 8 for pair in pairs):
                break
            time.sleep(1)
        warm = {}
        for pair in pairs:
            task_id, level = pair.split("/")
            warm[pair] = [timed_reset(rpc, {"task_id": task_id, "level": level}) for _ in range(args.resets)]
        served = http.get("/health").json()["prefetch"]["served"]
    print(f"{args.resets} resets per pair; ms: median, p95, max; {served} seedless resets served from the pools")
    print(f"{'pair':28} {'generating (seed given)':>26} {'seedless, pool warm':>26}")
    for pair in pairs:
        print(f"{pair:28} {summary(cold[pair])} {summary(warm[pair])}")


if __name__ == "__main__":
    main()

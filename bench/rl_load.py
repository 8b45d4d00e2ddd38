"""Seedless train episodes at RL speed (issue 20): scripted episodes per second at concurrency 8 on fresh,
server-chosen seeds, with and without instances generated ahead, and seedless reset latency per (family, level)
while 8 sessions play.

    OMP_NUM_THREADS=1 python bench/rl_load.py [--pairs all] [--episodes 2] [--resets 4] [--concurrency 8]

Three phases, each on a local server of its own (every pair's pool may hold ``MECHSANDBOX_PREFETCH_DEPTH`` = 8):

1. prefetch off: ``--episodes`` scripted episodes (the reference solutions, 3-4 steps each) per pair, seedless
   resets, the pairs interleaved, ``--concurrency`` at a time -> episodes/s; every reset generates its instance.
2. prefetch on, every pair's pool full first: the same plan -> episodes/s (the pools refill behind it).
3. prefetch on, pools full: ``--concurrency`` sessions play scripted episodes in a loop (seedless resets) while
   this process times ``--resets`` seedless resets per pair, each a ``start_episode`` over POST /mcp in a session
   of its own -> median, p95, max ms, and how many of them the pools served.

Phase 1 against phase 2 is "before and after" for a trainer that draws a fresh instance per episode; the
generators' own speed is ``bench/generation.py``. One client process drives everything (its overhead is in every
figure). Waiting for the pools to fill takes a few minutes at the default CPU share (0.5).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx
from mechsandbox.agents import ScriptedAgent, play_episode
from mechsandbox.client import MechSandboxEnv
from mechsandbox.evaluation.harness import Plan, run_plan
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.integrations.mcp_client import SyncRpc
from mechsandbox.tasks import LEVELS, families

DEPTH = 8
POOL = 12  # warm sandbox workers (the default is 4): 8 players and the timed resets each take one per episode


def all_pairs() -> list[str]:
    return [f"{fam.id}/{level}" for fam in families() for level in LEVELS]


def server_env(pairs: list[str], prefetch: bool) -> dict[str, str]:
    env = {"MECHSANDBOX_SESSION_CAP": "64", "MECHSANDBOX_CLIENT_SHARE": "1", "MECHSANDBOX_CACHE_SIZE": "16",
           "MECHSANDBOX_POOL_SIZE": str(POOL)}
    if prefetch:
        env |= {"MECHSANDBOX_PREFETCH_PAIRS": ",".join(pairs), "MECHSANDBOX_PREFETCH_TOTAL": str(DEPTH * len(pairs))}
    else:
        env["MECHSANDBOX_PREFETCH_DEPTH"] = "0"
    return env


def seedless(pairs: list[str], rounds: int) -> list[dict]:
    """Seedless train resets, the pairs interleaved (round-robin), ``rounds`` per pair."""
    return [dict(zip(("task_id", "level"), pair.split("/"), strict=True)) | {"split": "train"}
            for _ in range(rounds) for pair in pairs]  # fmt: skip


def episodes_per_second(url: str, resets: list[dict], concurrency: int) -> tuple[float, int]:
    plan = Plan(tasks=[], levels=[], split="train")
    plan.resets = resets
    started = time.perf_counter()
    records = run_plan(plan, url, lambda i: ScriptedAgent(), concurrency=concurrency, progress=False)
    wall = time.perf_counter() - started
    failed = sum(1 for r in records if r.error or not r.steps or r.steps[-1].reward < 0.9)
    return len(records) / wall, failed


def wait_warm(url: str, pairs: list[str], limit_s: float = 3600) -> float:
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as http:
        while time.monotonic() - started < limit_s:
            ready = http.get("/health").json()["prefetch"]["ready"]
            if all(ready.get(pair, 0) >= DEPTH for pair in pairs):
                return time.monotonic() - started
            time.sleep(1)
    raise RuntimeError(f"the pools were not full after {limit_s:.0f} s")


def timed_reset(rpc: SyncRpc, task_id: str, level: str) -> float:
    """One seedless start_episode over POST /mcp in a session of its own (opened and closed outside the timing)."""
    session = rpc("openenv/session/create", {})["session_id"]
    try:
        started = time.perf_counter()
        result = rpc("tools/call", {"name": "start_episode", "arguments": {"task_id": task_id, "level": level},
                                    "session_id": session})  # fmt: skip
        spent = (time.perf_counter() - started) * 1000
        assert not result.get("isError"), result
        return spent
    finally:
        rpc("openenv/session/close", {"session_id": session})


warm: list[int] = []  # warm sandbox workers just before each timed reset
ready: list[int] = []  # ready instances of the reset's pair just before it


def loaded_resets(url: str, pairs: list[str], resets: int, concurrency: int) -> tuple[dict[str, list[float]], int]:
    """Time seedless resets per pair while ``concurrency`` sessions play scripted episodes (seedless too)."""
    stop = threading.Event()
    played = [0]
    plan = seedless(pairs, 1000)

    def player(k: int) -> None:
        i = k
        while not stop.is_set():
            with MechSandboxEnv(base_url=url, message_timeout_s=300).sync() as env:
                play_episode(ScriptedAgent(), env, plan[i % len(plan)])
            played[0] += 1
            i += concurrency

    threads = [threading.Thread(target=player, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(5)  # the players are mid-episode
    rpc = SyncRpc(url, 300.0)
    out: dict[str, list[float]] = {pair: [] for pair in pairs}
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(resets):
            for pair in pairs:
                health = http.get("/health").json()
                warm.append(health["workers"]["warm"])
                ready.append(health["prefetch"]["ready"].get(pair, 0))
                out[pair].append(timed_reset(rpc, *pair.split("/")))
    stop.set()
    for t in threads:
        t.join(timeout=300)
    return out, played[0]


def pct(ms: list[float], q: float) -> float:
    ordered = sorted(ms)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="all", help="all, or comma-separated task/level pairs")
    ap.add_argument("--episodes", type=int, default=2, help="scripted episodes per pair in phases 1 and 2")
    ap.add_argument("--resets", type=int, default=4, help="timed seedless resets per pair in phase 3")
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    pairs = all_pairs() if args.pairs == "all" else [p.strip() for p in args.pairs.split(",") if p.strip()]
    plan = seedless(pairs, args.episodes)
    with LocalServer(env=server_env(pairs, prefetch=False)) as server:
        before, failed_before = episodes_per_second(server.url, plan, args.concurrency)
    with LocalServer(env=server_env(pairs, prefetch=True)) as server:
        warm_s = wait_warm(server.url, pairs)
        after, failed_after = episodes_per_second(server.url, plan, args.concurrency)
        wait_warm(server.url, pairs)
        latencies, played = loaded_resets(server.url, pairs, args.resets, args.concurrency)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            served = http.get("/health").json()["prefetch"]["served"]
    print(f"{len(plan)} scripted episodes ({args.episodes} per pair, {len(pairs)} pairs), concurrency "
          f"{args.concurrency}, seedless train resets")  # fmt: skip
    print(f"  prefetch off (every reset generates): {before:6.2f} episodes/s ({failed_before} below 0.9)")
    print(f"  prefetch on, pools full first:        {after:6.2f} episodes/s ({failed_after} below 0.9); "
          f"the pools filled in {warm_s:.0f} s")  # fmt: skip
    every = [ms for values in latencies.values() for ms in values]
    print(f"\nseedless resets with {args.concurrency} sessions playing ({played} episodes meanwhile); "
          f"{served} resets served from the pools in all")  # fmt: skip
    print(f"just before a timed reset: warm sandbox workers median {statistics.median(warm):.0f} (0 in "
          f"{warm.count(0)} of {len(warm)}); its pair's ready instances median {statistics.median(ready):.0f} "
          f"(0 in {ready.count(0)})")  # fmt: skip
    print(f"{'pair':32} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    for pair, ms in latencies.items():
        print(f"{pair:32} {statistics.median(ms):10.0f} {pct(ms, 0.95):8.0f} {max(ms):8.0f}")
    print(f"{'every pair':32} {statistics.median(every):10.0f} {pct(every, 0.95):8.0f} {max(every):8.0f}")


if __name__ == "__main__":
    main()

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
   of its own -> median and max ms per pair (a p95 where a row has 20 samples: every pair together), and the warm
   sandbox workers and the pair's ready instances found just before each.

``--warm`` runs phase 3 alone in the setting issue 20's latency targets name, every timed reset finding its pool
warm: each pair's pool holds ``--resets`` (all filled first, at the default CPU share) and the players play one
cached seed per pair, so only the timed resets draw from the pools; with ``--resets 20`` each pair gets a p95.

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


def server_env(pairs: list[str], prefetch: bool, depth: int = DEPTH) -> dict[str, str]:
    env = {"MECHSANDBOX_SESSION_CAP": "64", "MECHSANDBOX_CLIENT_SHARE": "1", "MECHSANDBOX_CACHE_SIZE": "16",
           "MECHSANDBOX_POOL_SIZE": str(POOL)}  # fmt: skip
    if prefetch:
        env |= {"MECHSANDBOX_PREFETCH_PAIRS": ",".join(pairs), "MECHSANDBOX_PREFETCH_DEPTH": str(depth),
                "MECHSANDBOX_PREFETCH_TOTAL": str(depth * len(pairs))}  # fmt: skip
    else:
        env["MECHSANDBOX_PREFETCH_DEPTH"] = "0"
    return env


def warm_env(pairs: list[str], resets: int) -> dict[str, str]:
    """``--warm``: a pool of ``resets`` per pair (the default CPU share: its refill runs beside the timing as it would
    in training), and a cache that keeps the players' seeds beside the instances the timed resets take."""
    env = server_env(pairs, prefetch=True, depth=max(DEPTH, resets))
    return env | {"MECHSANDBOX_CACHE_SIZE": str(len(pairs) * (resets + 2))}


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
    failed = sum(1 for r in records if r.infra_error or r.error or (r.score or 0.0) < 0.9)
    return len(records) / wall, failed


def wait_warm(url: str, pairs: list[str], limit_s: float = 3600, depth: int = DEPTH) -> float:
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as http:
        while time.monotonic() - started < limit_s:
            ready = http.get("/health").json()["prefetch"]["ready"]
            if all(ready.get(pair, 0) >= depth for pair in pairs):
                return time.monotonic() - started
            time.sleep(1)
    raise RuntimeError(f"the pools were not full after {limit_s:.0f} s")


class Players:
    """``concurrency`` threads that play scripted episodes (seedless resets) until stopped; a failed episode is
    counted and the thread goes on, so the load stays at ``concurrency`` sessions."""

    def __init__(self, url: str, pairs: list[str], concurrency: int, seeded: bool = False):
        self.url, self.plan, self.concurrency = url, seedless(pairs, 1000), concurrency
        if seeded:  # one cached seed per pair: the players draw nothing from the pools
            self.plan = [reset | {"seed": 1} for reset in self.plan]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.played = self.failed = 0
        self.threads = [threading.Thread(target=self._play, args=(k,), daemon=True) for k in range(concurrency)]

    def _play(self, k: int) -> None:
        i = k
        while not self.stop.is_set():
            try:
                with MechSandboxEnv(base_url=self.url, message_timeout_s=300).sync() as env:
                    record = play_episode(ScriptedAgent(), env, self.plan[i % len(self.plan)])
                ok = not record.error
            except Exception:  # a bench: count it and keep the load on
                ok = False
            with self.lock:
                self.played += 1
                self.failed += not ok
            i += self.concurrency

    def __enter__(self) -> Players:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)


def loaded_resets(url: str, pairs: list[str], resets: int, concurrency: int, seeded: bool = False) -> dict:
    """Time seedless resets per pair while ``concurrency`` sessions play scripted episodes (seedless too). Before
    each timed reset (its session already open) the server's warm workers and the pair's ready instances are read
    from /health (whether the pool served that very reset cannot be told apart from the players' resets: a pair
    with instances ready just before is served unless a player took the last one in between)."""
    out: dict = {"ms": {pair: [] for pair in pairs}, "first": {pair: [] for pair in pairs}, "warm": [], "ready": []}
    rpc = SyncRpc(url, 300.0)
    with Players(url, pairs, concurrency, seeded) as players, httpx.Client(base_url=url, timeout=30) as http:
        time.sleep(5)  # the players are mid-episode
        for _ in range(resets):
            for pair in pairs:
                task_id, level = pair.split("/")
                session = rpc("openenv/session/create", {})["session_id"]
                try:
                    health = http.get("/health").json()
                    out["warm"].append(health["workers"]["warm"])
                    out["ready"].append(health["prefetch"]["ready"].get(pair, 0))
                    started = time.perf_counter()
                    result = rpc("tools/call", {"name": "start_episode", "session_id": session,
                                                "arguments": {"task_id": task_id, "level": level}})  # fmt: skip
                    out["ms"][pair].append((time.perf_counter() - started) * 1000)
                    assert not result.get("isError"), result
                    step = rpc("tools/call", {"name": "run_python", "session_id": session,
                                              "arguments": {"code": "print(1)"}})  # fmt: skip
                    out["first"][pair].append((time.perf_counter() - started) * 1000)  # reset + first step
                    assert not step.get("isError"), step
                finally:
                    rpc("openenv/session/close", {"session_id": session})
        out["played"], out["failed"] = players.played, players.failed
    return out


def spread(ms: list[float]) -> str:
    """Median and max; a p95 only where there are 20 samples or more (below that it would be the max)."""
    ordered = sorted(ms)
    p95 = f"{ordered[round(0.95 * (len(ordered) - 1))]:8.0f}" if len(ordered) >= 20 else f"{'-':>8}"
    return f"{statistics.median(ordered):10.0f} {p95} {ordered[-1]:8.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="all", help="all, or comma-separated task/level pairs")
    ap.add_argument("--episodes", type=int, default=2, help="scripted episodes per pair in phases 1 and 2")
    ap.add_argument("--resets", type=int, default=4, help="timed seedless resets per pair in phase 3 (>= 1)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--warm", action="store_true", help="phase 3 alone, every timed reset finding its pool warm")
    args = ap.parse_args()
    if args.resets < 1 or args.episodes < 1:
        ap.error("--resets and --episodes must be at least 1")
    pairs = all_pairs() if args.pairs == "all" else [p.strip() for p in args.pairs.split(",") if p.strip()]
    if args.warm:
        with LocalServer(env=warm_env(pairs, args.resets)) as server:
            warm_s = wait_warm(server.url, pairs, depth=max(DEPTH, args.resets))
            print(f"--warm: {len(pairs)} pools of {max(DEPTH, args.resets)} filled in {warm_s:.0f} s; the players on "
                  "one cached seed per pair")  # fmt: skip
            report_loaded(loaded_resets(server.url, pairs, args.resets, args.concurrency, seeded=True), args)
        return
    plan = seedless(pairs, args.episodes)
    with LocalServer(env=server_env(pairs, prefetch=False)) as server:
        before, failed_before = episodes_per_second(server.url, plan, args.concurrency)
    with LocalServer(env=server_env(pairs, prefetch=True)) as server:
        warm_s = wait_warm(server.url, pairs)
        after, failed_after = episodes_per_second(server.url, plan, args.concurrency)
        wait_warm(server.url, pairs)
        load = loaded_resets(server.url, pairs, args.resets, args.concurrency)
    print(f"{len(plan)} scripted episodes ({args.episodes} per pair, {len(pairs)} pairs), concurrency "
          f"{args.concurrency}, seedless train resets")  # fmt: skip
    print(f"  prefetch off (every reset generates): {before:6.2f} episodes/s ({failed_before} below 0.9)")
    print(f"  prefetch on, pools full first:        {after:6.2f} episodes/s ({failed_after} below 0.9); "
          f"the pools filled in {warm_s:.0f} s")  # fmt: skip
    report_loaded(load, args)


def report_loaded(load: dict, args: argparse.Namespace) -> None:
    timed = [ms for values in load["ms"].values() for ms in values]
    warm, ready = load["warm"], load["ready"]
    print(f"\n{len(timed)} seedless resets timed with {args.concurrency} sessions playing ({load['played']} episodes "
          f"meanwhile, {load['failed']} failed)")  # fmt: skip
    print(f"just before a timed reset: warm sandbox workers median {statistics.median(warm):.0f} (0 in "
          f"{warm.count(0)} of {len(warm)}); its pair's ready instances median {statistics.median(ready):.0f} "
          f"(0 in {ready.count(0)})")  # fmt: skip
    print("reset: start_episode alone; + first step: from the reset's request to the reply of a print(1) sent at once "
          "(the model loads behind the reset, so an agent that steps at once waits for it there)")
    print(f"{'pair':32} {'reset: median':>14} {'p95':>8} {'max':>8} {'+ first step: median':>21} {'p95':>8} {'max':>8}")
    for pair, ms in load["ms"].items():
        print(f"{pair:32} {spread(ms):>32} {spread(load['first'][pair]):>39}")
    first = [ms for values in load["first"].values() for ms in values]
    print(f"{'every pair':32} {spread(timed):>32} {spread(first):>39}")


if __name__ == "__main__":
    main()

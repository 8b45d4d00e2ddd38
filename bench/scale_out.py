"""Scripted train episodes per second through HAProxy with one replica and with two (issue 21).

    OMP_NUM_THREADS=1 python bench/scale_out.py [--episodes 48] [--concurrency 16] [--pairs dead-neurons/easy,...]

Each phase starts its own loopback cluster (``evaluation/cluster.py``: ``mechsandbox serve`` replicas behind
Debian's haproxy running ``mechsandbox lb-config``'s configuration, SQLite results per replica since train
episodes record nothing) and plays the same seeded episodes through the balancer. On one machine the replicas
share its cores, so the second replica adds processes, not CPU: see docs/DEPLOY.md.
"""

from __future__ import annotations

import argparse
import time

from mechsandbox.agents import ScriptedAgent
from mechsandbox.evaluation.cluster import LocalCluster
from mechsandbox.evaluation.harness import Plan, run_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--pairs", default="dead-neurons/easy,copy-head/easy,induction-circuit/easy")
    args = ap.parse_args()
    pairs = [p.split("/") for p in args.pairs.split(",")]
    plan = Plan(tasks=[], levels=[], split="train")
    plan.resets = [{"task_id": pairs[i % len(pairs)][0], "level": pairs[i % len(pairs)][1], "split": "train",
                    "seed": 1000 + i} for i in range(args.episodes)]  # fmt: skip
    env = {"MECHSANDBOX_CLIENT_SHARE": "1", "MECHSANDBOX_SESSION_CAP": "64", "MECHSANDBOX_PREFETCH_DEPTH": "0"}
    for replicas in (1, 2):
        with LocalCluster(replicas, env) as cluster:
            run_plan(plan, cluster.url, lambda i: ScriptedAgent(), concurrency=args.concurrency, progress=False)
            started = time.perf_counter()  # the second pass: instances cached on whichever replica played them
            records = run_plan(plan, cluster.url, lambda i: ScriptedAgent(), concurrency=args.concurrency,
                               progress=False)  # fmt: skip
            wall = time.perf_counter() - started
        failed = sum(1 for r in records if r.error)
        print(f"{replicas} replica(s): {len(records) / wall:6.2f} episodes/s ({len(records)} episodes, "
              f"concurrency {args.concurrency}, {failed} failed)")  # fmt: skip


if __name__ == "__main__":
    main()

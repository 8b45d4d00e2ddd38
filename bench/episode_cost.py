"""What one scripted episode costs per (family, level), and the episodes per second that bounds on this machine
(issue 20: episodes/s at concurrency 8 on fresh seeds, target 15).

    OMP_NUM_THREADS=1 python bench/episode_cost.py [--pairs all] [--repeats 3]

On a local server with nothing else running, each pair's scripted episode (the reference snippets, then
``solution_from="answer"``) is played ``--repeats`` times on one cached seed, one at a time, after an untimed first
play that generates the instance: wall ms per episode (median), steps, and the instance's generation time. One
episode at a time on an idle machine is nearly all CPU on one core (the snippets' forwards and ablation sweeps in
the worker, the server's handling, the client), so with ``cores`` cores and the pairs drawn evenly no concurrency
plays more than ``cores / mean episode s`` episodes per second, and on fresh seeds every episode also needs a
generation: ``cores / (mean episode s + mean generation s)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from mechsandbox.agents import ScriptedAgent, play_episode
from mechsandbox.client import MechSandboxEnv
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.tasks import LEVELS, families, get_family


def play(url: str, reset: dict) -> tuple[float, int, float]:
    started = time.perf_counter()
    with MechSandboxEnv(base_url=url, message_timeout_s=300).sync() as env:
        record = play_episode(ScriptedAgent(), env, reset)
    if record.infra_error or record.error or (record.score or 0.0) < 0.9:
        why = record.infra_error or record.error or record.score
        raise RuntimeError(f"{reset}: the scripted episode failed ({why})")
    return (time.perf_counter() - started) * 1000, len(record.steps), record.score


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="all", help="all, or comma-separated task/level pairs")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    pairs = ([f"{f.id}/{level}" for f in families() for level in LEVELS] if args.pairs == "all"
             else [p.strip() for p in args.pairs.split(",") if p.strip()])  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    env = {"MECHSANDBOX_PREFETCH_DEPTH": "0", "MECHSANDBOX_GENERATORS": "0"}  # nothing in the background
    episode_s, generation_s = [], []
    print(f"{'pair':32} {'episode ms':>10} {'steps':>5} {'generation ms':>13}")
    with LocalServer(env=env) as server:
        for pair in pairs:
            task_id, level = pair.split("/")
            started = time.perf_counter()
            get_family(task_id).generate(1, level)  # here, in one thread: the generation an episode needs
            generation_s.append(time.perf_counter() - started)
            reset = {"task_id": task_id, "level": level, "split": "train", "seed": 1}
            play(server.url, reset)  # generates it in the server, loads the worker pool's code paths
            plays = [play(server.url, reset) for _ in range(args.repeats)]
            ms, steps = statistics.median(p[0] for p in plays), plays[0][1]
            episode_s.append(ms / 1000)
            print(f"{pair:32} {ms:10.0f} {steps:5d} {generation_s[-1] * 1000:13.0f}", flush=True)
    mean_episode, mean_generation = statistics.mean(episode_s), statistics.mean(generation_s)
    print(f"\n{len(pairs)} pairs on {cores} cores: mean episode {mean_episode * 1000:.0f} ms, mean generation "
          f"{mean_generation * 1000:.0f} ms")  # fmt: skip
    print(f"bound, instances already generated: {cores / mean_episode:.1f} episodes/s")
    print(f"bound, a fresh instance per episode: {cores / (mean_episode + mean_generation):.1f} episodes/s")


if __name__ == "__main__":
    main()

"""Soak the server with concurrent sessions and ~10% hostile steps; print what held and what grew.

    python bench/soak.py [--seconds 300] [--sessions 16] [--hostile 4]

Starts its own server (wall limit 2 s per snippet so hostile loops cycle quickly). See
``mechsandbox/evaluation/soak.py`` for the mix.
"""

from __future__ import annotations

import argparse

from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.evaluation.soak import run_soak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--hostile", type=int, default=4)
    args = ap.parse_args()
    env = {"MECHSANDBOX_WALL_SECONDS": "2", "MECHSANDBOX_SESSION_CAP": "64"}
    with LocalServer(env=env) as server:
        report = run_soak(server.url, server.process.pid, args.seconds, args.sessions, args.hostile)
    print(f"{args.sessions} sessions ({args.hostile} hostile) for {args.seconds:.0f} s")
    print(f"steps {report.steps}, hostile {report.hostile_steps} ({report.hostile_steps / max(report.steps, 1):.0%})")
    print(f"server 5xx: {report.server_errors}")
    print(f"well-behaved namespace resets: {report.well_behaved_resets}; episodes graded {report.episodes_graded}, "
          f"graded wrong {report.wrongly_graded}; other failures {len(report.other_failures)}")  # fmt: skip
    first, middle, last = report.samples[0], report.samples[len(report.samples) // 2], report.samples[-1]
    for label, s in (("start", first), ("middle", middle), ("end", last)):
        print(f"  {label:6} server RSS {s['server_rss'] / 2**20:7.1f} MiB, processes {s['processes']}, "
              f"zombies {s['zombies']}")  # fmt: skip


if __name__ == "__main__":
    main()

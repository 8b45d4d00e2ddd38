"""The numbers hold on a busy machine (issue 52): an eval run beside CPU hogs scores exactly as on an idle machine.

What broke before: on a 2-core machine that other work kept busy, `mechsandbox eval --agent scripted` reported 0.446
where the truth is 0.990, because the never-reset reaper killed episodes whose first reset was still generating, and
the mean folded those in at the floor with no error count. Here the same plan, over fresh train seeds of the slowest
families on a cold instance cache, runs once beside CPU hogs on every core (twice as many hogs as cores) and once on
an idle machine, each against a server of its own, with the never-reset timeout at 2 s so a slow reset would be
reaped within the run. Every episode must be graded (zero infrastructure errors) and score the same on both.

Marked ``alone``: ``./dev.sh test`` runs it after the rest of the suite, without xdist workers beside it (they would
be hogs of their own, and this test's hogs would slow them).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cpu_hogs
from server_harness import running_server

pytestmark = pytest.mark.alone

SLOWEST = ("committee-circuit", "fact-storage", "head-roles", "induction-circuit")  # docs/PERFORMANCE.md, generation
EPISODES = 1  # per family: 4 episodes at once, each on a seed no other run has used (a cold cache)


def scripted_eval(url: str, out: Path, first_seed: int) -> dict:
    seeds = f"{first_seed}-{first_seed + EPISODES - 1}"
    command = [sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--split", "train",
               "--tasks", ",".join(SLOWEST), "--level", "hard", "--seeds", seeds, "--episodes", str(EPISODES),
               "--concurrency", "4", "--url", url, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return {"summary": json.loads((out / "summary.json").read_text()), "rows": rows}


def test_a_scripted_eval_beside_cpu_hogs_scores_as_on_an_idle_machine(tmp_path) -> None:
    first_seed = 10_000_000 + secrets.randbelow(2**30)  # fresh seeds: a cold instance cache, an unseen instance
    env = {"MECHSANDBOX_UNRESET_TIMEOUT_S": "2", "MECHSANDBOX_GENERATORS": "2"}
    hogs = 2 * (os.cpu_count() or 2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "idle").mkdir()
    with running_server(tmp_path / "busy", **env) as server, cpu_hogs(hogs):
        busy = scripted_eval(server.url, tmp_path / "busy-run", first_seed)
        log = server.log()
    with running_server(tmp_path / "idle", **env) as server:
        idle = scripted_eval(server.url, tmp_path / "idle-run", first_seed)

    assert "reaped a session never reset" not in log
    for run in (busy, idle):
        assert run["summary"].get("infrastructure_errors", 0) == 0, run["summary"]
        assert len(run["rows"]) == len(SLOWEST) * EPISODES
        assert all(row.get("infra_error") is None for row in run["rows"])
    scores = {(r["task_id"], r["instance_id"]): r["score"] for r in idle["rows"]}
    assert {(r["task_id"], r["instance_id"]): r["score"] for r in busy["rows"]} == scores
    assert busy["summary"]["overall"] == idle["summary"]["overall"]

"""Run an agent over a plan of episodes, concurrently, against a MechSandbox server.

Each episode gets its own WebSocket client (one server session), so episodes never share a
namespace. Everything the agent sees goes through the public API.

How an episode can fail, and what the harness records:
- the agent's or the client's own mistake (a protocol error, a refused reset): the floor score and its error;
- the infrastructure (``InfrastructureError``: the server, its sandbox or database, a full or draining server, a
  connection that could not be made or was lost): played again where that is safe, with a short backoff: on the
  train split always (a fresh reset), on the test split only when the reset itself failed (the server claimed
  nothing, so a counted run loses no attempt). What still fails is recorded as an infrastructure error with no
  score, left out of every mean and counted in the summary (docs/CONTRACT.md, "Harnesses and infrastructure
  errors").
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import BENCHMARK_VERSION
from ..agents import Agent, EpisodeRecord, play_episode
from ..agents.base import BACKOFF_S, RETRIES, infrastructure_failure, may_retry
from ..catalogue import local_catalogue, select_tasks
from ..client import MechSandboxEnv
from ..tasks import LEVELS

__all__ = ["BACKOFF_S", "RETRIES", "Plan", "may_retry", "play_once", "run_plan"]


@dataclass
class Plan:
    tasks: list[str]
    levels: list[str]
    split: str = "test"
    episodes: int = 20
    seeds: range | None = None
    resets: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for task_id in self.tasks:
            for level in self.levels:
                if self.split == "test":
                    picks = [{"index": k} for k in range(self.episodes)]
                else:
                    seeds = self.seeds if self.seeds is not None else range(self.episodes)
                    picks = [{"seed": s} for s in list(seeds)[: self.episodes]]
                for pick in picks:
                    self.resets.append({"task_id": task_id, "level": level, "split": self.split, **pick})


def parse_tasks(text: str) -> list[str]:
    """``--tasks`` against the installed families (the plan is made before any server is reached)."""
    return select_tasks(text, local_catalogue())


def parse_levels(text: str) -> list[str]:
    levels = list(LEVELS) if text in ("", "all") else [t.strip() for t in text.split(",")]
    unknown = set(levels) - set(LEVELS)
    if unknown:
        raise ValueError(f"unknown level(s) {sorted(unknown)}; use easy, medium, hard or all")
    return levels


def parse_seeds(text: str | None) -> range | None:
    if not text:
        return None
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], timeout=10)  # fmt: skip
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def play_once(url: str, reset: dict[str, Any], agent: Agent, message_timeout_s: float) -> EpisodeRecord:
    """One attempt at ``reset`` in a session of its own; never raises (a failure is in the record). Only the
    connection's failures are read as the infrastructure's here; the episode's own are classified by
    ``play_episode``, so an agent's exception is never taken for one."""
    env = MechSandboxEnv(base_url=url, message_timeout_s=message_timeout_s).sync()
    try:
        env.connect()
    except Exception as exc:
        failure = infrastructure_failure(exc, started=False)  # nothing was reset: always safe to play again
        if failure is None:
            return failed(reset, exc)
        return EpisodeRecord(reset["task_id"], reset["level"], reset["split"]).lost_to(failure)
    try:
        return play_episode(agent, env, reset)
    except Exception as exc:  # the agent's or the client's own mistake: the floor, with its error
        return failed(reset, exc)
    finally:
        with contextlib.suppress(Exception):  # the episode has its outcome; a close that fails changes nothing
            env.close()


def failed(reset: dict[str, Any], exc: BaseException) -> EpisodeRecord:
    """The record of an attempt that ended in ``exc`` (the floor, and the error in one line)."""
    record = EpisodeRecord(reset["task_id"], reset["level"], reset["split"])
    record.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return record


def run_plan(
    plan: Plan,
    url: str | Sequence[str],
    make_agent: Callable[[int], Agent],
    concurrency: int = 4,
    progress: bool = True,
    message_timeout_s: float = 300.0,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
) -> list[EpisodeRecord]:
    """Play every planned reset, ``concurrency`` at a time; with several URLs, episode ``i`` goes to
    ``url[i % len(url)]`` (servers side by side; one load balancer is one URL). An episode the infrastructure lost
    is played up to ``retries`` more times where ``may_retry`` allows; its record is the last attempt's (an episode
    counts once however often it was played), with ``attempts`` saying how many there were."""
    from tqdm import tqdm

    urls = [url] if isinstance(url, str) else list(url)

    def one(i: int) -> EpisodeRecord:
        attempt = 0
        while True:
            record = play_once(urls[i % len(urls)], plan.resets[i], make_agent(i), message_timeout_s)
            record.attempts = attempt + 1
            if attempt >= retries or not may_retry(record):
                return record
            time.sleep(backoff_s * 2**attempt)
            attempt += 1

    records: list[EpisodeRecord] = [None] * len(plan.resets)  # type: ignore[list-item]
    with (
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
        tqdm(total=len(plan.resets), disable=not progress, file=sys.stderr, desc="episodes") as bar,
    ):
        futures = {pool.submit(one, i): i for i in range(len(plan.resets))}
        for future, i in futures.items():
            records[i] = future.result()
            bar.update(1)
    return records


def run_info(agent: Agent, split: str) -> dict[str, Any]:
    info = {"agent": agent.name, "model": None, "temperature": None, "prompt_version": None, **agent.describe()}
    info.update(split=split, git_commit=git_commit(), benchmark_version=BENCHMARK_VERSION)
    return info

"""Run an agent over a plan of episodes, concurrently, against a MechSandbox server.

Each episode gets its own WebSocket client (one server session), so episodes never share a
namespace. A failed episode (server gone, protocol error) is recorded with the floor score and its
error, and the run goes on. Everything the agent sees goes through the public API.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import BENCHMARK_VERSION
from ..agents import Agent, EpisodeRecord, play_episode
from ..catalogue import local_catalogue, select_tasks
from ..client import MechSandboxEnv
from ..tasks import LEVELS


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


def run_plan(
    plan: Plan,
    url: str | Sequence[str],
    make_agent: Callable[[int], Agent],
    concurrency: int = 4,
    progress: bool = True,
    message_timeout_s: float = 300.0,
) -> list[EpisodeRecord]:
    """Play every planned reset, ``concurrency`` at a time; with several URLs, episode ``i`` goes to
    ``url[i % len(url)]`` (servers side by side; one load balancer is one URL)."""
    from tqdm import tqdm

    urls = [url] if isinstance(url, str) else list(url)

    def one(i: int) -> EpisodeRecord:
        reset = plan.resets[i]
        try:
            with MechSandboxEnv(base_url=urls[i % len(urls)], message_timeout_s=message_timeout_s).sync() as env:
                return play_episode(make_agent(i), env, reset)
        except Exception as exc:
            record = EpisodeRecord(reset["task_id"], reset["level"], reset["split"])
            record.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            return record

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

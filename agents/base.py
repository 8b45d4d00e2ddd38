"""The agent interface and the episode loop shared by every agent, ``inference.py`` and the eval harness.

An agent sees observations as plain dicts (the wire fields of docs/CONTRACT.md) and answers with an action
dict (exactly one of ``python_code``, ``solution_target``, ``solution_from``), or with a ``Turn`` that
carries no action (a reply the agent could not use: it costs a turn and is logged, nothing is sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..models import MechSandboxAction
from ..protocol import clip

OUTPUT_KEEP = 4000  # characters of each observation kept in a trajectory


@dataclass
class Turn:
    """What an agent decided: an action to send, or an error that costs a turn without one."""

    action: dict[str, Any] | None = None
    error: str | None = None


class Agent:
    name = "agent"

    reset_obs: dict[str, Any]

    def begin(self, obs: dict[str, Any]) -> None:
        """A new episode starts with this reset observation (prompt, schema and example live only there)."""
        self.reset_obs = obs

    def next_turn(self, obs: dict[str, Any]) -> Turn:
        raise NotImplementedError

    def fallback_answer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The submission to make when time runs out (well-formed, never a guess from an unusable reply)."""
        return {"solution_target": self.reset_obs.get("answer_example")}

    def describe(self) -> dict[str, Any]:
        return {"agent": self.name}


@dataclass
class StepLog:
    step: int
    action: dict[str, Any] | None
    reward: float
    done: bool
    error: str | None
    output: str = ""


@dataclass
class EpisodeRecord:
    task_id: str
    level: str
    split: str
    instance_id: str = ""
    family_version: str = ""
    score: float = 0.01
    steps: list[StepLog] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.steps] or [0.01]

    def result_row(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "family_version": self.family_version,
            "level": self.level,
            "split": self.split,
            "instance_id": self.instance_id,
            "score": self.score,
            "steps": len(self.steps),
            "rewards": self.rewards,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }

    def trajectory(self) -> dict[str, Any]:
        return {**self.result_row(), "turns": [s.__dict__ for s in self.steps]}


def play_episode(
    agent: Agent,
    env: Any,
    reset: dict[str, Any],
    deadline: float | None = None,
    max_turns: int | None = None,
    on_step: Callable[[StepLog], None] | None = None,
) -> EpisodeRecord:
    """Reset ``env`` (a connected sync ``MechSandboxEnv``) and play until done, out of turns or time.

    At the deadline, or at the last turn the budget allows, the agent's fallback answer is submitted.
    """
    started = time.monotonic()
    record = EpisodeRecord(reset.get("task_id", ""), reset.get("level", "easy"), reset.get("split", "train"))
    result = env.reset(**reset)
    obs = result.observation.model_dump()
    record.instance_id, record.family_version = obs["instance_id"], obs.get("family_version") or ""
    record.task_id, record.level = obs["task_id"], obs["level"]
    agent.begin(obs)
    turns = 0
    limit = min(max_turns or obs["max_steps"], obs["max_steps"])
    done = False
    while not done:
        out_of_time = deadline is not None and time.monotonic() >= deadline
        turn = Turn(agent.fallback_answer(obs)) if out_of_time or turns >= limit - 1 else agent.next_turn(obs)
        turns += 1
        if turn.action is None:
            log = StepLog(turns, None, 0.01, False, turn.error or "no action")
            record.steps.append(log)
            if on_step:
                on_step(log)
            continue
        result = env.step(MechSandboxAction(**turn.action))
        obs = result.observation.model_dump()
        done = bool(result.done)
        log = StepLog(turns, turn.action, float(result.reward or 0.01), done, obs.get("error"),
                      clip(obs.get("stdout_or_error") or "", OUTPUT_KEEP))  # fmt: skip
        record.steps.append(log)
        if on_step:
            on_step(log)
        if done:
            record.score = float(obs.get("score") or result.reward or 0.01)
    record.seconds = time.monotonic() - started
    return record

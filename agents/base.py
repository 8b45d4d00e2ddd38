"""The agent interface and the episode loop shared by every agent, ``inference.py`` and the eval harness.

An agent sees observations as plain dicts (the wire fields of docs/CONTRACT.md) and answers with an action
dict (exactly one of ``python_code``, ``solution_target``, ``solution_from``), or with a ``Turn`` that
carries no action (a reply the agent could not use: it costs a turn and is logged, nothing is sent).

An episode the infrastructure lost (the server, its sandbox or database, a full or draining server, the
connection) is a named outcome, not a score: its record carries ``infra_error`` and no score, and every harness
leaves it out of its means (docs/CONTRACT.md, "Harnesses and infrastructure errors").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..models import MechSandboxAction
from ..protocol import InfrastructureError, clip

OUTPUT_KEEP = 4000  # characters of each observation kept in a trajectory
RETRIES = 2  # how many more times a harness plays an episode the infrastructure lost, where that is safe
BACKOFF_S = 2.0  # the wait before the first such retry; doubled before each next one


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


def infrastructure_failure(exc: BaseException, started: bool) -> InfrastructureError | None:
    """``exc`` as an infrastructure failure, or None when it is the agent's or the client's own mistake.

    The typed client raises ``InfrastructureError`` itself; a transport failure that reaches a harness any other way
    (a connection refused or dropped, a message timeout: ``OSError``, which ``ConnectionError`` and ``TimeoutError``
    are, or a closed WebSocket) is the connection's side. ``started`` (whether the reset had answered) is kept when
    either side says the episode had started: a harness must never replay an attempt a counted run may have seen.
    """
    if isinstance(exc, InfrastructureError):
        if started and not exc.started:
            exc.started = True
        return exc
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, (OSError, ConnectionClosed)):
        return InfrastructureError("connection", f"{type(exc).__name__}: {exc}", started=started)
    return None


@dataclass
class EpisodeRecord:
    task_id: str
    level: str
    split: str
    instance_id: str = ""
    family_version: str = ""
    score: float | None = 0.01  # None only for an episode the infrastructure lost (``infra_error``)
    steps: list[StepLog] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None  # the agent's or client's own failure (still scored: the floor)
    infra_error: dict[str, Any] | None = None  # {"side", "message", "started"}: lost by the infrastructure, no score
    sealed: bool = False  # a sealed counted attempt (issue 55): its score shows only in the run's published result
    attempts: int = 1  # how many times a harness played it (a retried infrastructure failure counts once)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.steps] or [0.01]

    @property
    def graded(self) -> bool:
        """Whether the episode has a score that belongs in a mean (it was not lost by the infrastructure)."""
        return self.infra_error is None and not self.sealed

    def lost_to(self, failure: InfrastructureError) -> EpisodeRecord:
        """Mark the record as lost by the infrastructure: no score, the failure's side and message kept."""
        self.score = None
        self.infra_error = {"side": failure.side, "message": str(failure), "started": failure.started}
        return self

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
            "infra_error": self.infra_error,
            "sealed": self.sealed,
            "attempts": self.attempts,
        }

    def trajectory(self) -> dict[str, Any]:
        return {**self.result_row(), "turns": [s.__dict__ for s in self.steps]}


def may_retry(record: EpisodeRecord) -> bool:
    """Whether an episode the infrastructure lost may be played again: on train, always (a fresh reset of the same
    seed); on test, only when the reset itself failed, before the agent's first observation (the server voided the
    attempt). A test episode lost mid-way is recorded, never replayed: a counted run gets no second try."""
    if record.infra_error is None:
        return False
    return record.split != "test" or not record.infra_error["started"]


def play_episode(
    agent: Agent,
    env: Any,
    reset: dict[str, Any],
    deadline: float | None = None,
    max_turns: int | None = None,
    on_step: Callable[[StepLog], None] | None = None,
) -> EpisodeRecord:
    """Reset ``env`` (a connected sync ``MechSandboxEnv``) and play until done, out of turns or time.

    At the deadline, or at the last turn the budget allows, the agent's fallback answer is submitted. A failure of
    the infrastructure (``infrastructure_failure``) ends the episode as a record with ``infra_error`` and no score,
    whose ``started`` says whether the reset had answered (the harness decides whether to play it again); any other
    exception is raised.
    """
    started = time.monotonic()
    record = EpisodeRecord(reset.get("task_id", ""), reset.get("level", "easy"), reset.get("split", "train"))
    try:
        _play(agent, env, reset, record, deadline, max_turns, on_step)
    except InfrastructureError as failure:
        record.lost_to(failure)
    record.seconds = time.monotonic() - started
    return record


def _on_env(call: Callable[[], Any], started: bool) -> Any:
    """``call()`` (one message to the server), with a transport failure raised as ``InfrastructureError``: only the
    env's calls are classified, so an agent's own exception is never taken for the infrastructure's."""
    try:
        return call()
    except Exception as exc:
        failure = infrastructure_failure(exc, started)
        if failure is None or failure is exc:
            raise
        raise failure from exc


def _play(agent: Agent, env: Any, reset: dict[str, Any], record: EpisodeRecord, deadline: float | None,
          max_turns: int | None, on_step: Callable[[StepLog], None] | None) -> None:  # fmt: skip
    result = _on_env(lambda: env.reset(**reset), started=False)
    obs = result.observation.model_dump()
    if reset.get("run_token") is not None and obs.get("counted") is False:
        # A plan resets each instance of its run once, so the run's attempt here was claimed by an earlier reset whose
        # reply never came (its server died with it): that attempt is lost to the infrastructure, and this replay
        # would count for nothing. Recorded as the infrastructure's, never as a score, and never tried again.
        why = "the run's counted attempt here was claimed by a reset whose reply was lost with its server"
        raise InfrastructureError("connection", f"{why}; a replay would not count", started=True)
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
        action = MechSandboxAction(**turn.action)
        result = _on_env(lambda a=action: env.step(a), started=True)
        obs = result.observation.model_dump()
        done = bool(result.done)
        log = StepLog(turns, turn.action, float(result.reward or 0.01), done, obs.get("error"),
                      clip(obs.get("stdout_or_error") or "", OUTPUT_KEEP))  # fmt: skip
        record.steps.append(log)
        if on_step:
            on_step(log)
        if done:
            record.sealed = bool(obs.get("sealed"))
            # a sealed attempt has no score here: the server keeps it for the run's published result (issue 55)
            record.score = None if record.sealed else float(obs.get("score") or result.reward or 0.01)

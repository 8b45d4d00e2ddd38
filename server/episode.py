"""Episode rules: budget, rewards, one graded submission, what is revealed and when.

Independent of the wire protocol (no OpenEnv import) and of how snippets are isolated: it is handed
an instance (with its truth) and a sandbox session, and turns actions into observation dicts whose
fields are those of docs/CONTRACT.md. Rules:
- a code step runs the snippet and earns the 0.01 format floor (a stalling agent never out-earns a
  submitting one: the episode return is the terminal score);
- the first *valid* submission is graded and ends the episode (reward = score in [0.01, 0.99]);
  a malformed answer is a clear error that costs a step and does not end the episode;
- the last step of the budget ends the episode at the floor score with ``truncated`` set;
- nothing graded is shown before the end; after it, train episodes may show the truth and the
  grader's breakdown, test episodes only the score;
- steps after the end are refused (``EpisodeOver``);
- on the test split, a run's episode is scored by its ``Scoring`` (``runs.py``): the counted attempt's end is written
  to the results database *before* the client sees it (if the write fails, the step is undone and refused with a
  503, so a result is never shown and lost); an uncounted or practice episode is graded but shown the floor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..jsonvalue import AnswerError, check_json_value
from ..protocol import ACTION_FIELDS, FLOOR, clamp
from ..tasks import Family, Instance
from .sandbox import SandboxSession
from .scoring import CODE_KEEP, Scoring, clip
from .splits import InstanceRef

log = logging.getLogger("mechsandbox.server")

# Writes a counted attempt's end: (scoring, status, score, steps, seconds, trajectory); raises an EpisodeError.
Recorder = Callable[[Scoring, str, float | None, int, float, list[dict[str, Any]]], None]


class EpisodeError(Exception):
    """A client mistake about the episode; ``status`` is the HTTP code the wire layer uses."""

    status = 400


class EpisodeOver(EpisodeError):
    status = 409


@dataclass
class Episode:
    episode_id: str
    ref: InstanceRef
    family: Family
    instance: Instance | None  # released when the episode ends (the model and probe are no longer needed)
    sandbox: SandboxSession
    reveal_truth: bool
    transport: str = "http"
    budget: int = 0  # 0 = the family's budget for the level; an operator override for train episodes only
    step_count: int = 0
    done: bool = False
    truncated: bool = False
    score: float | None = None
    feedback: str | None = None
    created: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    last_step_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    truth: Any = field(default=None, repr=False)
    scoring: Scoring = field(default_factory=Scoring)
    recorder: Recorder | None = field(default=None, repr=False)
    trajectory: list[dict[str, Any]] = field(default_factory=list, repr=False)  # kept for counted attempts only

    def __post_init__(self) -> None:
        self.truth = self.instance.truth

    @property
    def max_steps(self) -> int:
        return self.budget or int(self.family.max_steps[self.ref.level])

    def _base(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "task_id": self.family.id,
            "level": self.ref.level,
            "split": self.ref.split,
            "instance_id": self.ref.instance_id,
            "step": self.step_count,
            "max_steps": self.max_steps,
            "done": self.done,
            "truncated": self.truncated,
            "score": self.score,
            "counted": self.scoring.counted,
            "run_id": self.scoring.run_id,
        }

    def reset_observation(self) -> dict[str, Any]:
        return {
            **self._base(),
            "reward": None,
            "stdout_or_error": "",
            "error": None,
            "prompt": self.instance.prompt,
            "answer_schema": self.instance.answer_schema,
            "answer_example": self.family.answer_example,
            "family_version": self.family.family_version,
        }

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.last_activity = time.monotonic()
            if self.done:
                raise EpisodeOver("the episode is over; call reset to start a new one")
            given = [name for name in ACTION_FIELDS if action.get(name) is not None]
            if len(given) != 1:
                raise EpisodeError(f"an action needs exactly one of {', '.join(ACTION_FIELDS)}")
            self.step_count += 1
            if given[0] == "python_code":
                obs = self._run(action["python_code"])
            else:
                obs = self._submit(given[0], action[given[0]])
            if not self.done and self.step_count >= self.max_steps:
                self.done, self.truncated, self.score = True, True, FLOOR
                obs["reward"] = FLOOR
                obs["error"] = obs.get("error") or "step budget used up; the episode ends at the floor score"
            self._remember(given[0], action[given[0]], obs)
            if self.done:
                self._end(obs)
            self.last_activity = time.monotonic()
            if self.done:
                self.sandbox.close()  # no more snippets can come: free the worker and the instance now
                self.instance = None
            return {**self._base(), **obs, **self._reveal()}

    def _run(self, code: str) -> dict[str, Any]:
        result = self.sandbox.run(code)
        text = result.stdout
        if result.notice:
            text = f"[sandbox] {result.notice}\n{text}"
        if result.error:
            text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{result.error}"
        return {
            "reward": FLOOR,
            "stdout_or_error": text,
            "error": result.error,
            "output_truncated": result.output_truncated,
            "namespace_reset": result.namespace_reset,
        }

    def _submit(self, kind: str, value: Any) -> dict[str, Any]:
        if kind == "solution_from":
            answer, error = self.sandbox.solution_from(value)
            if error:
                return self._invalid(f"solution_from {value!r}: {error}")
        else:
            try:
                answer = check_json_value(value)
            except AnswerError as exc:
                return self._invalid(str(exc))
        grade = self.family.grade(answer, self.truth, self.instance)
        if grade.rejected:
            return self._invalid(grade.message)
        self.done = True
        self.score = clamp(grade.score)
        if self.ref.split == "train":
            self.feedback = grade.message
        return {"reward": self.score, "stdout_or_error": f"graded: score {self.score:.3f}", "error": None}

    def _remember(self, kind: str, value: Any, obs: dict[str, Any]) -> None:
        """Keep the step for the trajectory of a counted attempt (actions and outputs capped)."""
        if self.scoring.mode != "counted":
            return
        if kind == "solution_target":
            shown = value if len(repr(value)) <= CODE_KEEP else clip(repr(value))
        else:
            shown = clip(str(value))
        self.trajectory.append({"step": self.step_count, "action": {kind: shown},
                                "output": clip(obs.get("stdout_or_error") or ""), "reward": obs.get("reward"),
                                "error": clip(obs["error"]) if obs.get("error") else None})  # fmt: skip

    def _end(self, obs: dict[str, Any]) -> None:
        """The episode just ended: write a counted attempt, hide an uncounted one's score.

        When the write fails the step is undone (``done`` cleared, the step not spent) and the error raised, so
        the client can submit again; nothing is shown that was not recorded.
        """
        if self.scoring.mode == "counted" and self.recorder is not None:
            status = "truncated" if self.truncated else "graded"
            try:
                self.recorder(self.scoring, status, self.score, self.step_count, time.monotonic() - self.created,
                              self.trajectory)  # fmt: skip
            except Exception:
                self.done, self.truncated, self.score, self.feedback = False, False, None, None
                self.step_count -= 1
                self.trajectory.pop()
                raise
        if self.scoring.hides_score:
            graded = self.score is not None and not self.truncated
            self.score = None
            obs["reward"] = FLOOR
            if graded:
                obs["stdout_or_error"] = f"graded; not counted ({self.scoring.reason}): reward at the floor"

    def _invalid(self, message: str) -> dict[str, Any]:
        text = f"invalid answer (not graded, counts as a step): {message}"
        return {"reward": FLOOR, "stdout_or_error": text, "error": text}

    def _reveal(self) -> dict[str, Any]:
        if not self.done or self.ref.split != "train" or not self.reveal_truth:
            return {}
        return {"truth": self.truth, "feedback": self.feedback}

    def state(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "task_id": self.family.id,
            "level": self.ref.level,
            "split": self.ref.split,
            "instance_id": self.ref.instance_id,
            "max_steps": self.max_steps,
            "done": self.done,
            "truncated": self.truncated,
            "score": self.score,
            "family_version": self.family.family_version,
            "counted": self.scoring.counted,
            "run_id": self.scoring.run_id,
        }

    def close(self) -> None:
        """Free the sandbox; a counted attempt left unfinished is recorded as abandoned (it counts at the floor)."""
        if not self.done and self.scoring.mode == "counted" and self.recorder is not None:
            self.done, self.score = True, FLOOR
            try:
                self.recorder(self.scoring, "abandoned", FLOOR, self.step_count, time.monotonic() - self.created,
                              self.trajectory)  # fmt: skip
            except Exception as exc:  # the row stays open, which the leaderboard also counts at the floor
                log.warning("could not record abandoned attempt %s: %s", self.scoring.attempt_id, exc)
        self.sandbox.close()

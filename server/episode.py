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
  to the results database *before* anything of it is assigned (if the write fails, the step is refused with a 503
  and not spent, so a result is never shown and lost); an uncounted or practice episode is graded but shown the
  floor, and its score is never assigned where ``/state`` could read it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..arch.guide import namespace_guide
from ..jsonvalue import AnswerError, check_json_value
from ..protocol import ACTION_FIELDS, FLOOR, clamp, infra_message
from ..tasks import Family, Instance
from .sandbox import SandboxSession, SandboxUnavailable
from .scoring import CODE_KEEP, Scoring, clip
from .splits import InstanceRef

log = logging.getLogger("mechsandbox.server")

# Writes a counted attempt's end: (scoring, status, score, steps, seconds, trajectory) -> whether the attempt was
# still open (False: it had been abandoned); raises an EpisodeError when the database fails.
Recorder = Callable[[Scoring, str, float | None, int, float, list[dict[str, Any]]], bool]
CLOSE_WAIT_S = 60.0  # how long closing a counted episode waits for a step in flight
# What a sealed counted attempt's graded submission shows in place of its score (docs/CONTRACT.md).
SEALED = ("submitted: sealed (this counted attempt's score shows only in its run's published result, once the run "
          "is finished: POST /runs/{run_id}/finish); reward at the floor")


class EpisodeError(Exception):
    """A client mistake about the episode; ``status`` is the HTTP code the wire layer uses."""

    status = 400


class EpisodeOver(EpisodeError):
    status = 409


class InfraFailure(EpisodeError):
    """The server, not the agent, failed (docs/CONTRACT.md, "When the infrastructure fails"): the message names the side
    (``protocol.infra_message``), the wire layers add the code ``INFRASTRUCTURE_ERROR`` and the side, and nothing was
    counted: a refused reset claimed no attempt, a refused step was not spent. The client may retry."""

    status = 503
    side = "server"

    def __init__(self, detail: str, side: str | None = None):
        self.side = side or self.side
        super().__init__(infra_message(self.side, detail))


class ServiceUnavailable(InfraFailure):
    """The server cannot do this now (the sandbox, a drain, the database); the client may retry."""

    side = "sandbox"


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
    # WebSocket only: the client's own episode_id, echoed in observations and state (OpenEnv's reset(episode_id=...)).
    # The key above stays the server's: HTTP routes by it, so there it is the episode's capability and no client
    # may choose it; a WebSocket episode belongs to its connection, so a label changes nothing there.
    label: str | None = None
    # The capability to resume the episode after a dropped connection (``Service.resume``), given to its opener in the
    # reset observation; the client may choose it (so a reset whose reply was lost can still be resumed).
    resume_token: str = ""
    last_obs: dict[str, Any] | None = field(default=None, repr=False)  # what a resume answers: the last reply sent
    owner: Any = field(default=None, repr=False)  # the client that opened it: only it may resume the episode
    holder: Any = field(default=None, repr=False)  # the WebSocket environment holding it now (None: HTTP or parked)
    parked_at: float | None = None  # when its connection went away (a parked WebSocket episode), else None

    def __post_init__(self) -> None:
        self.truth = self.instance.truth

    @property
    def public_id(self) -> str:
        """The ``episode_id`` a client sees: its own label on a WebSocket, else the server's key."""
        return self.label or self.episode_id

    @property
    def max_steps(self) -> int:
        return self.budget or int(self.family.max_steps[self.ref.level])

    def _base(self) -> dict[str, Any]:
        return {
            "episode_id": self.public_id,
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
            "sealed": self.scoring.mode == "counted" and self.scoring.sealed,
            "run_id": self.scoring.run_id,
        }

    def reset_observation(self) -> dict[str, Any]:
        return {
            **self._base(),
            "reward": None,
            "stdout_or_error": "",
            "error": None,
            "prompt": f"{self.instance.prompt}\n\n{namespace_guide(self.instance.model)}\n{self._limits_line()}",
            "answer_schema": self.instance.answer_schema,
            "answer_example": self.family.answer_example,
            "family_version": self.family.family_version,
            "resume_token": self.resume_token or None,
        }

    def _limits_line(self) -> str:
        """The snippet limits, in the prompt: the CPU-time limit is the snippet's own computation, so a busy server
        makes a snippet slower, never cuts it short (docs/SANDBOX.md)."""
        settings = getattr(getattr(self.sandbox, "pool", None), "settings", None)
        cpu = getattr(settings, "wall_seconds", 10.0)
        return (f"Each snippet may use {cpu:g} s of CPU time: only its own computation counts, so a busy server "
                "makes it slower, never shorter. Past it the snippet stops with a TimeoutError (variables kept).")

    def resumed_observation(self) -> dict[str, Any]:
        """What a resume answers: the last reply the episode sent (the reset observation before any step), so a client
        whose connection dropped learns whether its last action was taken (compare ``step``) and, once over, its end.
        A step still under way (the connection dropped while its snippet ran) finishes first: its reply is the
        answer."""
        if not self.lock.acquire(timeout=CLOSE_WAIT_S):
            raise EpisodeError("the episode's last step is still running; resume again in a moment")
        try:
            if self.last_obs is None:
                self.last_obs = self.reset_observation()
            return {**self.last_obs, "resumed": True}
        finally:
            self.lock.release()

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.last_activity = time.monotonic()
            if self.done:
                raise EpisodeOver("the episode is over; call reset to start a new one")
            given = [name for name in ACTION_FIELDS if action.get(name) is not None]
            if len(given) != 1:
                raise EpisodeError(f"an action needs exactly one of {', '.join(ACTION_FIELDS)}")
            kind, number = given[0], self.step_count + 1
            score: float | None = None
            feedback: str | None = None
            if kind == "python_code":
                obs, charged = self._run(action[kind])
                if not charged:  # the server lost the worker, not the snippet: the step is not spent
                    self.last_activity = time.monotonic()
                    self.last_obs = {**self._base(), **obs}
                    return self.last_obs
            else:
                obs, score, feedback = self._submit(kind, action[kind])
            truncated = score is None and number >= self.max_steps
            if truncated:
                obs["reward"] = FLOOR
                obs["error"] = obs.get("error") or "step budget used up; the episode ends at the floor score"
            entry = self._entry(number, kind, action[kind], obs)
            if score is not None or truncated:
                self._settle(number, FLOOR if truncated else score, truncated, feedback, obs, entry)
            elif entry is not None:
                self.trajectory.append(entry)
            self.step_count = number
            self.done = score is not None or truncated
            self.last_activity = time.monotonic()
            if self.done:
                self.sandbox.close()  # no more snippets can come: free the worker and the instance now
                self.instance = None
            self.last_obs = {**self._base(), **obs, **self._reveal()}
            return self.last_obs

    def _run(self, code: str) -> tuple[dict[str, Any], bool]:
        """The snippet's observation, and whether the step is charged: not when the server lost the worker for a reason
        that was not the snippet's (``RunResult.server_fault``: the memory watchdog over-admitted, a shutdown, a dead
        zygote). The episode goes on in a fresh worker (namespace reset) with the budget it had, never a fresh one."""
        try:
            result = self.sandbox.run(code)
        except SandboxUnavailable as exc:  # no worker could be had: nothing ran, so the step is not counted
            self._sandbox_refused(exc, "the snippet did not run")
        charged = not getattr(result, "server_fault", False)
        text = result.stdout
        if result.notice:
            text = f"[sandbox] {result.notice}\n{text}"
        if result.error:
            text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{result.error}"
        if not charged:
            text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}" + infra_message(
                "sandbox", "the server lost this snippet's worker (not the snippet's doing); the step was not counted: "
                "send it again")  # fmt: skip
        return {
            "reward": FLOOR,
            "stdout_or_error": text,
            "error": result.error or (None if charged else "the step was not counted (the server lost the worker)"),
            "output_truncated": result.output_truncated,
            "namespace_reset": result.namespace_reset,
        }, charged

    def _sandbox_refused(self, exc: SandboxUnavailable, what: str) -> NoReturn:
        """A step the sandbox could not take: a 503 to send again, or 409 when the session was closed meanwhile (the
        episode ended: a WebSocket that went away, the idle reaper), where sending it again cannot help."""
        if self.sandbox.closed:
            raise EpisodeOver("the episode's sandbox session was closed; call reset to start a new one") from None
        raise ServiceUnavailable(f"{exc}; {what} and the step was not counted: send it again") from None

    def _submit(self, kind: str, value: Any) -> tuple[dict[str, Any], float | None, str | None]:
        """Grade a submission: ``(observation, score, feedback)``, score None when the answer is invalid.

        Nothing of the episode changes here: ``_settle`` publishes the end once it is recorded.
        """
        if kind == "solution_from":
            try:
                solution = self.sandbox.solution_from(value)
            except SandboxUnavailable as exc:
                self._sandbox_refused(exc, "nothing was graded")
            answer, error = solution
            if getattr(solution, "server_fault", False):  # the server lost the worker: nothing graded, nothing spent
                raise ServiceUnavailable(f"{error}; the server lost the worker, nothing was graded and the step was "
                                         "not counted: send it again")  # fmt: skip
            if error:
                return self._invalid(f"solution_from {value!r}: {error}"), None, None
        else:
            try:
                answer = check_json_value(value)
            except AnswerError as exc:
                return self._invalid(str(exc)), None, None
        grade = self.family.grade(answer, self.truth, self.instance)
        if grade.rejected:
            return self._invalid(grade.message), None, None
        score = clamp(grade.score)
        return {"reward": score, "stdout_or_error": f"graded: score {score:.3f}", "error": None}, score, grade.message

    def _entry(self, number: int, kind: str, value: Any, obs: dict[str, Any]) -> dict[str, Any] | None:
        """The step as a counted attempt's trajectory keeps it (actions and outputs capped); None otherwise."""
        if self.scoring.mode != "counted":
            return None
        if kind == "solution_target":
            shown = value if len(repr(value)) <= CODE_KEEP else clip(repr(value))
        else:
            shown = clip(str(value))
        return {"step": number, "action": {kind: shown}, "output": clip(obs.get("stdout_or_error") or ""),
                "reward": obs.get("reward"), "error": clip(obs["error"]) if obs.get("error") else None}  # fmt: skip

    def _settle(self, steps: int, score: float, truncated: bool, feedback: str | None, obs: dict[str, Any],
                entry: dict[str, Any] | None) -> None:  # fmt: skip
        """The episode ends: record a counted attempt *first*, then publish the score (or hide it).

        Nothing is assigned before the recorder returns, so a failed write (it raises) leaves the episode as it
        was: the step is not spent, no score was visible to ``/state`` meanwhile, and the client may submit again.
        A write that finds the attempt no longer open (the run reset the instance again, which abandoned it)
        turns this episode into an uncounted one. A sealed attempt (issue 55) shows the floor and says it is sealed,
        and its stored trajectory keeps the same: the score lives only in the database's score column.
        """
        sealed = self.scoring.mode == "counted" and self.scoring.sealed
        if sealed and entry is not None:
            entry = {**entry, "reward": FLOOR, "output": SEALED if not truncated else entry["output"]}
        if self.scoring.mode == "counted" and self.recorder is not None:
            trajectory = self.trajectory + ([entry] if entry is not None else [])
            kept = self.recorder(self.scoring, "truncated" if truncated else "graded", score, steps,
                                 time.monotonic() - self.created, trajectory)  # fmt: skip
            self.trajectory = trajectory
            if not kept:
                self.scoring = Scoring("uncounted", self.scoring.run_id,
                                       reason="the attempt was abandoned: its instance was reset again in this run")
        if self.scoring.hides_score:
            obs["reward"] = FLOOR
            if not truncated:
                obs["stdout_or_error"] = (f"{SEALED} (run {self.scoring.run_id})" if self.scoring.mode == "counted" else
                                          f"graded; not counted ({self.scoring.reason}): reward at the floor")
        self.feedback = feedback if self.ref.split == "train" else None
        self.truncated = truncated
        self.score = None if self.scoring.hides_score else score

    def _invalid(self, message: str) -> dict[str, Any]:
        text = f"invalid answer (not graded, counts as a step): {message}"
        return {"reward": FLOOR, "stdout_or_error": text, "error": text}

    def _reveal(self) -> dict[str, Any]:
        if not self.done or self.ref.split != "train" or not self.reveal_truth:
            return {}
        return {"truth": self.truth, "feedback": self.feedback}

    def state(self) -> dict[str, Any]:
        return {
            "episode_id": self.public_id,
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
            "sealed": self.scoring.mode == "counted" and self.scoring.sealed,
            "run_id": self.scoring.run_id,
        }

    def close(self, by_server: bool = False) -> None:
        """Free the sandbox; a counted attempt left unfinished is recorded as it ended (each counts at the floor):
        ``abandoned`` when the client left it; when the server ended it (``by_server``: a shutdown, a drain that ran
        out), ``voided`` if the agent had taken no step (the run may play the instance again: it learnt nothing but the
        prompt, which a new reset shows again) and ``lost`` otherwise (never a second try: the agent saw outputs).

        For a counted attempt, a step in flight finishes first (its end is recorded, not overwritten).
        """
        counted = self.scoring.mode == "counted" and self.recorder is not None
        held = counted and self.lock.acquire(timeout=CLOSE_WAIT_S)
        try:
            if counted and not self.done:
                self.done, self.score = True, None if self.scoring.hides_score else FLOOR
                status = "abandoned" if not by_server else "voided" if self.step_count == 0 else "lost"
                try:
                    self.recorder(self.scoring, status, FLOOR, self.step_count,  # type: ignore[misc]
                                  time.monotonic() - self.created, self.trajectory)  # fmt: skip
                except Exception as exc:  # the row stays open, which the leaderboard also counts at the floor
                    log.warning("could not record %s attempt %s: %s", status, self.scoring.attempt_id, exc)
        finally:
            if held:
                self.lock.release()
        self.sandbox.close()

"""OpenEnv wire types: the action, the observation and the state of a MechSandbox episode.

Field names and meanings are the contract of docs/CONTRACT.md ("Wire format"). Every observation field is a real field
(OpenEnv drops ``metadata`` on parts of the wire). This module and ``client.py`` import only
``openenv`` and ``jsonvalue`` (no torch), so an agent machine can use the typed client cheaply.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .jsonvalue import AnswerError, check_json_value
from .openenv_core import Action, Observation, State
from .protocol import ACTION_FIELDS

MAX_CODE_BYTES = 64 * 1024


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose details stay JSON-serialisable (OpenEnv's WebSocket sends them back)."""
    return PydanticCustomError("invalid_action", message)


def check_code_size(code: str | None, field: str) -> str | None:
    """The snippet cap, in UTF-8 bytes (what the sandbox receives), for the action and the run_python tool."""
    if code is not None and len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES:
        raise _invalid(f"{field} is larger than {MAX_CODE_BYTES} bytes")
    return code


class MechSandboxAction(Action):
    """Exactly one of: a snippet to run, an answer to grade, or the name of a sandbox variable to grade.

    >>> MechSandboxAction(python_code="print(model)")
    >>> MechSandboxAction(solution_target=[3, 7])
    >>> MechSandboxAction(solution_from="answer")
    """

    python_code: str | None = Field(default=None, description="Python run in the sandbox (at most 64 KiB)")
    solution_target: Any = Field(default=None, description="The answer, as JSON (graded once; ends the episode)")
    solution_from: str | None = Field(
        default=None, max_length=128, description="Name of a sandbox variable holding the answer"
    )

    @field_validator("python_code")
    @classmethod
    def _code_size(cls, code: str | None) -> str | None:
        return check_code_size(code, "python_code")

    @field_validator("solution_target")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return check_json_value(value)
        except AnswerError as exc:
            raise _invalid(f"solution_target: {exc}") from None

    @model_validator(mode="after")
    def _exactly_one(self) -> MechSandboxAction:
        given = [name for name in ACTION_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise _invalid(f"an action needs exactly one of {', '.join(ACTION_FIELDS)} (got {len(given)})")
        return self


class MechSandboxObservation(Observation):
    """What the agent sees after reset and after each step (``done``/``reward`` come from the base)."""

    episode_id: str | None = Field(default=None, description="128-bit server-issued token; HTTP /step needs it")
    task_id: str = ""
    level: str = ""
    split: str = ""
    instance_id: str = ""
    step: int = 0
    max_steps: int = 0
    stdout_or_error: str = ""
    error: str | None = None
    output_truncated: bool = False
    truncated: bool = False
    score: float | None = None
    namespace_reset: bool = False
    prompt: str | None = None
    answer_schema: dict[str, Any] | None = None
    answer_example: Any = None
    family_version: str | None = None
    truth: Any = Field(default=None, description="After the end of a train episode, when the server reveals it")
    feedback: str | None = Field(default=None, description="The grader's breakdown, train episodes only")
    counted: bool | None = Field(
        default=None,
        description="Test split, in a run: whether this episode is the run's counted attempt at the "
        "instance (false: a later attempt or practice, shown the floor); null when no run is involved",
    )
    run_id: str | None = Field(default=None, description="The run this test episode plays for, if any")
    sealed: bool = Field(
        default=False,
        description="A counted attempt on a fixed-salt server: its score shows only in its run's published result "
        "(POST /runs/{run_id}/finish); the reward here is the floor",
    )
    resume_token: str | None = Field(
        default=None,
        description="Reset only: the capability to resume this episode after a dropped connection (reset with "
        "resume=<token>, same client, within MECHSANDBOX_RESUME_GRACE_S); keep it private",
    )
    resumed: bool = Field(default=False, description="True on the reply to a resume: the episode's last observation")


class MechSandboxState(State):
    """The episode's bookkeeping (``episode_id`` and ``step_count`` come from the base)."""

    task_id: str = ""
    level: str = ""
    split: str = ""
    instance_id: str = ""
    max_steps: int = 0
    done: bool = False
    truncated: bool = False
    score: float | None = None
    family_version: str | None = None
    counted: bool | None = None
    run_id: str | None = None
    sealed: bool = False

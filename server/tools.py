"""One tool-calling surface over an environment's episode (issue 18): ``start_episode``, ``run_python``,
``submit_answer`` and ``describe_task``, each with a JSON-schema'd, described argument object.

Why one module: MCP, Inspect and TRL each want "a list of tools with schemas, and a call that returns text", and
each would otherwise re-implement argument checks and the episode rules differently. Here every call goes through
:class:`~mechsandbox.server.mechsandbox_environment.MechSandboxEnvironment` (``reset`` / ``step``), so the step
budget, the rate limit, the 64 KiB snippet cap, one graded submission and train-only truth hold exactly as on the
WebSocket and HTTP paths, and the text protocol of ``inference.py`` stays one more client of the same rules.

Why ``start_episode`` and not ``reset``: OpenEnv reserves ``reset``, ``step``, ``state`` and ``close`` as MCP tool
names (its harness renames tools that clash), so the tool that starts an episode carries its own name; its
arguments are those of POST /reset.

A refused call raises :class:`ToolError` with one line: the wrappers turn it into their ecosystem's error form
(an MCP result with ``isError``, an Inspect ``ToolError``). Nothing here imports an MCP or Inspect package.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..models import MAX_CODE_BYTES, MechSandboxAction, check_code_size
from .episode import EpisodeError, InfraFailure
from .mechsandbox_environment import MechSandboxEnvironment
from .wire import ResetRequest, validation_message

_STRICT = ConfigDict(extra="forbid", strict=True)


class ToolError(Exception):
    """A refused tool call (unknown tool, bad arguments, an episode rule): one line, safe to show the agent."""


class ToolInfraError(ToolError):
    """A tool call the server failed for its own reasons (``InfraFailure``): MCP answers it as a JSON-RPC error with
    ``protocol.INFRA_RPC_CODE`` and the side, never as a result the agent would read as its own mistake."""

    def __init__(self, message: str, side: str):
        super().__init__(message)
        self.side = side


class StartEpisode(ResetRequest):
    """Start an episode and get its task: the prompt, the answer's JSON schema, an example answer and the step
    budget. Starting a new one ends the current episode. Every argument is optional (the server's default task,
    level easy, train split, a random seed); a test-split episode is chosen by ``index``, and is counted for a run
    only with the ``run_token`` that POST /runs returned."""


class RunPython(BaseModel):
    """Run Python in the episode's sandbox (the model and the probe data are in the namespace; variables persist
    between calls) and get its printed output, or the error. Each call spends one step of the budget."""

    model_config = _STRICT
    code: str = Field(description=f"Python source, at most {MAX_CODE_BYTES} bytes; print what you want to see")

    @field_validator("code")
    @classmethod
    def _size(cls, code: str) -> str:
        return check_code_size(code, "code")  # type: ignore[return-value] - a str in, a str out


class SubmitAnswer(BaseModel):
    """Submit the final answer, graded once: give exactly one of ``answer`` (the JSON value the task's answer
    schema describes) or ``variable`` (the name of a sandbox variable holding it). An answer that does not fit the
    schema is refused without a grade and costs a step; a graded one ends the episode."""

    model_config = ConfigDict(extra="forbid")
    answer: Any = Field(default=None, description="The answer as a JSON value (see the task's answer schema)")
    variable: str | None = Field(
        default=None, min_length=1, max_length=128, description="Name of a sandbox variable that holds the answer"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SubmitAnswer:
        if (self.answer is None) == (self.variable is None):
            raise ValueError("give exactly one of answer or variable")
        return self


class DescribeTask(BaseModel):
    """Show the current episode again: its prompt, answer schema and example, the steps used and left, and whether
    it has ended (with the score). Free: it does not spend a step."""

    model_config = _STRICT


# accepted by POST /reset, not offered as tool arguments
HIDDEN_RESET_FIELDS = ("episode_id", "task_level", "resume_token", "resume")


@dataclass
class ToolResult:
    """A tool's text for the agent, and the observation it came from (for scorers and rewards)."""

    text: str
    observation: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return bool(self.observation.get("done"))


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The argument object's JSON schema, as MCP's ``inputSchema`` and Inspect's tool parameters take it."""
    schema = model.model_json_schema()
    schema.pop("description", None)
    schema.pop("title", None)
    schema.pop("examples", None)
    props = schema.setdefault("properties", {})
    for name in HIDDEN_RESET_FIELDS if model is StartEpisode else ():
        props.pop(name, None)
    for prop in props.values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    schema["type"] = "object"
    return schema


class EpisodeTools:
    """The four tools over one environment (one session's episode). Not thread-safe by itself: a session's calls
    are serialised by whoever owns the environment (OpenEnv's session executor, the MCP route)."""

    MODELS: ClassVar[dict[str, type[BaseModel]]] = {
        "start_episode": StartEpisode,
        "run_python": RunPython,
        "submit_answer": SubmitAnswer,
        "describe_task": DescribeTask,
    }

    def __init__(self, env: MechSandboxEnvironment):
        self.env = env
        self.task: dict[str, Any] | None = None  # the reset observation, kept: the instance is freed at the end
        self.last: dict[str, Any] = {}

    @classmethod
    @functools.cache
    def specs(cls) -> list[dict[str, Any]]:
        """Name, description and input schema of every tool (MCP's ``tools/list`` shape), built once."""
        return [
            {"name": name, "description": " ".join((model.__doc__ or "").split()), "inputSchema": _schema(model)}
            for name, model in cls.MODELS.items()
        ]

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Validate ``arguments`` against the tool's schema and run it; :class:`ToolError` on any refusal."""
        model = self.MODELS.get(name) if isinstance(name, str) else None
        if model is None:
            raise ToolError(f"unknown tool {name!r}; the tools are {', '.join(self.MODELS)}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolError(f"{name}: the arguments must be a JSON object")
        hidden = [k for k in HIDDEN_RESET_FIELDS if k in arguments] if model is StartEpisode else []
        if hidden:
            raise ToolError(f"{name}: unexpected argument {hidden[0]!r}")
        try:
            args = model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"{name}: {validation_message(exc)}") from None
        handler: Callable[[Any], ToolResult] = getattr(self, f"_{name}")
        try:
            return handler(args)
        except InfraFailure as exc:
            raise ToolInfraError(f"{name}: {exc}", exc.side) from None
        except (EpisodeError, RuntimeError) as exc:
            message = " ".join(str(exc).split()).replace("call reset", "call start_episode")
            raise ToolError(f"{name}: {message}") from None

    # -- the tools ----------------------------------------------------------------------------------------------
    def _start_episode(self, args: StartEpisode) -> ToolResult:
        obs = self.env.reset(**args.model_dump(exclude_none=True, exclude={"episode_id"})).model_dump()
        self.task, self.last = obs, obs
        return ToolResult(self._task_text(obs), obs)

    def _run_python(self, args: RunPython) -> ToolResult:
        try:
            action = MechSandboxAction(python_code=args.code)
        except ValidationError as exc:
            raise ToolError(f"run_python: {validation_message(exc)}") from None
        obs = self._step(action)
        return ToolResult(self._with_status(obs["stdout_or_error"] or "(no output)", obs), obs)

    def _submit_answer(self, args: SubmitAnswer) -> ToolResult:
        try:
            if args.variable is not None:
                action = MechSandboxAction(solution_from=args.variable)
            else:
                action = MechSandboxAction(solution_target=args.answer)
        except ValidationError as exc:
            raise ToolError(f"submit_answer: {validation_message(exc)}") from None
        obs = self._step(action)
        return ToolResult(self._with_status(obs["stdout_or_error"], obs), obs)

    def _describe_task(self, args: DescribeTask) -> ToolResult:
        if self.task is None:
            raise ToolError("describe_task: no episode yet; call start_episode first")
        state = self.env.state.model_dump()
        obs = {**self.last, **{k: state[k] for k in ("done", "truncated", "score") if k in state}}
        return ToolResult(self._task_text(self.task) + "\n\n" + self._status(obs) + self._revealed(obs), obs)

    # -- helpers ------------------------------------------------------------------------------------------------
    def _step(self, action: MechSandboxAction) -> dict[str, Any]:
        if self.env.episode is None:
            raise ToolError("no episode yet; call start_episode first")
        obs = self.env.step(action).model_dump()
        self.last = obs
        return obs

    @staticmethod
    def _task_text(obs: dict[str, Any]) -> str:
        return (
            f"{obs['prompt']}\n\nAnswer schema (JSON): {json.dumps(obs['answer_schema'])}\n"
            f"Example answer: {json.dumps(obs['answer_example'])}\n"
            f"Task {obs['task_id']} ({obs['level']}, {obs['split']} split); "
            f"step budget {obs['max_steps']} (run_python and submit_answer each spend one)."
        )

    @staticmethod
    def _status(obs: dict[str, Any]) -> str:
        if obs.get("done"):
            how = "the step budget ran out" if obs.get("truncated") else "the answer was graded"
            score = obs.get("score")
            return f"[episode over: {how}; score {score:.3f}]" if score is not None else f"[episode over: {how}]"
        return f"[step {obs.get('step', 0)} of {obs.get('max_steps', 0)}]"

    def _with_status(self, text: str, obs: dict[str, Any]) -> str:
        return f"{text.rstrip()}\n{self._status(obs)}{self._revealed(obs)}"

    @staticmethod
    def _revealed(obs: dict[str, Any]) -> str:
        """A train episode's truth (and feedback) once it is over, however it ended; nothing otherwise."""
        if obs.get("truth") is None:
            return ""
        text = f"\ntruth: {json.dumps(obs['truth'], default=str)}"
        return text + (f"\nfeedback: {obs['feedback']}" if obs.get("feedback") else "")

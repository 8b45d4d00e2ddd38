"""The request and response bodies of the HTTP episode routes (``/reset``, ``/step``, ``/state``) as
pydantic models, and the pieces that put them into the published OpenAPI document.

Why the handlers do not let FastAPI parse these models: every refusal keeps its status and its
one-line ``detail`` (bad JSON or a non-object body is a 400, a bad reset field is the 400 that
``Service.resolve`` words for HTTP and WebSocket alike, a bad action a 422), where FastAPI's body
validation would answer with its own 422 list. So the handlers keep their parsing, and the models are
the published contract: ``request_body`` points an operation at one, ``component_schemas`` writes them
into ``components/schemas``. ``tests/test_api_document.py`` checks that every reset body the model
accepts, the service accepts too, but for the two checks only the running service can make (that
``task_id`` names one of its families, and that a test ``index`` is below its ``test_instances``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.json_schema import models_json_schema

from ..models import MechSandboxAction, MechSandboxObservation
from ..protocol import one_line
from ..results.schema import MAX_AGENT, MAX_NOTES
from ..tasks import LEVELS
from .splits import SPLITS, TRAIN_SEED_LIMIT

REF_PREFIX = "#/components/schemas/"

# Literal[("a", "b")] is Literal["a", "b"]: the allowed values come from the one place that defines them.
Level = Literal[LEVELS]  # type: ignore[valid-type]
Split = Literal[SPLITS]  # type: ignore[valid-type]


class ResetRequest(BaseModel):
    """Body of POST /reset (the WebSocket reset takes the same names). Every field is optional: an empty
    body starts the server's default task."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"task_id": "dead-neurons", "seed": 3}, {}]}
    )

    # Not an enum of the families: a schema fuzzer would then open an episode of every family, and
    # generating a transformer family's instance takes seconds. An unknown name is a one-line 400.
    task_id: str | None = Field(
        default=None, description="A family id or alias (GET /tasks lists them); default: the server's default task"
    )
    seed: int | None = Field(
        default=None, ge=0, lt=TRAIN_SEED_LIMIT, description="Train split: the instance's seed (random when omitted)"
    )
    level: Level | None = Field(default=None, description="Difficulty level (default easy)")
    task_level: Level | None = Field(default=None, description="Another name for level (level wins when both are set)")
    split: Split | None = Field(default=None, description="train (default) or test (held-out instances, by index)")
    index: int = Field(
        default=0, ge=0, description="Test split: which held-out instance, below GET /tasks test_instances_per_level"
    )
    run_token: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Test split: the token POST /runs returned; the run's first episode of an instance is counted",
    )
    episode_id: str | None = Field(
        default=None,
        description="Ignored over HTTP (the server issues the episode_id that /step routes by); on the WebSocket, "
        "the episode's label in observations and state",
    )
    resume_token: str | None = Field(
        default=None,
        min_length=32,
        max_length=128,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Optional: the token that will resume this episode after a dropped connection (default: the server "
        "chooses one and returns it in the reset observation); choosing it lets a client resume even a reset whose "
        "reply was lost",
    )
    resume: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Take back an episode after a dropped connection: its resume_token (same client, within "
        "MECHSANDBOX_RESUME_GRACE_S on the WebSocket); the reply is the episode's last observation, with resumed=true",
    )

    @model_validator(mode="after")
    def _test_split_has_no_seed(self) -> ResetRequest:
        if self.split == "test" and self.seed is not None:
            raise ValueError("test instances are chosen by index, not seed")
        return self


class RunRequest(BaseModel):
    """Body of POST /runs: who is playing. The answer's ``run_token`` goes into every test-split reset."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"agent": "my-agent", "model": "Qwen/Qwen2.5-72B-Instruct", "notes": "v3"}]},
    )

    agent: str = Field(min_length=1, max_length=MAX_AGENT, description="The agent's name (shown on the leaderboard)")
    model: str = Field(default="", max_length=MAX_AGENT, description="The model behind it, if any")
    notes: str = Field(default="", max_length=MAX_NOTES, description="Free text: prompt version, settings, a link")

    @field_validator("agent", "model", "notes")
    @classmethod
    def _printable(cls, value: str, info: ValidationInfo) -> str:
        allowed = "\n\t" if info.field_name == "notes" else ""
        if any((ord(c) < 32 or 127 <= ord(c) < 160) and c not in allowed for c in value):
            raise ValueError(f"{info.field_name} must not contain control characters")
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise ValueError(f"{info.field_name} must be valid Unicode (no lone surrogates)")
        return value


class RunResponse(BaseModel):
    """Answer of POST /runs. The token is shown once: the server stores only its hash."""

    run_id: str
    run_token: str = Field(description="Secret: pass it as run_token in test-split resets")
    salt_fingerprint: str = Field(description="Names the test set this run plays (a hash, never the salt)")
    benchmark_version: str
    standard_set: dict[str, Any] = Field(description="What a complete run attempts: instances per level, levels, tasks")


class StepRequest(BaseModel):
    """Body of POST /step: one action in the HTTP episode that /reset opened (other fields are ignored)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"action": {"python_code": "print(model)"}, "episode_id": "<from /reset>"}]},
    )

    action: MechSandboxAction = Field(
        description="Exactly one of python_code, solution_target, solution_from (metadata is accepted and unused)"
    )
    episode_id: str = Field(description="The episode_id returned by /reset")


class EpisodeResponse(BaseModel):
    """What /reset and /step answer: OpenEnv's observation envelope, plus the episode_id."""

    observation: MechSandboxObservation = Field(description="The observation (its reward and done are given beside it)")
    reward: float | None = Field(description="None after reset; the step's reward after a step")
    done: bool
    episode_id: str | None = Field(description="The token /step and /state need")


class ErrorDetail(BaseModel):
    """Every refusal: one line, no traceback."""

    detail: str


ERRORS = {
    400: "Bad request: not JSON, not an object, an invalid reset field, or no episode_id",
    401: "Missing or wrong bearer token (only when the server has one)",
    403: "A run is needed (test split on a fixed-salt server) or the run_token is unknown",
    404: "Unknown or expired episode_id (or run_id)",
    409: "The episode is over",
    413: "The request body is larger than the server's limit",
    421: "The episode_id belongs to another replica (a load balancer did not route it by its tag, or that replica is "
    "gone)",
    422: "An invalid action, or JSON nested too deeply",
    429: "The session cap, the step rate limit or the run registration quota was reached",
    503: "The sandbox or the results database is not available right now (nothing was counted; retry)",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these refusals (each with the one-line ``ErrorDetail`` body)."""
    return {code: {"model": ErrorDetail, "description": ERRORS[code]} for code in codes}


def request_body(model: type[BaseModel], required: bool) -> dict[str, Any]:
    """An ``openapi_extra`` that documents ``model`` as the JSON body of an operation that parses its own."""
    schema = {"$ref": f"{REF_PREFIX}{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def component_schemas(*models: type[BaseModel]) -> dict[str, Any]:
    """The JSON schemas of ``models`` and of the models they use, with references into ``components/schemas``."""
    _, document = models_json_schema([(m, "validation") for m in models], ref_template=REF_PREFIX + "{model}")
    return document.get("$defs", {})


def validation_message(exc: ValidationError | Any) -> str:
    """A pydantic (or FastAPI request) validation report as one line, at most three problems, each as
    'field: message' (a message that already names its field keeps its own wording). Shared by the HTTP routes'
    422s and the tools' refusals (server/tools.py)."""
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "__root__"))
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        field = where.rsplit(".", 1)[-1]
        named = where and msg.startswith((f"{field}:", f"{field} "))  # the action's own messages name the field
        parts.append(f"{where}: {msg}" if where and not named else msg)
    return one_line("; ".join(parts) or "invalid request")

"""A typed client for MechSandbox on OpenEnv's ``EnvClient`` (WebSocket; one session per client).

>>> from mechsandbox.client import MechSandboxEnv
>>> with MechSandboxEnv(base_url="http://localhost:8000").sync() as env:
...     obs = env.reset(task_id="copy-head", seed=3, level="easy").observation
...     print(env.run("print(model.cfg.n_heads)").observation.stdout_or_error)
...     result = env.submit([[1, 4]])
...     print(result.observation.score, result.done)

``run``, ``submit`` and ``submit_from`` are shorthands for ``step`` with the three kinds of action;
the async client awaits them, ``.sync()`` gives the blocking form. OpenEnv's ``GenericEnvClient``
works against the same server with plain dicts.
"""

from __future__ import annotations

from typing import Any

from .models import MechSandboxAction, MechSandboxObservation, MechSandboxState
from .openenv_core import EnvClient, StepResult


class MechSandboxEnv(EnvClient[MechSandboxAction, MechSandboxObservation, MechSandboxState]):
    def _step_payload(self, action: MechSandboxAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MechSandboxObservation]:
        fields = dict(payload.get("observation", {}))
        fields.update(reward=payload.get("reward"), done=payload.get("done", False))
        obs = MechSandboxObservation(**fields)
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> MechSandboxState:
        return MechSandboxState(**payload)

    def run(self, code: str) -> Any:
        """Run a snippet in the episode's sandbox (a code step)."""
        return self.step(MechSandboxAction(python_code=code))

    def submit(self, answer: Any) -> Any:
        """Submit an answer as JSON (graded once; ends the episode unless malformed)."""
        return self.step(MechSandboxAction(solution_target=answer))

    def submit_from(self, name: str) -> Any:
        """Submit the value of a sandbox variable (converted and checked inside the sandbox)."""
        return self.step(MechSandboxAction(solution_from=name))

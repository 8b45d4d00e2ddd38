"""Floor 2 for bench/e2e.py: a minimal OpenEnv environment (echo) served by OpenEnv's own create_app."""

from __future__ import annotations

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    python_code: str | None = None


class EchoObservation(Observation):
    stdout_or_error: str = ""


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="echo", step_count=0)

    def reset(self, **kwargs: object) -> EchoObservation:
        self._state = State(episode_id="echo", step_count=0)
        return EchoObservation(stdout_or_error="", reward=None)

    def step(self, action: EchoAction, **kwargs: object) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(stdout_or_error="1\n", reward=0.01)

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=128)

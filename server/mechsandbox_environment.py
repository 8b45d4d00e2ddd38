"""The OpenEnv adapter: one ``MechSandboxEnvironment`` per WebSocket connection (and a throwaway one
for OpenEnv's metadata and task routes). It only translates between OpenEnv's types and the
framework-free ``Service``/``Episode``; all rules live in ``episode.py``.

>>> env = MechSandboxEnvironment(service=service)
>>> obs = env.reset(task_id="copy-head", seed=3, level="easy")
>>> obs = env.step(MechSandboxAction(python_code="print(model.cfg)"))
>>> obs = env.step(MechSandboxAction(solution_target=[[1, 4]]))
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from .. import BENCHMARK_VERSION
from ..models import MechSandboxAction, MechSandboxObservation, MechSandboxState
from ..openenv_core import Environment, EnvironmentMetadata
from ..protocol import ACTION_FIELDS
from ..tasks import LEVELS, families
from .clients import LOCAL, Client
from .episode import Episode, EpisodeError, InfraFailure
from .service import Service
from .splits import SPLITS

if TYPE_CHECKING:
    from .tools import EpisodeTools

log = logging.getLogger("mechsandbox.server")
T = TypeVar("T")

ENV_NAME = "mechsandbox"
DESCRIPTION = (
    "Mechanistic-interpretability tasks with exact ground truth: probe a small PyTorch model with Python snippets "
    "in a sandbox, then submit what the planted mechanism is."
)


MAX_LABEL = 128


def episode_label(episode_id: Any) -> str | None:
    """A WebSocket reset's ``episode_id``, checked: the client's name for its episode (OpenEnv's reset takes one and
    its runtime validation expects it back in ``state``), at most 128 printable characters; None when not given."""
    if episode_id is None:
        return None
    if not isinstance(episode_id, str) or not 1 <= len(episode_id) <= MAX_LABEL or not episode_id.isprintable():
        raise EpisodeError(f"episode_id must be a string of 1 to {MAX_LABEL} printable characters")
    return episode_id


class MechSandboxEnvironment(Environment[MechSandboxAction, MechSandboxObservation, MechSandboxState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, service: Service):
        super().__init__()
        self.service = service
        self.episode: Episode | None = None
        self.ever_reset = False  # a session never reset holds its slot only ``unreset_timeout_s``
        self.expired = False  # set when OpenEnv's session table drops it (reaped or closed)
        self.client: Client = LOCAL  # who opened the session (set by the server that creates it): its quota, resumes
        self.park_on_close = False  # set by the server when the session's connection dropped (``close`` parks then)
        # Calls under way and when the last one ended: the never-reset reaper leaves a session alone while a call is
        # under way (a first reset may generate its instance for longer than ``unreset_timeout_s`` on a busy machine)
        # and counts its timeout from the end of the last call.
        self.calls = 0
        self.touched_at = time.time()
        self._calls_lock = threading.Lock()

    @contextmanager
    def _call(self) -> Iterator[None]:
        with self._calls_lock:
            self.calls += 1
        try:
            yield
        finally:
            with self._calls_lock:
                self.calls -= 1
                self.touched_at = time.time()

    def _guarded(self, work: Callable[[], T]) -> T:
        """Run a reset or step: a client's mistake stays an ``EpisodeError``; any other exception is a fault of the
        server, logged and answered as an infrastructure error (on the WebSocket OpenEnv would otherwise send its text
        with the code an agent's mistake gets)."""
        with self._call():
            try:
                return work()
            except EpisodeError:
                raise
            except Exception as exc:
                log.exception("unexpected error in a WebSocket/MCP episode")
                raise InfraFailure(f"{type(exc).__name__} in the server; nothing was counted", "server") from None

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        level: str | None = None,
        task_level: str | None = None,
        split: str | None = None,
        index: int | None = None,
        run_token: str | None = None,
        **kwargs: Any,
    ) -> MechSandboxObservation:
        params = {"seed": seed, "task_id": task_id, "level": level, "task_level": task_level, "split": split,
                  "index": index, "run_token": run_token, **kwargs}  # fmt: skip
        params = {k: v for k, v in params.items() if v is not None}
        return self._guarded(lambda: self._reset(params, episode_id))

    def _reset(self, params: dict[str, Any], episode_id: str | None) -> MechSandboxObservation:
        if self.expired:  # a WebSocket outliving its reaped session would otherwise run uncounted episodes
            raise EpisodeError("this session has expired (idle, or never reset in time); open a new one")
        if "resume" in params:
            return self._resume(params)
        label = episode_label(episode_id)
        # The new episode opens first: a refused reset (a bad field, a full server, a database that is down)
        # leaves the current one as it was, instead of abandoning a counted attempt for nothing.
        episode = self.service.open_episode(params, transport="websocket", client=self.client, holder=self)
        episode.label = label
        self._end_episode()
        self.ever_reset = True
        if episode.holder is self:  # else a resume on another connection took it while this reset answered
            self.episode = episode
        return MechSandboxObservation(**episode.reset_observation())

    def _resume(self, params: dict[str, Any]) -> MechSandboxObservation:
        """Take back an episode whose connection went away (``Service.resume``): this session holds it from now on; a
        connection that still held it (one the client gave up on) loses it."""
        if set(params) - {"resume"}:
            raise EpisodeError("a resume takes only resume=<token> (the episode keeps its task, instance and budget)")
        episode, previous = self.service.resume(params["resume"], self.client, websocket=True, holder=self)
        if previous is not None and previous is not self and previous.episode is episode:
            previous.episode = None  # the connection the client gave up on holds it no longer
        if self.episode is not episode:
            self._end_episode()
        self.ever_reset = True
        self.episode = episode
        return MechSandboxObservation(**episode.resumed_observation())

    def step(self, action: MechSandboxAction, timeout_s: float | None = None, **kwargs: Any) -> MechSandboxObservation:
        return self._guarded(lambda: self._step(action))

    def _step(self, action: MechSandboxAction) -> MechSandboxObservation:
        episode = self.episode
        if episode is None:
            raise EpisodeError("call reset before step")
        self.service.check_rate(episode)
        payload = action.model_dump(include=set(ACTION_FIELDS))
        return MechSandboxObservation(**episode.step(payload))

    @functools.cached_property
    def tools(self) -> EpisodeTools:
        """The tool-calling surface over this environment's episode (server/tools.py; MCP's tools/call)."""
        from .tools import EpisodeTools  # tools.py imports this module

        return EpisodeTools(self)

    @property
    def state(self) -> MechSandboxState:
        if self.episode is None:
            return MechSandboxState()
        return MechSandboxState(**self.episode.state())

    def close(self) -> None:
        """OpenEnv's teardown of the session. When its connection dropped (``park_on_close``), the episode waits for a
        resume (``Service.park``), which the server ends after ``resume_grace_s``; when the client said goodbye, or a
        reaper or an MCP close ended the session, the episode ends now."""
        if self.park_on_close:
            episode, self.episode = self.episode, None
            if episode is not None and episode.holder is self:
                self.service.park(episode, self.client)
        else:
            self._end_episode()

    def _end_episode(self) -> None:
        """The episode this session held ends, replaced by a new one (a reset over the same connection)."""
        episode, self.episode = self.episode, None
        if episode is not None and episode.holder is self:
            self.service.forget(episode)
            episode.close()

    def get_metadata(self) -> EnvironmentMetadata:
        versions = ", ".join(f"{f.id}={f.family_version}" for f in families())
        return EnvironmentMetadata(
            name=ENV_NAME,
            description=f"{DESCRIPTION} Benchmark {BENCHMARK_VERSION}; family versions: {versions}.",
            version=BENCHMARK_VERSION,
            author="MechSandbox developers",
            documentation_url="https://huggingface.co/docs/openenv",
        )

    # --- OpenEnv TaskProvider: tasks are family x level; reset(split=..., index=...) picks an instance ---

    def list_splits(self) -> list[dict[str, str]]:
        return [{"name": s, "type": s} for s in SPLITS]

    def _tasks(self, split: str) -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise IndexError(split)
        out = []
        for fam in families():
            for level in LEVELS:
                out.append({
                    "id": f"{fam.id}/{level}",
                    "index": len(out),
                    "task_id": fam.id,
                    "level": level,
                    "split": split,
                    "family_version": fam.family_version,
                    "max_steps": fam.max_steps[level],
                    "instances": self.service.settings.test_instances if split == "test" else TRAIN_INSTANCES,
                    "reset": {"task_id": fam.id, "level": level, "split": split},
                })  # fmt: skip
        return out

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self._tasks(split)

    def num_tasks(self, split: str) -> int:
        return len(self._tasks(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        tasks = self._tasks(split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return tasks[index]

    def get_task_range(self, split: str, start: int, stop: int) -> list[dict[str, Any]]:
        return self._tasks(split)[start:stop]


TRAIN_INSTANCES = 2**31

"""MechSandbox as an environment of TRL's ``GRPOTrainer`` (issue 19): ``environment_factory=environment_factory()``.

TRL (1.16) runs multi-turn rollouts through environment objects: it calls the factory with no arguments (once to
read the tools, then once per rollout slot it has not filled yet, keeping the instances in a pool), calls
``reset(**row)`` with the dataset row's columns before each rollout and appends the returned text to the row's
last user message, offers every public method as a tool (the JSON schema comes from the type hints and the
Google-style docstring), and calls ``get_reward()`` once per finished rollout. Here:

- ``reset`` opens an OpenEnv session on a MechSandbox server (``url``, else ``$MECHSANDBOX_URL``, else a local
  server started for the process) and starts the row's train episode (columns ``task_id``, ``level``, ``seed``;
  a test-split row is refused: GRPO learns from the grades of every rollout it plays); it returns the task's text
  (prompt, answer schema, example, budget).
- The tools are ``run_python``, ``submit_answer`` and ``describe_task``: the server's own tools over POST /mcp,
  so the step budget, the 64 KiB cap, the one graded submission and train-only truth are the server's rules.
- ``get_reward`` is the episode's graded score in [0.01, 0.99], the floor 0.01 when nothing was graded, and
  closes the session. So a rollout holds one session from ``reset`` to ``get_reward``, and a trainer process
  holds as many as it generates rollouts at once (``per_device_train_batch_size`` x ``steps_per_generation``;
  the processes of one host share a remote server's per-client quota): a local server's cap is 64 sessions (a
  loopback client is exempt from the per-client share), a remote server gives one client a quarter of its cap
  (16 by default).

What each way a rollout can go wrong gives (tests/test_trl.py runs them through ``GRPOTrainer``):

- the step budget runs out: the server ends the episode at the floor, so the reward is 0.01; later tool calls
  are refused;
- an answer that does not fit the task's schema, or any call the server refuses (bad arguments, a request over
  its size limits, a session it reaped after ``MECHSANDBOX_IDLE_TIMEOUT_S`` of silence): the tool raises
  :class:`ToolRefused`, which TRL shows the model as the tool's result; the episode goes on where it can, and if
  no answer is graded the reward is 0.01;
- the rollout ends (no more tool calls, TRL's ``max_tool_calling_iterations`` or the completion length) before an
  answer is graded: 0.01;
- the infrastructure fails (docs/CONTRACT.md, "Harnesses and infrastructure errors"): the rollout is a sample the
  trainer drops, never a reward. ``get_reward`` returns None (TRL then leaves the rollout out of its group's
  baseline and gives it no advantage) and ``infrastructure_error`` says why. A start the server refuses for its own
  reason (an instance it could not make, a worker it could not load, a drain, its database) is tried again from a
  fresh session ``retries`` times with a backoff before the rollout is given up; a tool call the server fails that
  way raises ``protocol.InfrastructureError``, which TRL shows the model as the tool's result;
- the server goes away or stops answering (``timeout_s``): the tool call raises :class:`ServerUnavailable`; the
  process remembers the server as down (a proxy's 502/503/504 counts too), so every later call of every rollout
  fails at once with that line (a batch waits one timeout, not one per rollout), closes are skipped (the sessions
  are closed when it answers again), and ``get_reward`` of a rollout that met it before any grade returns None (a
  rollout graded before the outage keeps its reward). A ``reset`` after that probes the server for 5 s and raises
  the same way unless it answers again: a server that stays down stops training with one line instead of
  dropping every sample. ``reset`` also raises for a row the server refuses (an unknown task; no session is left
  open) and when the server stays at its session cap for ``capacity_wait_s`` (a generation batch larger than the
  cap cannot be waited out).

Nothing here imports torch or the task registry, so a trainer on one machine can play on a server on another.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx

from ..agents.base import BACKOFF_S, RETRIES
from ..protocol import FLOOR, InfrastructureError
from .mcp_client import (
    INSTRUCTIONS,
    McpError,
    ServerUnavailable,
    SyncRpc,
    capacity_delays,
    server_url,
    split_names,
    tool_text,
    unavailable,
    wait_for_capacity,
)
from .mcp_infra import infrastructure_error, refused_by_infrastructure

__all__ = ["MechSandboxEnv", "ServerUnavailable", "ToolRefused", "environment_factory", "episode_dataset"]

LEVELS = ("easy", "medium", "hard")  # tasks.LEVELS, without importing the task registry (and torch) here
START_COLUMNS = ("task_id", "level", "seed")  # the row columns start_episode takes (train episodes only)
CLOSE_TIMEOUT_S = 5.0  # closing a session is bookkeeping: never worth a rollout's full timeout
PROBE_TIMEOUT_S = 5.0  # how long reset's health probe waits on a server that stopped answering earlier

# Servers that stopped answering, by URL, with the error: every environment of the process reads it, so once one
# rollout has waited out a hung server, the batch's other rollouts, their closes and the next resets do not wait
# again (a batch of 64 would otherwise wait 64 timeouts). A reset that finds the server answering clears it, and
# closes the sessions left open while it was down (else they would hold their slots until the server's reaper).
_down: dict[str, ServerUnavailable] = {}
_orphans: dict[str, list[str]] = {}


class ToolRefused(McpError):
    """A tool call the server refused (bad arguments, an episode rule, an answer that does not fit the schema, a
    request over the server's size limits, a session the server reaped). TRL catches it and shows the model its
    one line; the episode goes on where it can."""


def _release(rpc: SyncRpc, sessions: list[str]) -> None:
    """Close the sessions still open (at ``get_reward``, at a new ``reset``, at exit), quickly: not at all on a
    server known to be down (they are kept to close when it answers again), with a short timeout otherwise."""
    while sessions:
        if rpc.url in _down:
            _orphans.setdefault(rpc.url, []).extend(sessions)
            sessions.clear()
            return
        session_id = sessions.pop()
        try:
            rpc("openenv/session/close", {"session_id": session_id}, timeout_s=CLOSE_TIMEOUT_S)
        except ServerUnavailable as exc:  # hung or gone: the next closes and resets must not wait again
            _down[rpc.url] = exc
            _orphans.setdefault(rpc.url, []).append(session_id)
        except McpError:  # reaped already: nothing is left open
            pass


def _finish(rpc: SyncRpc, sessions: list[str]) -> None:
    """At garbage collection or exit: the open session, then the connection."""
    _release(rpc, sessions)
    rpc.close()


class MechSandboxEnv:
    """One rollout's MechSandbox episode, for ``GRPOTrainer(environment_factory=...)``.

    Args:
        url: the server (default ``$MECHSANDBOX_URL``, else a local server started for this process).
        timeout_s: how long one call may take before the server counts as gone (a snippet's own wall limit is 10 s
            on a default server; starting an episode may generate a transformer instance first).
        capacity_wait_s: how long ``reset`` waits for a session while the server is at its session cap. The
            rollouts generated together hold their sessions until their rewards are read, so a generation batch
            larger than the server's cap cannot be waited out: it fails with the cap's message after this long.
    """

    def __init__(self, url: str | None = None, *, timeout_s: float = 120.0, capacity_wait_s: float = 30.0,
                 retries: int = RETRIES, backoff_s: float = BACKOFF_S):  # fmt: skip
        self._url = server_url(url)
        self._rpc = SyncRpc(self._url, timeout_s)
        self._capacity_wait_s = capacity_wait_s
        self._retries, self._backoff_s = retries, backoff_s
        self._sessions: list[str] = []  # the open session (at most one), as a list the finalizer can read
        self._state: dict[str, Any] = {}  # the episode's state from the last tool call (done, score, step, ...)
        self._lost: McpError | InfrastructureError | None = None  # the infrastructure failed during this rollout
        weakref.finalize(self, _finish, self._rpc, self._sessions)
        self._check_server(timeout_s)

    # -- TRL's environment contract --------------------------------------------------------------------------
    def reset(self, prompt: Any = None, **row: Any) -> str:
        """Start the row's train episode in a new session and return the task's text (appended to the prompt)."""
        if row.get("split") not in (None, "train") or row.get("index") is not None or row.get("run_token"):
            # GRPO plays a row num_generations times and learns from the grades: test instances are for evaluation
            # (a run counts each once), and their truth must not become a training signal
            raise ValueError("MechSandboxEnv trains on the train split only: a row with split test, an index or a "
                             "run_token names a test instance; give rows task_id, level and seed")
        self._end_episode()  # a previous rollout whose reward was never read
        start = {name: row[name] for name in START_COLUMNS if row.get(name) is not None}
        attempt = 0
        while True:
            self._state, self._lost = {}, None
            if self._url in _down:
                self._check_server(PROBE_TIMEOUT_S)  # back? then go on; still down: raise at once
            try:
                self._sessions.append(self._open_session())
                text = self._call("start_episode", start)
                break
            except InfrastructureError as exc:  # the server's side, before the first observation: safe to retry
                self._end_episode()
                if attempt >= self._retries:
                    self._lost = exc  # given up: the rollout is dropped (get_reward is None)
                    text = (f"The episode could not be started ({exc}); nothing you do in it is scored. "
                            "Reply without calling a tool.")  # fmt: skip
                    break
                time.sleep(self._backoff_s * 2**attempt)
                attempt += 1
            except McpError:
                self._end_episode()  # a refused row leaves no session behind
                raise
        return f"\n\n{text}" if _has_text(prompt) else text

    def run_python(self, code: str) -> str:
        """Run Python in the episode's sandbox and return what it printed, or its error.

        The model under study and its probe data are in the namespace, and variables persist between calls. Each
        call spends one step of the episode's budget.

        Args:
            code: Python source (at most 64 KiB); print what you want to see.
        """
        return self._call("run_python", {"code": code})

    def submit_answer(self, answer: Any = None, variable: str | None = None) -> str:
        """Submit the final answer; it is graded once and a graded answer ends the episode.

        Give exactly one of the two arguments. An answer that does not fit the task's answer schema is refused
        without a grade (the step is spent) and may be submitted again.

        Args:
            answer: The answer as a JSON value, in the shape the task's answer schema describes.
            variable: The name of a sandbox variable that holds the answer.
        """
        arguments = {name: value for name, value in (("answer", answer), ("variable", variable)) if value is not None}
        text = self._call("submit_answer", arguments)
        if not self._state.get("done"):
            raise ToolRefused(text)  # not graded: an error, so TRL counts it and the model sees it as one
        return text

    def describe_task(self) -> str:
        """Show the task again with the steps used and left, and whether the episode has ended. Free: no step."""
        return self._call("describe_task", {})

    def get_reward(self) -> float | None:
        """The episode's graded score; the floor (0.01) when no answer was graded; None (a sample the trainer
        drops) when the infrastructure failed before a grade (``infrastructure_error`` says how). Closes the
        rollout's session (``episode_state`` stays readable until the next ``reset``, for reward functions that run
        after this)."""
        self._end_episode()
        if self._state.get("done") and self._state.get("score") is not None:
            return float(self._state["score"])  # graded before the infrastructure failed: a real reward
        if self._lost is not None:
            return None
        return FLOOR

    # -- for reward functions and logging (properties: TRL offers only methods as tools) ----------------------
    @property
    def episode_state(self) -> dict[str, Any]:
        """The episode's state as of the last tool call (task_id, level, step, max_steps, done, score, ...)."""
        return dict(self._state)

    @property
    def infrastructure_error(self) -> str | None:
        """Why this rollout is dropped (its ``get_reward`` is None): the infrastructure failure, or None."""
        return None if self._lost is None else str(self._lost)

    @property
    def url(self) -> str:
        """The server this environment plays on."""
        return self._url

    # -- internals --------------------------------------------------------------------------------------------
    def _end_episode(self) -> None:
        _release(self._rpc, self._sessions)

    def _check_server(self, timeout_s: float) -> None:
        """GET /health: at construction, so a wrong URL fails when the trainer is built rather than at its first
        rollout; at a reset after an outage, so a server that came back is used again."""
        try:
            response = self._rpc.http.get("/health", timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise self._mark_down(unavailable(self._url, "health", exc)) from None
        if response.status_code != 200:
            raise ServerUnavailable(f"health: the MechSandbox server at {self._url} answered HTTP "
                                    f"{response.status_code}: {response.text[:200]}")  # fmt: skip
        _down.pop(self._url, None)
        _release(self._rpc, _orphans.pop(self._url, []))  # back: free what was left open while it was down

    def _mark_down(self, exc: ServerUnavailable) -> ServerUnavailable:
        _down[self._url] = exc
        return exc

    def _open_session(self) -> str:
        delays = capacity_delays(self._capacity_wait_s)
        while True:
            try:
                return self._rpc("openenv/session/create", {})["session_id"]
            except ServerUnavailable as exc:
                raise self._mark_down(exc) from None
            except McpError as exc:
                failure = infrastructure_error(exc, started=False)
                if failure is not None:
                    raise failure from None
                try:
                    delay = wait_for_capacity(exc, delays)
                except McpError:
                    if exc.at_capacity:
                        raise McpError(f"{exc} after waiting {self._capacity_wait_s:g} s: each rollout generated "
                                       "at once holds a session until its reward is read, so the generation batch "
                                       "must fit the server's session cap (MECHSANDBOX_SESSION_CAP) and, for a "
                                       "remote client, its share (MECHSANDBOX_CLIENT_SHARE)", exc.code,
                                       exc.data) from None  # fmt: skip
                    raise
            time.sleep(delay)

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._lost is not None:
            raise self._lost
        down = _down.get(self._url)
        if down is not None:  # another rollout found the server gone: fail at once, do not wait again
            self._lost = down
            raise down
        if not self._sessions:
            raise ToolRefused(f"{name}: no episode is running (the environment's reset starts one)")
        params = {"name": name, "arguments": arguments, "session_id": self._sessions[-1]}
        started = name != "start_episode"
        try:
            result = self._rpc("tools/call", params)
        except ServerUnavailable as exc:
            self._lost = self._mark_down(exc)
            raise
        except McpError as exc:  # the server's own failure, or refused before the tool ran (too large, reaped, ...)
            failure = infrastructure_error(exc, started)
            if failure is None:
                raise ToolRefused(str(exc), exc.code, exc.data) from None
            self._lost = failure
            raise failure from None
        text = tool_text(result)
        if result.get("isError"):
            side = refused_by_infrastructure(name, text)
            if side is not None:  # the server refused for its own reason (a server before JSON-RPC's form)
                self._lost = InfrastructureError(side, text.partition(": ")[2], started=started)
                raise self._lost
            raise ToolRefused(text)
        if result.get("structuredContent"):
            self._state = result["structuredContent"]
        return text

    def __enter__(self) -> MechSandboxEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self._end_episode()


def _has_text(prompt: Any) -> bool:
    """Whether the row's prompt ends in a non-empty message (then the task text is set off by a blank line)."""
    if isinstance(prompt, str):
        return bool(prompt.strip())
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return bool(str(prompt[-1].get("content") or "").strip())
    return False


def environment_factory(url: str | None = None, **options: Any) -> Callable[[], MechSandboxEnv]:
    """What ``GRPOTrainer(environment_factory=...)`` takes: a no-argument callable making environments on ``url``
    (see :class:`MechSandboxEnv` for ``timeout_s`` and ``capacity_wait_s``)."""
    return functools.partial(MechSandboxEnv, url, **options)


def episode_dataset(
    tasks: str | Sequence[str],
    levels: str | Sequence[str] = "easy",
    seeds: int | Iterable[int] = 8,
    instructions: str = INSTRUCTIONS,
) -> Any:
    """A ``datasets.Dataset`` of train episodes: one row per (task, level, seed), with a conversational ``prompt``
    (the instructions; ``reset`` appends the task's own text) and the columns ``reset`` starts the episode from.
    ``seeds`` is a count (seeds 0..n-1) or the seeds themselves. GRPO plays each row ``num_generations`` times: the
    group shares one instance, so the advantages compare the policy's attempts at the same model."""
    from datasets import Dataset

    names, level_names = split_names(tasks), split_names(levels)
    unknown = [level for level in level_names if level not in LEVELS]
    if unknown:  # here, not at the first reset in the middle of training (task ids are the server's to check)
        raise ValueError(f"episode_dataset: unknown level {unknown[0]!r}; the levels are {', '.join(LEVELS)}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    rows = [(t, v, s) for t in dict.fromkeys(names) for v in dict.fromkeys(level_names) for s in seed_list]
    if not rows:
        raise ValueError("episode_dataset: no tasks, levels or seeds")
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": instructions}] for _ in rows],
        "task_id": [t for t, _, _ in rows],
        "level": [v for _, v, _ in rows],
        "seed": [s for _, _, s in rows],
    })  # fmt: skip

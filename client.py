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

What it adds to OpenEnv's client, so that an episode is lost only when the agent loses it (docs/CONTRACT.md, "When the
infrastructure fails"):

- **Named failures.** A failure that is not the agent's raises ``InfrastructureError`` (``mechsandbox.protocol``) with
  its side, never a ``RuntimeError`` that reads like the agent's mistake: the server's ``INFRASTRUCTURE_ERROR`` and
  ``CAPACITY_REACHED`` frames, a connection that cannot be made, one that dropped and could not be resumed. Harnesses
  record those apart from scores.
- **Resume, never a silent fresh session.** Every reset carries a ``resume_token`` the client chose. When the
  connection drops or stalls mid-episode, OpenEnv's client would open a fresh server session on the next call, where
  the episode does not exist; this one reconnects and resumes the same episode (``reset(resume=token)``), learns from
  the reply whether its last action was taken (the step number), and sends it again only if it was not.
- **Steps the server refused for its own reasons are sent again** (a step with no sandbox worker, a results database
  that is down: neither was counted), a few times with a short backoff, before the failure is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from websockets.exceptions import ConnectionClosed

from .models import MechSandboxAction, MechSandboxObservation, MechSandboxState
from .openenv_core import EnvClient, StepResult
from .protocol import INFRA_CODE, InfrastructureError, infra_side

CONNECTION_ERRORS = (ConnectionClosed, ConnectionError, OSError, asyncio.TimeoutError)
NOTHING_TO_RESUME = "no episode to resume"  # the server's refusal of a resume (server/service.py, NothingToResume)
STILL_STARTING = "is still starting"  # a resume that came before the reset it resumes had finished


class ServerError(RuntimeError):
    """An error frame that is the client's or the agent's to fix (a bad field, a rule of the episode). Its text is
    OpenEnv's (``Server error: ... (code: ...)``), so code that caught OpenEnv's ``RuntimeError`` still does."""

    def __init__(self, message: str, code: str):
        super().__init__(f"Server error: {message} (code: {code})")
        self.message, self.code = message, code


class MechSandboxEnv(EnvClient[MechSandboxAction, MechSandboxObservation, MechSandboxState]):
    def __init__(self, *args: Any, resume_window_s: float = 60.0, step_retries: int = 3, **kwargs: Any):
        """``resume_window_s``: how long a dropped connection is retried and resumed before the episode is given up as
        an infrastructure error (the server keeps it ``MECHSANDBOX_RESUME_GRACE_S``, 120 s by default);
        ``step_retries``: how often a step the server refused for its own reasons is sent again."""
        super().__init__(*args, **kwargs)
        self._resume_window_s = resume_window_s
        self._step_retries = step_retries
        self._resume_token: str | None = None
        self._live = False  # an episode is under way: its reset answered and it has not ended
        self._step_no = 0  # the step number of the last observation received
        self._recovering = False  # a resume is under way: a failed connect is retried, not raised

    # --- OpenEnv's hooks ---------------------------------------------------------------------------------------------

    def _step_payload(self, action: MechSandboxAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MechSandboxObservation]:
        fields = dict(payload.get("observation", {}))
        fields.update(reward=payload.get("reward"), done=payload.get("done", False))
        obs = MechSandboxObservation(**fields)
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> MechSandboxState:
        return MechSandboxState(**payload)

    async def _reset_async(self, **kwargs: Any) -> StepResult[MechSandboxObservation]:
        if "resume" not in kwargs:  # the token is chosen here, so even a reset whose reply is lost can be resumed
            kwargs.setdefault("resume_token", secrets.token_urlsafe(24))
        return await super()._reset_async(**kwargs)

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        kind = message.get("type")
        if kind not in ("reset", "step"):
            return self._checked(await self._exchange(message), started=self._live)
        if kind == "reset":
            self._live = False
            self._resume_token = message.get("data", {}).get("resume") or message.get("data", {}).get("resume_token")
            if not self._connected():
                await self._ensure_connected()  # a server that cannot be reached at all: nothing to resume, say so now
        started = kind == "step" and self._live
        for attempt in range(self._step_retries + 1):
            try:
                if started and not self._connected():  # never a step into a fresh session where the episode is not
                    raise ConnectionError("the connection had closed")
                response = await self._exchange(message)
            except CONNECTION_ERRORS as exc:
                response = await self._recover(message, exc, started)
            try:
                checked = self._checked(response, started=started)
            except InfrastructureError as exc:
                if not started or exc.side not in ("sandbox", "database") or attempt == self._step_retries:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)  # a step the server refused and did not count: send it again
                continue
            self._note(checked)
            return checked
        raise AssertionError("unreachable")

    # --- the exchange, its failures and the resume ------------------------------------------------------------------

    async def _connect_async(self) -> MechSandboxEnv:
        """OpenEnv's connect; a server that cannot be reached is an ``InfrastructureError`` (``connection``), except
        while a resume is retrying (it tries again)."""
        try:
            await super()._connect_async()
        except ConnectionError as exc:
            if self._recovering:
                raise
            text = f"could not connect: {_describe(exc)}"
            raise InfrastructureError("connection", text, started=self._live) from None
        return self

    def _connected(self) -> bool:
        ws = self._ws
        return ws is not None and getattr(ws, "state", None) is not None and ws.state.name == "OPEN"

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply on the current connection (connecting first when there is none)."""
        # a refused session sends an error frame, then closes: read the frame (recv re-raises if none)
        with contextlib.suppress(ConnectionClosed):
            await self._send(message)
        return await self._receive()

    def _checked(self, response: dict[str, Any], started: bool) -> dict[str, Any]:
        """The response, or the exception its error frame means."""
        if response.get("type") != "error":
            return response
        data = response.get("data") or {}
        message, code = str(data.get("message", "Unknown error")), str(data.get("code", "UNKNOWN"))
        if code == INFRA_CODE:
            raise InfrastructureError(str(data.get("side") or infra_side(message) or "server"), message,
                                      started=started)  # fmt: skip
        if code == "CAPACITY_REACHED":
            raise InfrastructureError("capacity", message, started=started)
        raise ServerError(message, code)

    def _note(self, response: dict[str, Any]) -> None:
        """Follow the episode: whether one is under way, and its step number."""
        if response.get("type") != "observation":
            return
        obs = (response.get("data") or {}).get("observation") or {}
        self._step_no = int(obs.get("step") or 0)
        self._live = not bool((response.get("data") or {}).get("done", False))

    async def _recover(self, message: dict[str, Any], cause: BaseException, started: bool) -> dict[str, Any]:
        """After a dropped or stalled connection: reconnect, resume the episode and return the reply ``message`` would
        have had (the resumed observation when the server had taken it, else the reply to sending it again). Raises
        ``InfrastructureError('connection')`` when that is impossible within ``resume_window_s``."""
        token = self._resume_token
        if token is None or message.get("type") not in ("reset", "step"):
            raise InfrastructureError("connection", f"the connection failed: {_describe(cause)}",
                                      started=started) from None  # fmt: skip
        self._recovering = True
        try:
            return await self._resume(message, cause, started, token)
        finally:
            self._recovering = False

    async def _resume(self, message: dict[str, Any], cause: BaseException, started: bool, token: str) -> dict[str, Any]:
        deadline = time.monotonic() + self._resume_window_s
        delay = 0.25
        while True:
            try:
                await self._drop_connection()
                reply = await self._exchange({"type": "reset", "data": {"resume": token}})
                if reply.get("type") == "error":
                    text = str((reply.get("data") or {}).get("message", ""))
                    if NOTHING_TO_RESUME in text and message.get("type") == "reset" and "resume" not in message["data"]:
                        return await self._exchange(message)  # the reset never reached the server: send it now
                    if STILL_STARTING not in text:
                        raise InfrastructureError("connection", f"the connection dropped ({_describe(cause)}) and the "
                                                  f"episode could not be resumed: {text}", started=started)  # fmt: skip
                    raise ConnectionError(text)  # the reset being resumed is still under way: wait and resume again
                if message.get("type") == "reset":
                    return reply
                obs = (reply.get("data") or {}).get("observation") or {}
                taken = int(obs.get("step") or 0) > self._step_no or bool((reply.get("data") or {}).get("done"))
                return reply if taken else await self._exchange(message)
            except CONNECTION_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    text = (f"the connection dropped ({_describe(cause)}) and could not be made again within "
                            f"{self._resume_window_s:g} s: {_describe(exc)}")  # fmt: skip
                    raise InfrastructureError("connection", text, started=started) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)

    async def _drop_connection(self) -> None:
        """Forget the current connection (the server parks its episode for a resume); the next send opens another."""
        ws, self._ws, self._ws_loop = self._ws, None, None
        if ws is not None:
            self._schedule_socket_close(ws)

    # --- shorthands --------------------------------------------------------------------------------------------------

    def run(self, code: str) -> Any:
        """Run a snippet in the episode's sandbox (a code step)."""
        return self.step(MechSandboxAction(python_code=code))

    def submit(self, answer: Any) -> Any:
        """Submit an answer as JSON (graded once; ends the episode unless malformed)."""
        return self.step(MechSandboxAction(solution_target=answer))

    def submit_from(self, name: str) -> Any:
        """Submit the value of a sandbox variable (converted and checked inside the sandbox)."""
        return self.step(MechSandboxAction(solution_from=name))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}" if str(exc) else type(exc).__name__

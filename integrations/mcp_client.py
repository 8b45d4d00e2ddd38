"""A client of a MechSandbox server's POST /mcp, shared by the Inspect task (async) and the TRL environment (sync).

Why one module: both integrations open an OpenEnv session per episode, call the four episode tools
(server/tools.py) in it and close it; the reply forms (a JSON-RPC result, a JSON-RPC error, an HTTP error page
from a proxy), the bearer token, the wait for a free session at the server's cap and the server a caller plays on
(``url``, ``$MECHSANDBOX_URL``, or a local server started once per process) must be read the same way by both,
or one of them would start misreading a refusal as a result.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

URL_ENV = "MECHSANDBOX_URL"
TOKEN_ENV = "MECHSANDBOX_API_TOKEN"  # the bearer token of a server that requires one (the server's own setting)
SERVER_ERROR = -32000  # JSON-RPC's server-error code: OpenEnv's answer when the session cap is reached
INSTRUCTIONS = (  # what an agent is told about the episode tools, before the task's own text
    "You are doing mechanistic interpretability on a small PyTorch model with a planted mechanism. Probe it with the "
    "run_python tool (the model and its probe data are in the namespace; variables persist; every call spends one "
    "step of the budget), then call submit_answer once with the answer the task's schema describes. describe_task "
    "shows the task again and the steps left, for free."
)

_local_lock = threading.Lock()
_local_server: Any = None


class McpError(RuntimeError):
    """A JSON-RPC error from /mcp (an unknown or reaped session, the session cap, a refused request)."""

    def __init__(self, message: str, code: int | None = None, data: Any = None):
        super().__init__(message)
        self.code = code
        self.data = data

    @property
    def at_capacity(self) -> bool:
        """The server's session cap (or this client's share of it): OpenEnv's -32000 with the cap in ``data``.
        Its other -32000 (the environment could not be built) carries no cap and is not worth waiting for."""
        if isinstance(self.data, dict) and self.data.get("side") == "capacity":  # an infrastructure error (issue 52)
            return True
        if self.code != SERVER_ERROR:
            return False
        if isinstance(self.data, dict):
            return "max_sessions" in self.data
        return "capacity" in str(self).lower()  # a server that does not forward OpenEnv's data (before 2026-12-02)


class ServerUnavailable(McpError):
    """The server could not be reached, or did not answer within the timeout: nothing in the episode can go on."""


def server_url(url: str | None = None) -> str:
    """The server to play on: ``url``, ``$MECHSANDBOX_URL``, or a local server started once per process (and
    stopped at exit)."""
    global _local_server
    chosen = url or os.environ.get(URL_ENV)
    if chosen:
        return chosen.rstrip("/")
    with _local_lock:
        if _local_server is None:
            import tempfile

            from ..evaluation.local_server import LocalServer

            log = os.path.join(tempfile.mkdtemp(prefix="mechsandbox-local-"), "server.log")
            try:
                _local_server = LocalServer(log_path=log).start()
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; its log: {log}") from None
            atexit.register(_local_server.stop)
        return _local_server.url


def headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def request_body(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def unavailable(url: str, method: str, exc: httpx.HTTPError) -> ServerUnavailable:
    """The one-line error for a transport failure (refused connection, timeout, a dropped reply)."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return ServerUnavailable(f"{method}: the MechSandbox server at {url} did not answer ({reason})")


def rpc_result(url: str, method: str, response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC result of ``response``; :class:`McpError` for an error reply or anything that is not JSON-RPC
    (a proxy's error page, a 401 from a server that wants a token)."""
    try:
        reply = response.json()
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or ("result" not in reply and "error" not in reply):
        # a proxy's 502/503/504 page: the server behind it is down or hung, not refusing this request
        gone = ServerUnavailable if response.status_code in (502, 503, 504) else McpError
        raise gone(f"{method}: HTTP {response.status_code} from {url}/mcp: {response.text[:200]}")
    if "error" in reply:
        error = reply["error"] if isinstance(reply["error"], dict) else {}
        raise McpError(f"{method}: {error.get('message')} (code {error.get('code')})", error.get("code"),
                       error.get("data"))  # fmt: skip
    return reply["result"]


def tool_text(result: dict[str, Any]) -> str:
    """A tools/call result's text (the episode tools answer with one text part)."""
    return "".join(part.get("text", "") for part in result.get("content", []) if isinstance(part, dict))


def capacity_delays(wait_s: float) -> Iterator[float]:
    """Back-off delays (0.5 s doubling to 10 s) while the server is at its session cap, ``wait_s`` in all."""
    delay, waited = 0.5, 0.0
    while waited < wait_s:
        delay = min(delay, wait_s - waited)
        yield delay
        waited, delay = waited + delay, min(delay * 2, 10.0)


def wait_for_capacity(exc: McpError, delays: Iterator[float]) -> float:
    """The next delay before asking for a session again, when ``exc`` says the server is full and ``delays`` has
    one left; otherwise ``exc`` is the answer and is raised."""
    delay = next(delays, None) if exc.at_capacity else None
    if delay is None:
        raise exc
    return delay


def split_names(value: str | Sequence[str]) -> list[str]:
    """A comma-separated string (a CLI argument) or a list, as a list of non-empty names."""
    names = value.split(",") if isinstance(value, str) else value
    return [name.strip() for name in names if name.strip()]


async def rpc(url: str, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One JSON-RPC call to ``url``/mcp (a fresh async client: Inspect runs samples on its own event loops)."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=headers()) as http:
            response = await http.post("/mcp", json=request_body(method, params))
    except httpx.HTTPError as exc:
        raise unavailable(url, method, exc) from None
    return rpc_result(url, method, response)


class SyncRpc:
    """JSON-RPC calls to one server over a kept-alive connection, for callers that are not async (TRL's tools)."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float = 10.0):
        self.url = url
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.http = httpx.Client(base_url=url, timeout=timeout, headers=headers())

    def __call__(self, method: str, params: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        try:
            extra = {} if timeout_s is None else {"timeout": timeout_s}
            response = self.http.post("/mcp", json=request_body(method, params), **extra)
        except httpx.HTTPError as exc:
            raise unavailable(self.url, method, exc) from None
        return rpc_result(self.url, method, response)

    def close(self) -> None:
        self.http.close()

"""The FastAPI app: our stateful routes, then OpenEnv's (``/ws``, ``/metadata``, ``/schema``, ``/mcp``,
the Task API). Run with ``mechsandbox serve`` or ``python -m mechsandbox.server.app``.

Why our own ``/reset``, ``/step``, ``/state`` and ``/health``: OpenEnv's HTTP routes build a fresh
environment per call (so an HTTP episode could never continue), and its ``/health`` is always
"healthy". Ours keep HTTP episodes in the ``Service`` under a server-issued ``episode_id`` and report
the sandbox's real state. OpenEnv registers its own routes for those four paths; ours come first, so
Starlette never reached OpenEnv's, and ``drop_shadowed_routes`` then removes them from the route
table, which leaves exactly one operation per path and method, and an OpenAPI document (built from
``wire.py``'s models) that describes the routes that actually answer. One session cap covers
WebSocket and HTTP episodes (``SharedCapServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Iterable
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Route, WebSocketRoute

from .. import BENCHMARK_VERSION
from ..models import MechSandboxAction, MechSandboxObservation, MechSandboxState
from ..openenv_core import ConcurrencyConfig, HTTPEnvServer, SessionCapacityError, serialize_observation
from ..protocol import INFRA_CODE, infra_side, one_line
from ..results import ResultsUnavailable
from . import clients
from .episode import EpisodeError, InfraFailure
from .limits import RequestLimits
from .mcp import McpRoute
from .mechsandbox_environment import ENV_NAME, MechSandboxEnvironment
from .runs import WeakSalt
from .service import CapacityError, Service
from .settings import ServerSettings
from .web import register_web
from .wire import (
    EpisodeResponse,
    ResetRequest,
    RunRequest,
    RunResponse,
    StepRequest,
    component_schemas,
    error_responses,
    request_body,
    validation_message,
)
from .ws_frames import WebSocketFrames, connection_dropped

log = logging.getLogger("mechsandbox.server")


class SharedCapServer(HTTPEnvServer):
    """OpenEnv's server, with its session cap counting our HTTP episodes too, the per-client quota on every
    session it creates (WebSocket and ``/mcp``), and a reaper for sessions that were never used.

    Why the second reaper: OpenEnv reaps only after the idle timeout (900 s), so sessions created and
    left alone (``openenv/session/create`` in a loop) held the whole cap that long, renewably. A session
    that was never reset and never stepped is reaped after ``unreset_timeout_s``, checked at least every 5 s.
    """

    def __init__(self, *args: Any, service: Service, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.service = service

    async def _create_session(self) -> Any:
        settings = self.service.settings
        total = self.active_sessions + self.service.http_count()
        if total >= settings.session_cap:
            raise SessionCapacityError(active_sessions=total, max_sessions=settings.session_cap)
        client = clients.current()
        try:
            ticket = self.service.admit(client)
        except CapacityError as exc:
            raise SessionCapacityError(total, settings.session_cap, one_line(str(exc))) from None
        try:
            session_id, env = await super()._create_session()
        except BaseException:
            self.service.release(ticket)
            raise
        self.service.bind(ticket, session_id)
        if isinstance(env, MechSandboxEnvironment):
            env.client = client
        return session_id, env

    async def _destroy_session(self, session_id: str) -> None:
        env = self._sessions.get(session_id)
        if env is not None:
            env.expired = True  # the WebSocket that holds it may still send a reset
            # a connection that dropped leaves its episode waiting for a resume; a goodbye, a reaper or an MCP close
            # ends it (server/ws_frames.py)
            env.park_on_close = connection_dropped()
        await super()._destroy_session(session_id)

    def unused_sessions(self, now: float) -> list[str]:
        """Sessions never reset or stepped, idle for ``unreset_timeout_s`` (and no WebSocket attached to them).

        Idle means no call under way and none ended for the timeout: a first reset that is still generating its
        instance (seconds for the slowest families, far more on a busy machine) is use, and so is one that failed
        moments ago. Counted from creation alone, this reaper killed episodes whose first reset was still generating
        (issue 52: 5 of 9 episodes of an eval on a busy machine)."""
        timeout = self.service.settings.unreset_timeout_s
        unused = []
        for session_id, info in list(self._session_info.items()):
            env = self._sessions.get(session_id)
            if env is None or session_id in self._session_websocket_attachments:
                continue
            if getattr(env, "ever_reset", True) or info.step_count != 0 or getattr(env, "calls", 0) > 0:
                continue
            if now - max(info.created_at, getattr(env, "touched_at", 0.0)) > timeout:
                unused.append(session_id)
        return unused

    async def reap_unused(self) -> None:
        interval = min(5.0, self.service.settings.unreset_timeout_s / 6)
        while True:
            await asyncio.sleep(interval)
            for session_id in self.unused_sessions(time.time()):
                log.info("reaped a session never reset (%s…)", session_id[:6])
                try:
                    await self._destroy_session(session_id)
                except Exception:  # one failed teardown must not stop the reaper
                    log.exception("could not reap session %s…", session_id[:6])


def error(status: int, message: str) -> JSONResponse:
    """A one-line error body; an infrastructure failure's also names its code and side (docs/CONTRACT.md)."""
    text = one_line(message)
    body: dict[str, Any] = {"detail": text}
    side = infra_side(text)
    if side is not None:
        body.update(code=INFRA_CODE, side=side)
    return JSONResponse(body, status_code=status)


def observation_response(obs: dict[str, Any]) -> dict[str, Any]:
    body = serialize_observation(MechSandboxObservation(**obs))
    body["episode_id"] = obs.get("episode_id")
    return body


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise EpisodeError(f"the request body is not valid JSON ({type(exc).__name__})") from None


def served_keys(route: BaseRoute) -> set[tuple[str, str]]:
    """The (path, method) pairs a route answers; a WebSocket route's method is "WEBSOCKET"."""
    if isinstance(route, Route):
        return {(route.path, method) for method in route.methods or ()}
    if isinstance(route, WebSocketRoute):
        return {(route.path, "WEBSOCKET")}
    return set()


def drop_shadowed_routes(app: FastAPI) -> list[BaseRoute]:
    """Remove each route whose every (path, method) an earlier route already answers; return them.

    Starlette dispatches a request to the first route that matches it, so such a route was unreachable:
    removing it changes no answer, only what the route table and the OpenAPI document list.
    """
    served: set[tuple[str, str]] = set()
    kept: list[BaseRoute] = []
    dropped: list[BaseRoute] = []
    for route in app.router.routes:
        keys = served_keys(route)
        if keys and keys <= served:
            dropped.append(route)
            continue
        served |= keys
        kept.append(route)
    app.router.routes[:] = kept
    return dropped


def publish_schemas(app: FastAPI, models: Iterable[type[BaseModel]]) -> None:
    """Add ``models`` (the bodies our handlers parse themselves) to the app's OpenAPI components.

    FastAPI lists only the models its own parameter parsing uses; ``wire.request_body`` refers to these.
    """
    models = tuple(models)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            for name, schema in component_schemas(*models).items():
                if schemas.setdefault(name, schema) != schema:
                    raise RuntimeError(f"two different schemas are named {name!r} in the OpenAPI document")
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(service: Service | None = None) -> FastAPI:
    service = service or Service()
    settings = service.settings
    app = FastAPI(
        title="MechSandbox",
        version=BENCHMARK_VERSION,
        description="Mechanistic-interpretability benchmark and RL environment (OpenEnv protocol).",
    )
    app.state.service = service

    @app.exception_handler(EpisodeError)
    async def _episode_error(request: Request, exc: EpisodeError) -> JSONResponse:
        return error(exc.status, str(exc))

    @app.exception_handler(Exception)
    async def _server_fault(request: Request, exc: Exception) -> JSONResponse:
        """Anything else a route raises is the server's fault: an infrastructure error, never a client's mistake."""
        log.error("unexpected error on %s: %s", request.url.path, exc, exc_info=exc)
        return error(500, str(InfraFailure(f"{type(exc).__name__} in the server; nothing was counted", "server")))

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, validation_message(exc))

    @app.post(
        "/reset",
        tags=["Episodes"],
        summary="Start an episode (stateful; body optional)",
        response_model=None,
        responses={200: {"model": EpisodeResponse}, **error_responses(400, 401, 403, 413, 422, 429, 503)},
        openapi_extra=request_body(ResetRequest, required=False),
    )
    async def reset(request: Request) -> dict[str, Any]:
        params = await json_body(request)
        if not isinstance(params, dict):
            raise EpisodeError('the reset body must be a JSON object, e.g. {"task_id": "copy-head", "seed": 3}')
        params.pop("episode_id", None)  # a client-supplied id is ignored: the server issues its own
        client = clients.current()
        if "resume" in params:
            if set(params) - {"resume"}:
                raise EpisodeError("a resume takes only resume=<token> (the episode keeps its task, instance and "
                                   "budget)")  # fmt: skip
            episode, _ = service.resume(params["resume"], client, websocket=False)
            return observation_response(episode.resumed_observation())
        episode = await run_in_threadpool(service.open_episode, params, "http", client)
        return observation_response(episode.reset_observation())

    @app.post(
        "/step",
        tags=["Episodes"],
        summary="Act in an HTTP episode (needs episode_id)",
        response_model=None,
        responses={200: {"model": EpisodeResponse}, **error_responses(400, 401, 404, 409, 413, 421, 422, 429, 503)},
        openapi_extra=request_body(StepRequest, required=True),
    )
    async def step(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise EpisodeError('the step body must be a JSON object: {"action": {...}, "episode_id": "..."}')
        routed = request.query_params.get("episode_id")  # a balancer routes by it without reading the body
        if routed is not None and routed != body.get("episode_id"):
            raise EpisodeError("?episode_id= and the body's episode_id differ; send the same id in both (or only "
                               "in the body)")  # fmt: skip
        episode = service.http_episode(body.get("episode_id"), clients.current())
        if not isinstance(body.get("action"), dict):
            return error(
                422, "action must be an object with exactly one of python_code, solution_target, solution_from"
            )
        try:
            action = MechSandboxAction.model_validate(body["action"])
        except ValidationError as exc:
            return error(422, validation_message(exc))
        service.check_rate(episode)
        payload = action.model_dump(include={"python_code", "solution_target", "solution_from"})
        obs = await run_in_threadpool(episode.step, payload)
        return observation_response(obs)

    @app.get(
        "/state",
        tags=["Episodes"],
        summary="State of an HTTP episode",
        response_model=None,
        responses={200: {"model": MechSandboxState}, **error_responses(400, 401, 404, 421)},
    )
    async def state(
        episode_id: Annotated[str | None, Query(description="The episode_id returned by /reset")] = None,
    ) -> dict[str, Any]:
        return service.http_episode(episode_id, clients.current()).state()

    @app.get(
        "/health",
        tags=["Health"],
        summary="Health and active isolation layers",
        responses={503: {"description": "The sandbox is not healthy (the body is the same report)"}},
    )
    async def health() -> JSONResponse:
        report = service.health()
        return JSONResponse(report, status_code=200 if report["status"] == "healthy" else 503)

    @app.get(
        "/ready",
        tags=["Health"],
        summary="For a load balancer's check: 200 serving, 404 draining, 503 unhealthy",
        responses={
            404: {"description": "Draining: no new sessions, but its live episodes still come here"},
            503: {"description": "The sandbox is not healthy"},
        },
    )
    async def ready() -> JSONResponse:
        """Why not /health: HAProxy's ``http-check disable-on-404`` takes a server that answers 404 out of load
        balancing while still sending it the requests that belong to it (docs/DEPLOY.md); /health stays 503 while
        draining, which is what Kubernetes' readiness probe and Docker's healthcheck expect."""
        state = service.state()
        code = {"healthy": 200, "draining": 404}.get(state, 503)
        return JSONResponse({"status": state, "replica": service.settings.replica_id or None}, status_code=code)

    @app.get("/tasks", tags=["Tasks"], summary="Families, levels, answer schemas, budgets and versions")
    async def tasks() -> dict[str, Any]:
        return service.tasks()

    @app.post(
        "/runs",
        tags=["Runs"],
        summary="Register a run (one agent's attempt at the test split); returns its run_token once",
        response_model=None,
        responses={200: {"model": RunResponse}, **error_responses(400, 401, 413, 422, 429, 503)},
        openapi_extra=request_body(RunRequest, required=True),
    )
    async def register_run(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise EpisodeError('the run body must be a JSON object, e.g. {"agent": "my-agent", "model": "..."}')
        try:
            run = RunRequest.model_validate(body)
        except ValidationError as exc:
            return error(422, validation_message(exc))
        client = clients.current()
        return await run_in_threadpool(service.runs.register, run.agent, run.model, run.notes, client)

    @app.get(
        "/runs/{run_id}",
        tags=["Runs"],
        summary="One run's leaderboard entry (scores, coverage, versions; never its answers)",
        responses=error_responses(401, 404, 503),
    )
    async def run_entry(run_id: str) -> dict[str, Any]:
        return with_pages(await run_in_threadpool(service.runs.run_entry, run_id))

    async def run_token_of(request: Request) -> Any:
        body = await json_body(request)
        if not isinstance(body, dict) or set(body) - {"run_token"}:
            raise EpisodeError('the body must be {"run_token": "<the token POST /runs returned>"}')
        return body.get("run_token")

    @app.post(
        "/runs/{run_id}/finish",
        tags=["Runs"],
        summary="Finish a run (its run_token in the body): its open attempts end at the floor and its aggregates are "
        "published; a finished run never changes",
        responses=error_responses(400, 401, 403, 503),
    )
    async def finish_run(run_id: str, request: Request) -> dict[str, Any]:
        token = await run_token_of(request)
        return with_pages(await run_in_threadpool(service.runs.finish_run, run_id, token))

    @app.post(
        "/runs/{run_id}/withdraw",
        tags=["Runs"],
        summary="Withdraw a run (its run_token in the body): it stays listed, marked withdrawn and unranked",
        responses=error_responses(400, 401, 403, 503),
    )
    async def withdraw_run(run_id: str, request: Request) -> dict[str, Any]:
        token = await run_token_of(request)
        return with_pages(await run_in_threadpool(service.runs.withdraw_run, run_id, token))

    @app.get(
        "/leaderboard",
        tags=["Runs"],
        summary="Every run: counted mean per family and overall with 95% intervals, coverage, versions",
        responses=error_responses(401, 503),
    )
    async def leaderboard() -> dict[str, Any]:
        board = await run_in_threadpool(service.runs.leaderboard)
        for entry in board["runs"]:
            with_pages(entry)
        return board

    def with_pages(entry: dict[str, Any]) -> dict[str, Any]:
        """A run's page in the run viewer (docs/WEB.md), where the server serves it."""
        if settings.web:
            entry["page"] = f"/web/runs/db/{entry['run_id']}"
        return entry

    server = SharedCapServer(
        functools.partial(MechSandboxEnvironment, service=service),
        MechSandboxAction,
        MechSandboxObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=settings.session_cap, session_timeout=settings.idle_timeout_s
        ),
        env_name=ENV_NAME,
        state_cls=MechSandboxState,
        service=service,
    )
    service.ws_count = lambda: server.active_sessions
    service.ws_ids = lambda: list(server._sessions)
    if settings.web:
        register_web(app, service)
    mcp_route = McpRoute(server)
    mcp_route.register(app)  # before OpenEnv's POST /mcp, which it shadows (server/mcp.py says why)
    server.register_routes(app)
    # OpenEnv's own /reset, /step, /state, /health and POST /mcp, behind ours; /mcp forwards session methods to it
    mcp_route.capture(drop_shadowed_routes(app))
    publish_schemas(app, (ResetRequest, StepRequest, RunRequest))

    reapers: list[asyncio.Task[None]] = []

    async def _start() -> None:
        started = time.perf_counter()
        service.start()
        reapers.append(asyncio.create_task(server.reap_unused()))
        log.info("sandbox ready in %.1f s; isolation: %s", time.perf_counter() - started, service.health()["isolation"])

    async def _stop() -> None:
        for task in reapers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        service.stop()

    app.router.on_startup.insert(0, _start)
    app.router.on_shutdown.append(_stop)
    app.add_middleware(WebSocketFrames)
    app.add_middleware(
        RequestLimits,
        max_body=settings.max_body_bytes,
        tokens=settings.tokens,
        trusted_proxy=settings.trusted_proxy,
        allowed_origins=settings.allowed_origins,
    )
    return app


def main(host: str | None = None, port: int | None = None) -> None:
    """Run the server with uvicorn (settings from ``MECHSANDBOX_*`` / ``PORT``)."""
    settings = ServerSettings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(settings)
    try:  # a guessable test salt, or a database that is down (or a bad URL), stops the server here, in one line
        service.runs.check_salt()
        service.runs.open()
    except (ResultsUnavailable, WeakSalt) as exc:
        raise SystemExit(f"mechsandbox serve: {one_line(str(exc))}") from None
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal with the handler it
    # found; this one turns that into a clean exit status 0 (containers and supervisors expect it).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    config = uvicorn.Config(
        create_app(service),
        host=host or settings.host,
        port=port or settings.port,
        log_level=settings.log_level,
        ws_max_size=settings.max_body_bytes,
        timeout_graceful_shutdown=5,
        **proxy_options(settings),
    )
    DrainingServer(config, service).run()


def proxy_options(settings: ServerSettings) -> dict[str, Any]:
    """uvicorn's reading of ``X-Forwarded-For`` / ``-Proto``: only from ``MECHSANDBOX_TRUSTED_PROXY``, off without it.

    Why: uvicorn's default trusts those headers from 127.0.0.1, so a client on the server's host (or any client of a
    same-host proxy that passes the header through) chose the address its quota was counted under. ``clients.py``
    reads the header behind the same proxy only, so the two always agree."""
    if not settings.trusted_proxy:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": settings.trusted_proxy}


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but a first SIGTERM drains before it stops when ``MECHSANDBOX_DRAIN_S`` > 0.

    Why: behind a load balancer a replica that stops at once fails every live episode on it. Draining
    (``Service.drain``), it answers ``/health`` 503 and ``/ready`` 404 (the balancer's check takes it out of
    rotation), refuses new episodes after ``drain_notice_s``, lets the live episodes finish for up to ``drain_s``
    seconds, then stops as uvicorn does. A SIGINT, or a second signal while draining, stops it at once.
    (Kubernetes: ``terminationGracePeriodSeconds`` > ``drain_s``.)"""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: Any) -> None:
        drain_s = self.service.settings.drain_s
        if sig == signal.SIGTERM and drain_s > 0 and not self.service.draining.is_set() and not self.should_exit:
            self.service.drain()
            threading.Thread(target=self._stop_when_drained, args=(drain_s,), name="drain", daemon=True).start()
            return
        super().handle_exit(sig, frame)

    def _stop_when_drained(self, drain_s: float) -> None:
        if self.service.wait_drained(drain_s):
            log.info("drained: no live episode left; stopping")
        else:
            log.warning("drain time (%.0f s) over with %d live episode(s); stopping", drain_s,
                        self.service.live_episodes())  # fmt: skip
        self.should_exit = True


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@functools.cache
def default_app() -> FastAPI:
    """The app that ``uvicorn mechsandbox.server.app:app`` serves, with settings from the environment.

    Built once per process and then reused, so every access sees the same app, service and test salt.
    """
    return create_app()


def __getattr__(name: str) -> Any:
    """``app`` is built on first access (``default_app``), so importing this module starts nothing."""
    if name == "app":
        return default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()

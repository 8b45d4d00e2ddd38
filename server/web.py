"""The server's pages: the playground at ``/web`` and the run viewer at ``/web/runs`` (``MECHSANDBOX_WEB``, on by
default; ``MECHSANDBOX_RUN_DIRS`` names the run folders it shows).

What they may reach, and why it is safe: the playground is a page and a script that call the server's own ``/reset``
and ``/step`` (so sessions, budgets, quotas and tokens apply as to any client). The run viewer reads only the run
folders the operator listed, by the names ``rundir.run_folders`` gave them (a request names a folder, never a
path), and in them only regular files, never through a link (``rundir.read_inside``), and the results database's
leaderboard, which ``GET /leaderboard`` already publishes. Every page is sent with
a Content-Security-Policy that runs only ``/web/static/`` scripts, and renders outside the event loop (a figure takes
a second of CPU).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from ..evaluation.rundir import RunDirError, load_run, read_inside, run_folders
from ..results import ResultsUnavailable
from ..web import pages
from .runs import UnknownRun
from .service import Service

log = logging.getLogger("mechsandbox.server")
MEDIA = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
HEADERS = {"Content-Security-Policy": pages.CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def page(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def register_web(app: FastAPI, service: Service) -> None:
    roots = service.settings.run_dirs
    if roots:
        log.info("run viewer: %d run folder(s) under %s", len(run_folders(roots)), ", ".join(roots))

    @app.get("/web", include_in_schema=False)
    async def playground() -> HTMLResponse:
        families = service.tasks()["tasks"]
        return page(pages.playground_page(families, token_required=bool(service.settings.tokens)))

    @app.get("/web/", include_in_schema=False)
    async def playground_slash() -> RedirectResponse:
        return RedirectResponse("/web")

    @app.get("/web/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in pages.STATIC:
            return page(pages.message_page("Not found", f"no static file {name[:80]!r}"), 404)
        media = MEDIA[Path(name).suffix]
        return Response(pages.static_text(name), media_type=media, headers=HEADERS)

    @app.get("/web/runs", include_in_schema=False)
    async def runs_index() -> HTMLResponse:
        board: dict[str, Any] | None = None
        problem = ""
        try:
            board = await run_in_threadpool(service.runs.leaderboard)
        except ResultsUnavailable as exc:
            problem = f"the results database is unavailable: {exc}"
        shown = {name: str(path) for name, path in run_folders(roots).items()}  # rescanned: new runs show up
        return page(pages.runs_index(shown, board, problem))

    @app.get("/web/runs/dir/{name}", include_in_schema=False)
    async def run_folder(name: str) -> HTMLResponse:
        folder = run_folders(roots).get(name)
        if folder is None:
            return page(pages.message_page("Unknown run", f"no run folder named {name[:80]!r} (see /web/runs)"), 404)
        try:
            run = await run_in_threadpool(load_run, folder)
        except RunDirError as exc:
            return page(pages.message_page(f"Run {name}", str(exc)), 422)
        return page(await run_in_threadpool(pages.run_page, run, figures=run.path))  # the SVGs eval wrote

    @app.get("/web/runs/db/{run_id}", include_in_schema=False)
    async def database_run(run_id: str) -> HTMLResponse:
        try:
            entry = await run_in_threadpool(service.runs.run_entry, run_id)
        except ResultsUnavailable as exc:
            return page(pages.message_page("Run", f"the results database is unavailable: {exc}"), 503)
        except UnknownRun as exc:
            return page(pages.message_page("Unknown run", str(exc)), 404)
        folder = next((n for n, p in run_folders(roots).items() if _run_id_of(p) == run_id), None)
        return page(pages.db_run_page(run_id, entry, folder))


def _run_id_of(folder: Path) -> str | None:
    import json

    try:
        return json.loads(read_inside(folder, "summary.json")).get("run", {}).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None

"""The client side of benchmark runs: how a server scores its test split, and registering a run there.

Why a module of its own, on urllib alone: ``inference.py`` and ``mechsandbox eval`` both need it, and neither may
import torch or the task families to talk to a server (``catalogue.py`` has the same constraint for task lists).

A server with a fixed test salt (a hosted benchmark) counts test episodes only for a registered run: ``POST /runs``
returns a ``run_token`` that every test-split reset then carries. A server with a random salt (one started for a
local evaluation) needs no run, and its scores are comparable with nothing: callers warn about it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http_base(url: str) -> str:
    """``ws://`` / ``wss://`` to ``http://`` / ``https://``, without a trailing slash."""
    url = url.rstrip("/")
    return "http" + url[2:] if url.startswith("ws") else url


def _request(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read() or b"{}").get("detail", "")
        except ValueError:
            detail = ""
        raise RuntimeError(f"{url}: HTTP {exc.code}{': ' + str(detail) if detail else ''}") from None


def server_scoring(base_url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """What ``GET /tasks`` says about the test split: ``test_salt`` ("fixed"/"random"), ``salt_fingerprint``,
    ``runs_required``, ``standard_set_per_level``, ``benchmark_version`` and ``family_versions`` (id -> version)."""
    tasks = _request(f"{http_base(base_url)}/tasks", timeout_s=timeout_s)
    keys = ("test_salt", "salt_fingerprint", "runs_required", "standard_set_per_level", "benchmark_version")
    found = {key: tasks.get(key) for key in keys}
    found["family_versions"] = {t["id"]: t.get("family_version") for t in tasks.get("tasks", [])}
    return found


def register_run(base_url: str, agent: str, model: str = "", notes: str = "", timeout_s: float = 30.0) -> dict:
    """``POST /runs``: ``{"run_id", "run_token", "salt_fingerprint", ...}``; RuntimeError with the server's reason."""
    return _request(f"{http_base(base_url)}/runs", {"agent": agent[:128], "model": (model or "")[:128],
                                                     "notes": notes[:2000]}, timeout_s)  # fmt: skip

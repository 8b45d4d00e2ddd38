"""Which task families there are, and what a ``TASKS``/``--tasks`` list means, for clients.

Why a module apart from ``tasks``: an agent's client (``inference.py``, the LLM agent) talks to a
server and needs only the family ids and their aliases, which the server lists at ``GET /tasks``;
importing ``mechsandbox.tasks`` instead would load torch and every family's generator. Only
``local_catalogue`` imports it, when there is no server to ask (the eval harness, which plans
before it connects, and ``inference.py`` when its environment is unreachable).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

Catalogue = list[dict[str, Any]]  # entries with at least "id" and "aliases", in the families' order


def fetch_catalogue(base_url: str, timeout_s: float = 30.0) -> Catalogue:
    """The families a server lists at ``GET /tasks`` (``base_url`` may be http(s) or ws(s))."""
    url = base_url.rstrip("/")
    if url.startswith("ws"):
        url = "http" + url[2:]  # ws:// -> http://, wss:// -> https://
    with urllib.request.urlopen(f"{url}/tasks", timeout=timeout_s) as response:
        return list(json.load(response)["tasks"])


def local_catalogue() -> Catalogue:
    """The families of the installed package (imports ``mechsandbox.tasks``, and with it torch)."""
    from .tasks import families

    return [{"id": fam.id, "aliases": list(fam.aliases)} for fam in families()]


def select_tasks(spec: str, catalogue: Catalogue) -> list[str]:
    """Family ids for a comma-separated list of ids or aliases; "" or "all" means every family, in order.

    Raises ``KeyError`` for a name the catalogue does not know.
    """
    if spec.strip() in ("", "all"):
        return [entry["id"] for entry in catalogue]
    ids = {name: entry["id"] for entry in catalogue for name in (entry["id"], *entry.get("aliases", ()))}
    chosen = []
    for name in (part.strip() for part in spec.split(",")):
        if not name:
            continue
        if name not in ids:
            known = ", ".join(entry["id"] for entry in catalogue)
            raise KeyError(f"unknown task {name!r}: use one of {known} (or one of their aliases)")
        chosen.append(ids[name])
    return chosen

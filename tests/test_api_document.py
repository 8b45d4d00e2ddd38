"""The route table and the published OpenAPI document describe the routes that answer: one route per
(path, method), no OpenEnv route left behind one of ours, unique operation ids, and our episode routes'
bodies from ``server/wire.py``, which the service honours. The app is built in-process and never
started: its route table and /openapi.json need no sandbox."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mechsandbox.server import app as app_module
from mechsandbox.server.app import create_app, served_keys
from mechsandbox.server.episode import EpisodeError
from mechsandbox.server.service import RESET_FIELDS, Service
from mechsandbox.server.settings import ServerSettings
from mechsandbox.server.wire import ResetRequest
from mechsandbox.tasks import LEVELS, families
from pydantic import ValidationError

OURS = {("/reset", "POST"), ("/step", "POST"), ("/state", "GET"), ("/health", "GET"), ("/tasks", "GET")}
OPENENV_KEPT = {("/ws", "WEBSOCKET"), ("/mcp", "WEBSOCKET"), ("/mcp", "POST"), ("/metadata", "GET"),
                ("/schema", "GET"), ("/{env_name}/tasks", "POST"), ("/{env_name}/task", "POST")}  # fmt: skip
TEST_INSTANCES = 5


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    service = Service(ServerSettings(test_salt="document", public_salt=True, test_instances=TEST_INSTANCES))
    yield service
    service.stop()


@pytest.fixture(scope="module")
def app(service: Service) -> FastAPI:
    return create_app(service)


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in the JSON text: {keys}"
    return dict(pairs)


@pytest.fixture(scope="module")
def document(app: FastAPI) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns about duplicate operation ids
        response = TestClient(app).get("/openapi.json")  # no `with`: the app is not started
    assert response.status_code == 200
    return json.loads(response.text, object_pairs_hook=no_duplicate_keys)


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema["$ref"]
    assert ref.startswith("#/components/schemas/")
    return document["components"]["schemas"][ref.rsplit("/", 1)[1]]


def body_schema(document: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The schema of a request body or response entry's JSON content."""
    return resolve(document, entry["content"]["application/json"]["schema"])


def test_route_table_has_one_route_per_path_and_method(app: FastAPI) -> None:
    counts = Counter(key for route in app.router.routes for key in served_keys(route))
    assert [key for key, n in counts.items() if n > 1] == []
    assert set(counts) >= OURS | OPENENV_KEPT
    for route in app.router.routes:
        if served_keys(route) & OURS:
            assert route.endpoint.__module__ == "mechsandbox.server.app", route.path


def test_document_has_each_operation_once_with_unique_ids(document: dict[str, Any]) -> None:
    operations = [(path, method.upper(), op) for path, item in document["paths"].items() for method, op in item.items()]
    assert {(path, method) for path, method, _ in operations} >= OURS
    ids = [op["operationId"] for _, _, op in operations]
    assert len(ids) == len(set(ids)), Counter(ids).most_common(3)
    assert not any("Environment Control" in op.get("tags", ()) for _, _, op in operations)  # OpenEnv's tag for them


def test_reset_body_is_ours(document: dict[str, Any]) -> None:
    body = document["paths"]["/reset"]["post"]["requestBody"]
    assert body["required"] is False
    schema = body_schema(document, body)
    assert set(schema["properties"]) == set(RESET_FIELDS) and schema["additionalProperties"] is False
    level = next(s for s in schema["properties"]["level"]["anyOf"] if s.get("type") == "string")
    assert tuple(level["enum"]) == LEVELS
    ok = body_schema(document, document["paths"]["/reset"]["post"]["responses"]["200"])
    assert {"observation", "reward", "done", "episode_id"} <= set(ok["properties"])


def test_step_body_is_ours(document: dict[str, Any]) -> None:
    body = document["paths"]["/step"]["post"]["requestBody"]
    schema = body_schema(document, body)
    assert body["required"] is True and set(schema["required"]) == {"action", "episode_id"}
    action = resolve(document, schema["properties"]["action"])
    assert {"python_code", "solution_target", "solution_from"} <= set(action["properties"])
    errors = document["paths"]["/step"]["post"]["responses"]
    assert {"400", "404", "409", "413", "422"} <= set(errors)
    assert body_schema(document, errors["422"])["properties"] == {"detail": {"title": "Detail", "type": "string"}}


def test_state_takes_the_episode_id(document: dict[str, Any]) -> None:
    params = document["paths"]["/state"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in params] == [("episode_id", "query")]


# Two checks are the service's alone (task_id names a family, a test index is below test_instances):
# the bodies here respect them, and every such body the model accepts, the service accepts too.
FAMILY_NAMES = [name for fam in families() for name in (fam.id, *fam.aliases)]
ACCEPTED = [
    {},
    {"task_id": "copy-head", "seed": 3, "level": "hard"},
    {"task_id": "task5", "task_level": "medium", "episode_id": "ignored"},
    {"seed": 2**31 - 1, "split": "train", "index": 7},
    {"split": "test", "index": TEST_INSTANCES - 1, "level": "easy", "task_id": "das"},
    {"task_id": None, "seed": None, "level": None, "split": None},
]
REFUSED = [
    {"seed": -1},
    {"seed": "7"},
    {"seed": 2**31},
    {"seed": True},
    {"seed": 1.0},
    {"level": "extreme"},
    {"split": "dev"},
    {"task_id": 5},
    {"split": "test", "seed": 5},
    {"split": "test", "index": -1},
    {"colour": "red"},
]


@pytest.mark.parametrize("body", ACCEPTED + [{"task_id": name} for name in FAMILY_NAMES])
def test_a_reset_body_the_model_accepts_the_service_accepts(service: Service, body: dict[str, Any]) -> None:
    ResetRequest.model_validate(body)
    assert service.resolve(body).task_id


@pytest.mark.parametrize("body", REFUSED)
def test_a_reset_body_both_refuse(service: Service, body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ResetRequest.model_validate(body)
    with pytest.raises(EpisodeError):
        service.resolve(body)


def test_the_default_app_is_built_once() -> None:
    app_module.default_app.cache_clear()
    try:
        first = app_module.app
        assert app_module.app is first and first.state.service is app_module.app.state.service
    finally:
        app_module.default_app().state.service.stop()
        app_module.default_app.cache_clear()

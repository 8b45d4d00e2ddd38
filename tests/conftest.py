"""Shared fixtures (helpers live in helpers.py, importable because pytest puts tests/ on the path)."""

from __future__ import annotations

import pytest
from helpers import FAMILY_IDS, shared_pool
from mechsandbox.tasks import LEVELS, Family, get_family


@pytest.fixture(params=FAMILY_IDS)
def family(request) -> Family:
    return get_family(request.param)


@pytest.fixture(params=LEVELS)
def level(request) -> str:
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _close_shared_pool():
    yield
    if shared_pool.cache_info().currsize:
        shared_pool().close()

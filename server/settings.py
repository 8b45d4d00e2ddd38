"""Server settings: every deployment knob is a ``MECHSANDBOX_*`` environment variable with a default.

The sandbox's own knobs live in ``sandbox/settings.py``; this one holds the episode and wire-level
settings. The README lists both in one table (SPEC-api.md "Deployment settings").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from .sandbox.settings import parse_setting


@dataclass(frozen=True)
class ServerSettings:
    host: str = "0.0.0.0"
    port: int = 8000
    session_cap: int = 64  # WebSocket and HTTP episodes together; 429 past it
    idle_timeout_s: float = 900.0  # idle sessions are reaped and their workers killed
    reveal_truth: bool = True  # train episodes show the truth after done; test episodes never do
    test_salt: str = ""  # HMAC key of the test split; empty = random per process (logged loudly)
    test_instances: int = 100  # test instances per (family, level)
    api_token: str = ""  # when set, every route but /health needs "Authorization: Bearer <token>"
    rate_limit: float = 0.0  # steps per second per session (0 = off); past it, 429
    max_body_bytes: int = 256 * 1024
    default_task: str = "dead-neurons"
    cache_size: int = 64  # generated instances kept (LRU; a transformer instance is about 1.5 MiB)
    train_max_steps: int = 0  # 0 = each family's budget; N = budget of every train episode (test: never)
    log_level: str = "info"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> ServerSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            key = "PORT" if f.name == "port" and "MECHSANDBOX_PORT" not in env else f"MECHSANDBOX_{f.name.upper()}"
            raw = env.get(key)
            if raw is None:
                continue
            values[f.name] = parse_setting(key, raw, f.type)
        settings = replace(cls(), **values, **overrides)
        if settings.train_max_steps < 0:
            raise ValueError("MECHSANDBOX_TRAIN_MAX_STEPS must be 0 (the family budgets) or a positive step count")
        if settings.session_cap < 1 or settings.test_instances < 1:
            raise ValueError("MECHSANDBOX_SESSION_CAP and MECHSANDBOX_TEST_INSTANCES must be at least 1")
        return settings

"""The results database: runs, their attempts at test instances, and the leaderboard computed from them.

Why a package of its own: the server writes here, and ``mechsandbox leaderboard --db`` reads here without
starting a server (or importing torch, the sandbox or the task families). It speaks SQLAlchemy 2, so the same
code runs on the embedded SQLite default and on a PostgreSQL shared by several replicas; the schema is
created and upgraded by Alembic migrations (``migrations/``), never by hand.
"""

from .leaderboard import leaderboard, wilson_interval
from .store import (
    Attempt,
    ResultStore,
    ResultsUnavailable,
    RunInfo,
    resolve_database_url,
)

__all__ = [
    "Attempt",
    "ResultStore",
    "ResultsUnavailable",
    "RunInfo",
    "leaderboard",
    "resolve_database_url",
    "wilson_interval",
]

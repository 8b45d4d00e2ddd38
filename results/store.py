"""``ResultStore``: register runs, claim and finish attempts, read everything back for the leaderboard.

Why the claim is an INSERT that may fail: "only the first attempt at an instance counts for a run" must hold when
two WebSockets of one run reset the same instance at the same moment, on one server or on two replicas sharing a
PostgreSQL. The unique constraint on (run_id, instance_id) decides it inside the database; the loser is told its
episode is not counted. Every database failure surfaces as ``ResultsUnavailable`` with one line, which the server
turns into a 503 (the client retries; nothing is half-written) or, at start-up, into a refusal to start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from .schema import MAX_AGENT, MAX_NOTES, AttemptRow, RunRow

log = logging.getLogger("mechsandbox.results")

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
DB_FILE = "results.sqlite"
PG_MIGRATION_LOCK = 0x6D656368  # advisory-lock key held while one replica migrates a shared PostgreSQL
# How an attempt ends: graded, truncated (out of steps) or abandoned (the client left it) by the agent's doing; lost
# (the server ended it after the agent's first step: it counts at the floor, never a second try) or voided (the server
# ended it before any step: the run may claim the instance again) by the server's (docs/CONTRACT.md).
STATUSES = ("open", "graded", "truncated", "abandoned", "lost", "voided")


class ResultsUnavailable(Exception):
    """The results database cannot be reached or written (one line, no traceback, no credentials)."""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    agent: str
    model: str
    notes: str
    salt_fingerprint: str
    benchmark_version: str
    standard_set: int
    created_at: float
    submitter: str = ""
    finished_at: float | None = None  # set once, by ``finish_run``: the run's scores are sealed before
    published: Any = None  # what finishing published (``leaderboard.publish``): the run's only scores
    withdrawn_at: float | None = None

    @classmethod
    def of(cls, row: RunRow) -> RunInfo:
        return cls(row.run_id, row.agent, row.model, row.notes, row.salt_fingerprint, row.benchmark_version,
                   row.standard_set, row.created_at, row.submitter or "", row.finished_at, row.published,
                   row.withdrawn_at)  # fmt: skip


@dataclass(frozen=True)
class Attempt:
    """One counted attempt, as the leaderboard reads it (the trajectory is loaded only on request)."""

    id: int
    run_id: str
    task_id: str
    family_version: str
    level: str
    instance_index: int
    instance_id: str
    status: str
    score: float | None
    steps: int
    seconds: float
    started_at: float
    finished_at: float | None
    voids: int = 0
    trajectory: Any = None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def client_hash(client_key: str) -> str:
    """Who registered a run, kept only as a hash (the key can be a bearer token's index or an address)."""
    return hashlib.sha256(b"mechsandbox-client/" + client_key.encode()).hexdigest()[:32]


def _one_line(exc: BaseException) -> str:
    """A database error in one line, without the SQL, parameters or URL credentials SQLAlchemy appends."""
    origin = getattr(exc, "orig", None) or exc
    text = " ".join(str(origin).split("\n")[0].split())[:240]
    return f"{type(origin).__name__}: {text}" if text else type(origin).__name__


def normalise_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 (the driver we install); anything else as given."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def default_data_dir() -> Path:
    """The per-user state folder for the results database: ``$XDG_STATE_HOME/mechsandbox``, else
    ``~/.local/state/mechsandbox``. Why not the working directory (the old default, ``./mechsandbox-data``): there the
    database of every counted answer lay in the checkout, which the sandbox's jail used to show its workers, and was
    as readable as the checkout (issue 53)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "mechsandbox"


def writable_dir(path: Path) -> bool:
    """Create ``path`` (the last folder mode 0700: it holds the results) and check that a file can be made in it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def resolve_database_url(database_url: str, data_dir: str, salt_is_random: bool) -> tuple[str, str | None, Path | None]:
    """Where the results go: ``(url, note for the start-up log, temporary folder to remove at exit or None)``.

    An explicit ``database_url`` wins. A server with a random salt keeps its runs in a temporary SQLite database
    (nothing it scores is comparable after it stops, and test servers must not litter the working folder).
    Otherwise SQLite in ``data_dir`` (empty: ``default_data_dir()``), or, where that is not writable (a read-only
    container), in a per-user folder
    under the system's temporary directory, named in the note.
    """
    if database_url:
        return normalise_url(database_url), None, None
    if salt_is_random:
        folder = Path(tempfile.mkdtemp(prefix="mechsandbox-results-"))
        note = f"random test salt: runs are kept in a temporary database ({folder}) and deleted at exit"
        return f"sqlite:///{folder / DB_FILE}", note, folder
    wanted = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
    if writable_dir(wanted):
        return f"sqlite:///{wanted / DB_FILE}", None, None
    fallback = Path(tempfile.gettempdir()) / f"mechsandbox-data-{os.getuid()}"
    if not writable_dir(fallback):
        raise ResultsUnavailable(f"neither MECHSANDBOX_DATA_DIR={data_dir} nor {fallback} is writable")
    note = (f"MECHSANDBOX_DATA_DIR={data_dir} is not writable; results go to {fallback / DB_FILE} instead "
            "(set MECHSANDBOX_DATA_DIR or MECHSANDBOX_DATABASE_URL to keep them)")  # fmt: skip
    return f"sqlite:///{fallback / DB_FILE}", note, None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer; two processes can share the file
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class ResultStore:
    """The results database behind one server (or one ``mechsandbox leaderboard --db``)."""

    def __init__(self, url: str, cleanup: Path | None = None):
        self.url = normalise_url(url)
        self.cleanup = cleanup
        self.engine: Engine | None = None
        self.sessions: sessionmaker[Session] | None = None

    @property
    def backend(self) -> str:
        return make_url(self.url).get_backend_name()

    def describe(self) -> str:
        """The URL without its password (for logs and /health)."""
        return make_url(self.url).render_as_string(hide_password=True)

    # --- life cycle ----------------------------------------------------------------------------

    def open(self, migrate: bool = True) -> ResultStore:
        """Connect and bring the schema to the newest revision; ``ResultsUnavailable`` in one line if either fails."""
        try:
            url = make_url(self.url)
        except SQLAlchemyError as exc:
            raise ResultsUnavailable(f"MECHSANDBOX_DATABASE_URL is not a database URL ({_one_line(exc)})") from None
        try:
            if url.get_backend_name() == "sqlite":
                self.engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
                event.listen(self.engine, "connect", _sqlite_pragmas)
            else:
                self.engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10,
                                            connect_args=self._connect_args(url))  # fmt: skip
            self.sessions = sessionmaker(self.engine, expire_on_commit=False)
            if migrate:
                self._migrate()
            with self.engine.connect() as connection:
                connection.execute(select(func.count()).select_from(RunRow))
        except (SQLAlchemyError, OSError, ImportError) as exc:
            self.close()
            raise ResultsUnavailable(f"results database {self.describe()} unavailable: {_one_line(exc)}") from None
        return self

    @staticmethod
    def _connect_args(url: Any) -> dict[str, Any]:
        return {"connect_timeout": 10} if url.get_backend_name() == "postgresql" else {}

    def _migrate(self) -> None:
        assert self.engine is not None
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self._migration_lock(), self.engine.begin() as connection:
            if self.backend == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """Two processes starting on one SQLite file migrate one after the other (a lock file beside it)."""
        database = make_url(self.url).database if self.backend == "sqlite" else None
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)
            self.cleanup = None

    @contextlib.contextmanager
    def _session(self) -> Iterator[Session]:
        if self.sessions is None:
            raise ResultsUnavailable("the results database is not open")
        try:
            with self.sessions.begin() as session:
                yield session
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            raise ResultsUnavailable(f"results database unavailable: {_one_line(exc)}") from None

    # --- runs ----------------------------------------------------------------------------------

    def register_run(
        self, agent: str, model: str, notes: str, client_key: str, salt_fingerprint: str, benchmark_version: str,
        standard_set: int, quota: int = 0, submitter: str = "",
    ) -> tuple[RunInfo, str] | None:
        """A new run and its token (returned once; only its hash is stored); None past the client's daily quota.

        Why slots: "at most ``quota`` runs per client and UTC day" must hold for concurrent registrations on
        several replicas. Each run takes one of the day's ``quota`` numbered slots, and a unique constraint on
        (client, day, slot) lets only one registration have each; a count-then-insert would let a burst through.
        ``quota`` 0 means no limit (no slot is taken). The slots belong to ``client_key``, which the server makes the
        submitter's key, so several tokens an operator grouped into one submitter share one quota.
        """
        now = time.time()
        day = time.strftime("%Y-%m-%d", time.gmtime(now)) if quota else None
        for slot in range(quota) if quota else [None]:
            token = "mst_" + secrets.token_urlsafe(32)
            row = RunRow(run_id="run-" + secrets.token_hex(8), token_hash=token_hash(token), agent=agent[:MAX_AGENT],
                         model=model[:MAX_AGENT], notes=notes[:MAX_NOTES], client=client_hash(client_key),
                         salt_fingerprint=salt_fingerprint, benchmark_version=benchmark_version,
                         standard_set=standard_set, created_at=now, quota_day=day, quota_slot=slot,
                         submitter=submitter[:64])  # fmt: skip
            try:
                with self._session() as session:
                    session.add(row)
            except IntegrityError:
                continue  # this slot is taken: try the next one
            return RunInfo.of(row), token
        return None

    def run_for_token(self, token: str) -> RunInfo | None:
        with self._session() as session:
            row = session.scalar(select(RunRow).where(RunRow.token_hash == token_hash(token)))
            return RunInfo.of(row) if row else None

    def run(self, run_id: str) -> RunInfo | None:
        with self._session() as session:
            row = session.get(RunRow, run_id)
            return RunInfo.of(row) if row else None

    def runs(self) -> list[RunInfo]:
        with self._session() as session:
            return [RunInfo.of(r) for r in session.scalars(select(RunRow).order_by(RunRow.created_at))]

    def finish_run(self, run_id: str, published: Any, floor: float) -> bool:
        """Finish a run once: its open attempts end abandoned (at ``floor``) and ``published`` is stored; False when it
        was already finished (a finished run is immutable: nothing here or in ``finish`` changes it again)."""
        now = time.time()
        with self._session() as session:
            result = session.execute(
                update(RunRow).where(RunRow.run_id == run_id, RunRow.finished_at.is_(None))
                .values(finished_at=now, published=published)
            )
            if int(getattr(result, "rowcount", 0)) != 1:
                return False
            session.execute(
                update(AttemptRow).where(AttemptRow.run_id == run_id, AttemptRow.status == "open")
                .values(status="abandoned", score=floor, finished_at=now)
            )
            return True

    def withdraw_run(self, run_id: str) -> bool:
        """Mark a run withdrawn (it stays listed, marked); False when it already was."""
        with self._session() as session:
            result = session.execute(
                update(RunRow).where(RunRow.run_id == run_id, RunRow.withdrawn_at.is_(None))
                .values(withdrawn_at=time.time())
            )
            return int(getattr(result, "rowcount", 0)) == 1

    def finished_attempts(self, run_id: str) -> int:
        """How many of the run's attempts have ended (voided ones are not: the run may play them again)."""
        with self._session() as session:
            query = select(func.count()).select_from(AttemptRow).where(
                AttemptRow.run_id == run_id, AttemptRow.status.not_in(("open", "voided"))
            )
            return int(session.scalar(query) or 0)

    # --- attempts ------------------------------------------------------------------------------

    def claim(self, run_id: str, task_id: str, family_version: str, level: str, index: int,
              instance_id: str) -> int | None:  # fmt: skip
        """Claim the run's counted attempt at this instance: its id, or None when the run already has one."""
        row = AttemptRow(run_id=run_id, task_id=task_id, family_version=family_version, level=level,
                         instance_index=index, instance_id=instance_id, status="open", score=None, steps=0,
                         seconds=0.0, trajectory=None, started_at=time.time(), finished_at=None)  # fmt: skip
        try:
            with self._session() as session:
                session.add(row)
        except IntegrityError:
            return self._reclaim_voided(run_id, instance_id, family_version)
        return row.id

    def _reclaim_voided(self, run_id: str, instance_id: str, family_version: str) -> int | None:
        """Reopen the run's voided attempt at the instance (one the server lost before any step): its id, or None when
        the run's attempt there is not voided (a replay, never counted)."""
        with self._session() as session:
            voided = select(AttemptRow).where(
                AttemptRow.run_id == run_id, AttemptRow.instance_id == instance_id, AttemptRow.status == "voided"
            )
            row = session.scalars(voided).first()
            if row is None:
                return None
            result = session.execute(
                update(AttemptRow)
                .where(AttemptRow.id == row.id, AttemptRow.status == "voided")
                .values(
                    status="open", score=None, steps=0, seconds=0.0, trajectory=None, family_version=family_version,
                    started_at=time.time(), finished_at=None, voids=AttemptRow.voids + 1,
                )
            )
            return row.id if int(getattr(result, "rowcount", 0)) == 1 else None

    def finish(self, attempt_id: int, status: str, score: float, steps: int, seconds: float,
               trajectory: list[dict[str, Any]] | None) -> bool:  # fmt: skip
        """Write an attempt's end; False when it had already ended (only an open attempt can finish)."""
        if status not in STATUSES[1:]:
            raise ValueError(f"an attempt ends {', '.join(STATUSES[1:])}, not {status!r}")
        values = {"status": status, "score": score, "steps": steps, "seconds": seconds, "trajectory": trajectory,
                  "finished_at": time.time()}  # fmt: skip
        with self._session() as session:
            result = session.execute(
                update(AttemptRow).where(AttemptRow.id == attempt_id, AttemptRow.status == "open").values(**values)
            )
            return int(getattr(result, "rowcount", 0)) == 1

    def abandon(self, run_id: str, instance_id: str, score: float) -> bool:
        """End the run's attempt at an instance as abandoned, at ``score``, if it is still open (True if it was)."""
        with self._session() as session:
            result = session.execute(
                update(AttemptRow)
                .where(AttemptRow.run_id == run_id, AttemptRow.instance_id == instance_id, AttemptRow.status == "open")
                .values(status="abandoned", score=score, finished_at=time.time())
            )
            return int(getattr(result, "rowcount", 0)) == 1

    def attempts(self, run_id: str | None = None, with_trajectory: bool = False) -> list[Attempt]:
        """Every attempt (of one run), oldest first; trajectories only on request (they are most of the bytes).

        Read as plain rows, not ORM objects: the leaderboard reads every attempt of every run on each request.
        """
        columns = [getattr(AttemptRow, name) for name in ATTEMPT_COLUMNS]
        if with_trajectory:
            columns.append(AttemptRow.trajectory)
        query = select(*columns).order_by(AttemptRow.id)
        if run_id is not None:
            query = query.where(AttemptRow.run_id == run_id)
        with self._session() as session:
            return [Attempt(*row) for row in session.execute(query)]


ATTEMPT_COLUMNS = ("id", "run_id", "task_id", "family_version", "level", "instance_index", "instance_id", "status",
                   "score", "steps", "seconds", "started_at", "finished_at", "voids")  # ``Attempt``'s fields, in order

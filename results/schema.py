"""The tables of the results database, as SQLAlchemy 2 declarative models.

``runs``: one row per registered run (one agent's attempt at the benchmark). The run token is stored only as its
SHA-256, so a leaked database cannot be used to play as someone else's run. The registration quota is a unique
constraint too: a run takes one of its client's numbered slots for the day (``ResultStore.register_run``).
``attempts``: one row per counted attempt at a test instance; the unique constraint on (run_id, instance_id) is what
makes "only the first attempt at an instance counts" hold across threads, processes and replicas sharing one
PostgreSQL: the second insert fails in the database, not in a check-then-write race in Python.

Times are seconds since the epoch (a float): the same on SQLite and PostgreSQL, with no time-zone handling to get
wrong. Changing a table means a new Alembic revision in ``migrations/versions`` (CONTRIBUTING explains how).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MAX_AGENT = 128  # characters of a run's agent and model names
MAX_NOTES = 2000


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("client", "quota_day", "quota_slot", name="uq_runs_quota_slot"),)

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    agent: Mapped[str] = mapped_column(String(MAX_AGENT))
    model: Mapped[str] = mapped_column(String(MAX_AGENT), default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    client: Mapped[str] = mapped_column(String(64), index=True)  # a hash of who registered it (for the quota)
    salt_fingerprint: Mapped[str] = mapped_column(String(16))
    benchmark_version: Mapped[str] = mapped_column(String(32))
    standard_set: Mapped[int] = mapped_column(Integer)  # instances per family and level that a complete run plays
    created_at: Mapped[float] = mapped_column(Float)
    quota_day: Mapped[str | None] = mapped_column(String(10), nullable=True)  # UTC date, when the quota applied
    quota_slot: Mapped[int | None] = mapped_column(Integer, nullable=True)  # which of that day's quota slots
    # Sealed runs (0003): who registered it (shown on the leaderboard; what the quota counts), when it was finished
    # and what it then published (its only scores, never rewritten), and when its submitter withdrew it.
    submitter: Mapped[str] = mapped_column(String(64), index=True, default="", server_default="")
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    published: Mapped[Any] = mapped_column(JSON, nullable=True)
    withdrawn_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AttemptRow(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("run_id", "instance_id", name="uq_attempts_run_instance"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40), ForeignKey("runs.run_id"), index=True)
    task_id: Mapped[str] = mapped_column(String(64))
    family_version: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16))
    instance_index: Mapped[int] = mapped_column(Integer)
    instance_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # open, graded, truncated, abandoned, lost, voided
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    trajectory: Mapped[Any] = mapped_column(JSON, nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    voids: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # times the server voided it (0002)

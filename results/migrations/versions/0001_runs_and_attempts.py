"""Runs and their counted attempts.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("salt_fingerprint", sa.String(16), nullable=False),
        sa.Column("benchmark_version", sa.String(32), nullable=False),
        sa.Column("standard_set", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("quota_day", sa.String(10), nullable=True),
        sa.Column("quota_slot", sa.Integer(), nullable=True),
        sa.UniqueConstraint("client", "quota_day", "quota_slot", name="uq_runs_quota_slot"),
    )
    op.create_index("ix_runs_client", "runs", ["client"])
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("family_version", sa.String(32), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("instance_index", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("trajectory", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "instance_id", name="uq_attempts_run_instance"),
    )
    op.create_index("ix_attempts_run_id", "attempts", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_attempts_run_id", "attempts")
    op.drop_table("attempts")
    op.drop_index("ix_runs_client", "runs")
    op.drop_table("runs")

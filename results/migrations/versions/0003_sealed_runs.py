"""Sealed runs: who submitted a run, when it was finished, what it published, whether it was withdrawn.

Why columns on the run: a counted attempt's score is sealed until its run is finished (issue 55); finishing computes
the run's published aggregates once and stores them on the row, so a finished run is immutable (a later family
upgrade, a code change in the rounding, nothing rewrites what it published) and the leaderboard reads them without
the salt. ``submitter`` groups runs by who registered them (a bearer token, an operator's group of tokens, or an
address) and is what the daily quota counts; ``withdrawn_at`` marks a run its submitter withdrew (never removed).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("submitter", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("finished_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("published", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("withdrawn_at", sa.Float(), nullable=True))
        batch.create_index("ix_runs_submitter", ["submitter"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_submitter")
        batch.drop_column("withdrawn_at")
        batch.drop_column("published")
        batch.drop_column("finished_at")
        batch.drop_column("submitter")

"""Attempts the server voided: how often each was voided and played again.

Why a column: an attempt the server lost before the agent's first step (a shutdown, a drain that ran out) is voided,
and the run may claim the instance again; the claim reopens the same row (the run's attempt at an instance stays one
row), so the count of voids lives on the row, for the leaderboard to show per run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("voids", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("voids")

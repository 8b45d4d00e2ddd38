"""Alembic's environment: migrations run on the connection ``ResultStore`` hands over (never from an ini file).

``render_as_batch`` makes future ALTERs work on SQLite (Alembic copies the table), so one revision serves both
back ends.
"""

from alembic import context
from mechsandbox.results.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

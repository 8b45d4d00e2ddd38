"""Alembic migrations of the results database (``ResultStore.open`` runs them up to head at every start)."""

"""Data migration tests: move the test database to a migration, write rows as they were, move on, read them."""
from __future__ import annotations

from contextlib import contextmanager

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(target: list[tuple[str, str]]):
    """Migrate the test database to `target` (forwards or backwards); the apps (historical models) as of there."""
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


@contextmanager
def migrations_restored():
    """Yield `migrate`; whatever happens inside, the database ends at the latest migrations again."""
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        yield migrate
    finally:
        MigrationExecutor(connection).migrate(latest)

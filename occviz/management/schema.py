"""The database brought up to date by the commands a new user runs first: `serve`, `runjob`, `bench`.

Straight after a clone the embedded PostgreSQL is created empty; these commands apply the
migrations themselves rather than fail on a missing table.
"""

from __future__ import annotations

from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

# The PostgreSQL advisory lock that lets one process at a time migrate.
MIGRATING_LOCK_KEY = 0x6F636376697A  # "occviz" in ASCII


def apply_migrations() -> bool:
    """Apply the migrations the database lacks; whether there were any.

    Processes that start together on a new database (a serve beside a runjob, a class's
    script of runjobs) would each create the same tables and all but one fail: they take
    turns on an advisory lock, and the ones after the first find nothing left to do.
    """
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATING_LOCK_KEY])
    try:
        executor = MigrationExecutor(connection)
        if not executor.migration_plan(executor.loader.graph.leaf_nodes()):
            return False
        call_command("migrate", interactive=False, verbosity=0)
        return True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATING_LOCK_KEY])

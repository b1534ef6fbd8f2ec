"""What a job's actors share across its processes, in PostgreSQL: counts and named entries (JobShared rows).

A job over several processes (occviz.jobs.shards) has no memory its actors all see: a count
they take turns on, a set of entries they add and remove, or a log one process follows, is
a row per name here, each change one statement (or one with the caller's transaction), so
its actors in any process see one value. The program makes the rows it needs before its
actors start (`make`); they go with the job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db import connection


def make(job_id: int, numbers: Mapping[str, int]) -> None:
    """Rows `name` = number for the job (the program's, before its actors start)."""
    with connection.cursor() as cursor:
        for name, number in numbers.items():
            cursor.execute(
                "INSERT INTO jobs_jobshared (job_id, name, number) VALUES (%s, %s, %s)", [job_id, name, number]
            )


def add(job_id: int, name: str, amount: int, *, below: int | None = None) -> int | None:
    """`name` += amount, and its new number; with `below`, only while the number is below it (else None)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_jobshared SET number = number + %s WHERE job_id = %s AND name = %s "
            "AND (%s::bigint IS NULL OR number < %s::bigint) RETURNING number",
            [amount, job_id, name, below, below],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def number(job_id: int, name: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT number FROM jobs_jobshared WHERE job_id = %s AND name = %s", [job_id, name])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def put(job_id: int, name: str, number: int = 0, data: Any = None) -> None:
    """The entry `name` (a member of a set, a log's line), written over if it was there."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_jobshared (job_id, name, number, data) VALUES (%s, %s, %s, %s::jsonb) "
            "ON CONFLICT (job_id, name) DO UPDATE SET number = excluded.number, data = excluded.data",
            [job_id, name, number, None if data is None else json.dumps(data)],
        )


def entries(job_id: int, prefix: str) -> dict[str, int]:
    """The entries whose names start with `prefix`: their numbers by the rest of their names."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, number FROM jobs_jobshared WHERE job_id = %s AND starts_with(name, %s)", [job_id, prefix]
        )
        return {name[len(prefix) :]: int(value) for name, value in cursor.fetchall()}


def data(job_id: int, name: str) -> Any:
    """The data of the entry `name`, or None."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT data FROM jobs_jobshared WHERE job_id = %s AND name = %s", [job_id, name])
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return json.loads(row[0]) if isinstance(row[0], str) else row[0]


def move(job_id: int, entry: str, count: str, sign: int) -> int | None:
    """The entry `entry` removed and its number added to `count` times `sign`, in one statement.

    `count`'s new number, or None if there was no such entry.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH gone AS (DELETE FROM jobs_jobshared WHERE job_id = %s AND name = %s RETURNING number) "
            "UPDATE jobs_jobshared SET number = jobs_jobshared.number + %s * gone.number FROM gone "
            "WHERE job_id = %s AND name = %s RETURNING jobs_jobshared.number",
            [job_id, entry, sign, job_id, count],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def enter_and_add(job_id: int, entry: str, amount: int, count: str, peak: str) -> None:
    """The entry `entry` = amount, `count` += amount and `peak` raised to it, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH entered AS (INSERT INTO jobs_jobshared (job_id, name, number) VALUES (%s, %s, %s) "
            "ON CONFLICT (job_id, name) DO UPDATE SET number = excluded.number), "
            "counted AS (UPDATE jobs_jobshared SET number = number + %s WHERE job_id = %s AND name = %s "
            "RETURNING number) "
            "UPDATE jobs_jobshared SET number = greatest(jobs_jobshared.number, counted.number) FROM counted "
            "WHERE job_id = %s AND name = %s",
            [job_id, entry, amount, amount, job_id, count, job_id, peak],
        )

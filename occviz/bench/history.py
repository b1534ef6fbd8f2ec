"""A long job's history, made in seconds: for the tests and benchmarks of reading it back.

A 60 s `occ` race of 4 writers stores about 400,000 events in about 600 batches. Running
one takes a minute and a worker; `long_finished_job` writes the same shape of store
straight from PostgreSQL (`generate_series`), batch by batch as the recorder would: a
read and a committed event by turns, each batch with its snapshot. What a viewer reads
back from it is what it reads from a real job of that length.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from occviz.jobs.models import Job
from occviz.jobs.tasks import program

# One batch: `size` events from seq_from, element i being event seq_from + i (a read, then a commit, by turns).
_INSERT_BATCHES = """
INSERT INTO jobs_eventbatch (job_id, seq_from, seq_to, t_us, actor, op, attempt, kind, "row",
                             version_read, version_written, value_read, value_written,
                             duration_us, latency_us, detail, snapshot)
SELECT %(job)s, batch.seq_from, batch.seq_from + %(size)s - 1,
       array_agg(seq * 150 ORDER BY seq), array_agg(1 + seq %% 4 ORDER BY seq), array_agg(1 + seq / 8 ORDER BY seq),
       array_agg(1 ORDER BY seq),
       array_agg(CASE WHEN seq %% 2 = 1 THEN 'read' ELSE 'committed' END ORDER BY seq),
       array_agg(%(row)s::bigint ORDER BY seq), array_agg(seq / 2 ORDER BY seq),
       array_agg(CASE WHEN seq %% 2 = 0 THEN seq / 2 + 1 END ORDER BY seq), array_agg(seq / 2 ORDER BY seq),
       array_agg(CASE WHEN seq %% 2 = 0 THEN seq / 2 + 1 END ORDER BY seq),
       array_agg(40 ORDER BY seq), array_agg(CASE WHEN seq %% 2 = 0 THEN 300 END ORDER BY seq),
       '{}'::jsonb,
       jsonb_build_object('seq', batch.seq_from + %(size)s - 1, 't_ms', (batch.seq_from + %(size)s - 1) * 0.15,
                          'figures', jsonb_build_object('events', batch.seq_from + %(size)s - 1,
                                                        'committed', (batch.seq_from + %(size)s - 1) / 2),
                          'state', '{}'::jsonb)
FROM generate_series(1, %(events)s, %(size)s) AS batch(seq_from)
CROSS JOIN LATERAL generate_series(batch.seq_from, batch.seq_from + %(size)s - 1) AS seq
GROUP BY batch.seq_from
"""


def long_finished_job(events: int = 400_000, batch: int = 600, *, status: str = Job.Status.SUCCEEDED) -> Job:
    """A counter job with `events` stored events (a whole number of batches of `batch`), in `status`."""
    events -= events % batch
    params = program("counter").clean({"strategy": "occ", "writers": 4, "seconds": 60})
    now = timezone.now()
    finished = status in Job.FINISHED
    with transaction.atomic():
        job = Job.objects.create(
            scenario="counter",
            params=params,
            status=status,
            started_at=now,
            finished_at=now if finished else None,
            last_seq=events,
            summary={"events": events, "committed": events // 2} if finished else None,
            invariant_ok=True if finished else None,
        )
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_BATCHES, {"job": job.pk, "size": batch, "events": events, "row": 1})
    return job

"""ANALYZE leaves the event batches' arrays and details alone.

No query filters or joins on them (the view unnests them after the batches are
found by job and seq_to), yet autovacuum's ANALYZE detoasted every sampled batch and
counted its most common elements, column by column: 5.6 s of a core for 460 MB of
events, again each time a tenth of the table was new, while jobs ran beside it.
"""

from django.db import migrations

COLUMNS = (
    "t_us", "actor", "op", "attempt", "kind", "row", "version_read", "version_written",
    "value_read", "value_written", "duration_us", "latency_us", "detail",
)  # fmt: skip


def statistics(target: int) -> str:
    return "ALTER TABLE jobs_eventbatch " + ", ".join(
        f'ALTER COLUMN "{column}" SET STATISTICS {target}' for column in COLUMNS
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0004_events_in_batches")]

    # -1: back to the server's default_statistics_target
    operations = [migrations.RunSQL(statistics(0), reverse_sql=statistics(-1))]

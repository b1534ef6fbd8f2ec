"""Each event batch keeps the snapshot its job's runner took as of the batch's last event.

Like the arrays (0005), ANALYZE leaves it alone: no query filters on it, and sampling it
would detoast every sampled batch.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0008_jobcontrol_payload'),
    ]

    operations = [
        migrations.AddField(
            model_name='eventbatch',
            name='snapshot',
            field=models.JSONField(blank=True, help_text='What the job showed as of seq_to (its figures and state), made by its runner.', null=True),
        ),
        migrations.RunSQL(
            'ALTER TABLE jobs_eventbatch ALTER COLUMN "snapshot" SET STATISTICS 0',
            reverse_sql='ALTER TABLE jobs_eventbatch ALTER COLUMN "snapshot" SET STATISTICS -1',
        ),
    ]

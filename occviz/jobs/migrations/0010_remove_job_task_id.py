from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0009_eventbatch_snapshot'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='job',
            name='task_id',
        ),
    ]

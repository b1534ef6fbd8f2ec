from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "occviz.jobs"
    label = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        # The store knows no job: a listener's statements run in its writes, and hand a running job's to the job.
        from django.db.models.signals import pre_delete

        from occviz.jobs.models import Job, hold_before_deleting
        from occviz.jobs.outside_writes import hand_to_job
        from occviz.store.writes import add_listener

        add_listener(hand_to_job)
        pre_delete.connect(hold_before_deleting, sender=Job, dispatch_uid="occviz.jobs.hold_before_deleting")

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "occviz.jobs"
    label = "jobs"
    verbose_name = "Jobs"

from django.apps import AppConfig


class OccvizConfig(AppConfig):
    name = "occviz"
    verbose_name = "occviz"

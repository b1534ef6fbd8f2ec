from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "occviz.api"
    label = "api"
    verbose_name = "API"

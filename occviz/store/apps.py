from django.apps import AppConfig


class StoreConfig(AppConfig):
    name = "occviz.store"
    label = "store"
    verbose_name = "Versioned store"

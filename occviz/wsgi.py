"""WSGI entry point (the dashboard is served over ASGI by Daphne; this is for plain HTTP hosts)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "occviz.settings")
application = get_wsgi_application()

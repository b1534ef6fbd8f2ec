"""occviz settings, read from the environment and validated at start.

OCCVIZ_DATA_DIR  the folder occviz keeps its own files in (default .pgdata/, git-ignored)
DATABASE_URL   any PostgreSQL; unset: the embedded PostgreSQL in the data folder
REDIS_URL      channel layer on Redis; unset: PostgreSQL LISTEN/NOTIFY carries it
SECRET_KEY     unset: a key generated once and kept in the data folder (occviz/deploy.py)
DEBUG, ALLOWED_HOSTS, CSRF_TRUSTED_ORIGINS
OCCVIZ_HTTPS, OCCVIZ_HSTS_*, OCCVIZ_TRUST_X_FORWARDED_PROTO  serving over HTTPS (README: Configuration)
OCCVIZ_MAX_*   the limits on one job (checked by occviz/scenarios/base.py)
OCCVIZ_DB_CONNECTIONS, OCCVIZ_RESERVED_CONNECTIONS, OCCVIZ_MAX_JOBS_PER_USER  limits across jobs
OCCVIZ_PROCESS  what this process is ("web": the web server, set by occviz/asgi.py); names its connections
OCCVIZ_KEEP_DAYS  how long finished jobs' events are kept (default 30; 0: for ever)
OCCVIZ_PIN_ACTORS  keep a running job's threads on one CPU (default off)
OCCVIZ_TLS_PORT, OCCVIZ_TLS_CERT, OCCVIZ_TLS_KEY, OCCVIZ_TLS_CA  serve's HTTPS port and its certificate (occviz/tls.py)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from occviz.connections import LAYER_POOL, WEB_LAYER_POOL, Reserve, default_reserve, machine_cores, process_kind
from occviz.deploy import stored_secret_key
from occviz.env import database_from_url, envbool, envint, envlist, envpath, envstr, redis_url

BASE_DIR = Path(__file__).resolve().parent.parent
# The embedded PostgreSQL's data (DATA_DIR/data) and the files one installation keeps for itself.
DATA_DIR = envpath("OCCVIZ_DATA_DIR", BASE_DIR / ".pgdata")

DEBUG = envbool("DEBUG", False)
# Unset, the key is this data folder's own: a key anyone can read in the source would let them forge sessions.
SECRET_KEY = envstr("SECRET_KEY", "") or stored_secret_key(DATA_DIR)
if not SECRET_KEY.strip():
    raise ImproperlyConfigured("SECRET_KEY is set but empty.")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

# Served over HTTPS: cookies travel only over it, plain HTTP is redirected, browsers are told to keep to it.
OCCVIZ_HTTPS = envbool("OCCVIZ_HTTPS", False)
SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = OCCVIZ_HTTPS
SECURE_HSTS_SECONDS = envint("OCCVIZ_HSTS_SECONDS", 31_536_000 if OCCVIZ_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("OCCVIZ_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = envbool("OCCVIZ_HSTS_PRELOAD", False)
# Only behind a proxy that sets X-Forwarded-Proto itself: trusted otherwise, any client could claim HTTPS.
if envbool("OCCVIZ_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "django_tasks_db",
    "channels_postgres",
    "occviz",
    "occviz.store",
    "occviz.jobs",
    "occviz.scenarios",
    "occviz.live",
    "occviz.web",
    "occviz.api",
    "occviz.lessons",
    "occviz.students",
]
# Daphne's app serves `manage.py runserver` over ASGI (websockets included). Only there: importing it
# loads Twisted, about 0.4 s of every other process's start (a job's runjob, a worker, each command).
# `serve` and the web processes run Daphne itself.
if sys.argv[1:2] == ["runserver"]:
    INSTALLED_APPS.insert(0, "daphne")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "occviz.urls"
ASGI_APPLICATION = "occviz.asgi.application"
WSGI_APPLICATION = "occviz.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "occviz.web.context.scenarios",
            ],
        },
    },
]

_database_url = envstr("DATABASE_URL", "")
if _database_url:
    _database = database_from_url(_database_url)
else:
    from occviz.embedded import ensure_embedded_postgres

    _database = ensure_embedded_postgres(DATA_DIR)
# "web" when occviz/asgi.py loads the settings (the web server), else the manage.py command or the program.
OCCVIZ_PROCESS = envstr("OCCVIZ_PROCESS", "").strip() or process_kind(sys.argv)
# Persistent connections: the live stream reads the store about ten times a second per job. The web
# server's are pooled instead (below). Each process names its connections in pg_stat_activity, unless
# PGAPPNAME does (serve names its workers' and web server's by the serve).
DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        **_database,
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {} if os.environ.get("PGAPPNAME") else {"application_name": f"occviz {OCCVIZ_PROCESS}"[:63]},
        "TEST": {"NAME": envstr("TEST_DATABASE_NAME", "") or None},
    }
}
# channels-postgres deletes group members through this alias; it is the same database.
DATABASES["channels_postgres"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

REDIS_URL = redis_url("REDIS_URL")
# The PostgreSQL layer's pool in this process: bounded, and counted in the reserve (occviz/connections.py).
_LAYER_POOL = {"min_size": 0, "max_size": WEB_LAYER_POOL if OCCVIZ_PROCESS == "web" else LAYER_POOL}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}},
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "occviz.live.layer.ReconnectingPostgresChannelLayer",
            # TIME_ZONE: the package reads it and fails silently without it.
            "CONFIG": {**DATABASES["default"], "TIME_ZONE": None, "PSYCOPG_OPTIONS": _LAYER_POOL},
        },
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Whitenoise serves the files straight from the apps and static/ (no collectstatic step).
WHITENOISE_USE_FINDERS = True

# The limits on one job: a single user must not be able to take the machine down.
OCCVIZ_MAX_WRITERS = envint("OCCVIZ_MAX_WRITERS", 64, maximum=256)
OCCVIZ_MAX_INCREMENTS = envint("OCCVIZ_MAX_INCREMENTS", 10_000, maximum=1_000_000)
OCCVIZ_MAX_ROWS = envint("OCCVIZ_MAX_ROWS", 64, maximum=10_000)
OCCVIZ_MAX_SECONDS = envint("OCCVIZ_MAX_SECONDS", 300, maximum=86_400)
OCCVIZ_MAX_THINK_MS = envint("OCCVIZ_MAX_THINK_MS", 5_000, maximum=600_000)
OCCVIZ_MAX_ATTEMPTS = envint("OCCVIZ_MAX_ATTEMPTS", 1_000, maximum=1_000_000)
# MySQL-compatible servers step scripts may run on (the anomalies table's second column); no other may be named.
OCCVIZ_MYSQL_URLS = envlist("OCCVIZ_MYSQL_URLS", ["mysql://root@127.0.0.1:3306/"])
# Across jobs (occviz/jobs/tasks.py): queued and running jobs hold at most the database's connections
# (OCCVIZ_DB_CONNECTIONS, 0: what it lets this role open) less a reserve for the web server and workers,
# and one person has at most OCCVIZ_MAX_JOBS_PER_USER of them.
OCCVIZ_DB_CONNECTIONS = envint("OCCVIZ_DB_CONNECTIONS", 0, minimum=0, maximum=100_000)
# Job worker processes serve starts: one per core (at least 2, at most 32) unless set.
OCCVIZ_WORKERS = envint("OCCVIZ_WORKERS", min(32, max(2, machine_cores())), maximum=32)
# Unless set: 32 with 2 workers, and each further worker's connections on top.
OCCVIZ_RESERVED_CONNECTIONS = envint(
    "OCCVIZ_RESERVED_CONNECTIONS", default_reserve(OCCVIZ_WORKERS, not REDIS_URL), minimum=0, maximum=10_000
)
OCCVIZ_MAX_JOBS_PER_USER = envint("OCCVIZ_MAX_JOBS_PER_USER", 4, maximum=1_000)
# Finished jobs' events are deleted this many days after they end (manage.py prune, serve daily); 0 keeps them.
OCCVIZ_KEEP_DAYS = envint("OCCVIZ_KEEP_DAYS", 30, minimum=0, maximum=36_500)
# Web server (Daphne) processes accepting from serve's one listening socket: a class's sockets spread over them.
OCCVIZ_WEB_PROCESSES = envint("OCCVIZ_WEB_PROCESSES", 1, maximum=8)
# What the reserve covers, each part bounded (occviz/connections.py); the web servers' pools share the rest.
OCCVIZ_CONNECTION_RESERVE = Reserve(
    OCCVIZ_RESERVED_CONNECTIONS, OCCVIZ_WORKERS, layer_on_postgres=not REDIS_URL, web_processes=OCCVIZ_WEB_PROCESSES
)
if OCCVIZ_PROCESS == "web":
    if OCCVIZ_CONNECTION_RESERVE.problem():
        raise ImproperlyConfigured(OCCVIZ_CONNECTION_RESERVE.problem())
    # Requests, watches and sockets borrow a connection and give it back (CONN_MAX_AGE 0 closes it into the
    # pool); above one, connections idle for a minute are closed; a borrower waits at most 10 s for one.
    _pool = {"min_size": 1, "max_size": OCCVIZ_CONNECTION_RESERVE.web_pool, "max_idle": 60.0, "timeout": 10.0}
    DATABASES["default"] = {
        **DATABASES["default"],
        "CONN_MAX_AGE": 0,
        "OPTIONS": {**DATABASES["default"]["OPTIONS"], "pool": _pool},
    }
# A running job renews its heartbeat every second; one silent this long lost its runner and is ended.
OCCVIZ_HEARTBEAT_TIMEOUT_S = envint("OCCVIZ_HEARTBEAT_TIMEOUT_S", 10, minimum=2, maximum=3_600)
# On, a running job's threads share one CPU (occviz/jobs/affinity.py): worth it only where they,
# not the disk, hold the job back (measurements: docs/performance.md).
OCCVIZ_PIN_ACTORS = envbool("OCCVIZ_PIN_ACTORS", False)
# serve's HTTPS port (0: none), for kubectl, which sends its token only over TLS; `manage.py kubeconfig`
# points there when no serve runs (else at the running serve's). Its certificate: these PEM files (the CA
# for kubeconfigs, if one of your own signed it), or unset, a CA and a certificate for 127.0.0.1/localhost
# made once in DATA_DIR/tls.
OCCVIZ_TLS_PORT = envint("OCCVIZ_TLS_PORT", 8443, minimum=0, maximum=65535)
OCCVIZ_TLS_CERT = envstr("OCCVIZ_TLS_CERT", "").strip()
OCCVIZ_TLS_KEY = envstr("OCCVIZ_TLS_KEY", "").strip()
OCCVIZ_TLS_CA = envstr("OCCVIZ_TLS_CA", "").strip()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"unwatched_groups": {"()": "occviz.live.layer_logging.UnwatchedGroupFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # A job no one watches publishes to an empty group: not worth a warning ten times a second.
        "channels_postgres.core": {"filters": ["unwatched_groups"]},
        "occviz": {"level": "INFO"},
        "django_tasks_db": {"level": "INFO"},
        "embedded_postgres": {"level": "WARNING"},
    },
}

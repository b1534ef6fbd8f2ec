# occviz: `make run` serves the dashboard, `make test` runs the whole suite.
# Needs only Python 3.12+ and make: the database is an embedded PostgreSQL.

HOST ?= 127.0.0.1
PORT ?= 8000
# HTTPS for kubectl (python manage.py kubeconfig <user>); 0: none.
TLS_PORT ?= 8443
# Job worker processes; empty: OCCVIZ_WORKERS, else one per core (at least 2).
WORKERS ?=
# Web server processes sharing the HTTP port (a class's sockets spread over them).
WEB_PROCESSES ?= 1
VENV := .venv
PY := $(VENV)/bin/python

# The first Python that is 3.12 or newer (pyenv shims that are not active fail the check).
PYTHON ?= $(shell for p in python3.12 python3.13 python3 $$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: run test lint typecheck check bench soak clean

$(VENV)/.installed: requirements.txt
	@test -n "$(PYTHON)" || { echo "occviz needs Python 3.12 or newer (python3.12, python3.13 or python3)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

run: $(VENV)/.installed
	$(PY) manage.py serve --host $(HOST) --port $(PORT) --tls-port $(TLS_PORT) $(if $(WORKERS),--workers $(WORKERS)) --web-processes $(WEB_PROCESSES)

# The suite runs in two phases: first everything but the `serial` tests, shared out over
# TEST_WORKERS pytest-xdist processes (0: all in this one), a test file's tests on one worker (its
# module fixtures made once), then the `serial` ones alone, the machine quiet for their timings.
# Both always run; either failing fails `make test`. TEST_WORKERS=0 runs the first phase in one process.
# occviz's bytecode is written first: the suite starts hundreds of Django processes, and each would
# compile every module of occviz again where PYTHONDONTWRITEBYTECODE is set.
TEST_WORKERS ?= 2
test: $(VENV)/.installed lint typecheck
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m compileall -q occviz
	status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial" || status=$$?; \
	$(PY) -m pytest -m serial || status=$$?; \
	exit $$status

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	$(PY) manage.py bench

# Not in CI: a thousand randomized jobs, every invariant checked (SOAK_JOBS=N, SOAK_SEED=S to replay).
SOAK_JOBS ?= 1000
soak: $(VENV)/.installed
	$(PY) manage.py soak --jobs $(SOAK_JOBS) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

clean:
	rm -rf $(VENV) .pgdata .pytest_cache .mypy_cache .ruff_cache

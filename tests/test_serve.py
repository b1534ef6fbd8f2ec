"""`manage.py serve`, what `make run` runs: it serves, prints a working sign-in, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_runs_the_app_and_its_workers_and_stops_on_ctrl_c(database_url: str) -> None:
    from django.contrib.auth import authenticate

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port), "--workers", "2"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    try:
        banner = ""
        deadline = time.monotonic() + 60
        while "Press Ctrl-C" not in banner and time.monotonic() < deadline:
            banner += server.stdout.readline()
        password = re.search(r"Sign in as 'demo' with password '([^']+)'", banner)
        assert password, banner
        assert authenticate(username="demo", password=password.group(1)) is not None
        children = psutil.Process(server.pid).children()
        assert len(children) == 3, "two db_workers and the web server"
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the web server never answered")
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
        assert server.returncode == 0, output
        assert "occviz stopped." in output
        assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

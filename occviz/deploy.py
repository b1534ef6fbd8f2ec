"""What running occviz beyond one's own machine needs: a secret key of its own, and the checks before a public bind.

Loaded by the settings (before Django is set up), so it imports nothing from Django but its exceptions.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from occviz.env import envbool, envstr

SECRET_KEY_FILE = "secret_key"


def stored_secret_key(data_dir: Path) -> str:
    """The secret key generated for this data folder: made on first use, then read back by every process.

    Processes that start together (serve's workers and web server) may all find no key and
    generate one each. Each writes its own to a private temporary file and hard-links it to
    the final name, which fails if the name exists: the first link wins, and everyone reads
    back the winner's key. The file is never seen half-written, and never readable by others.
    """
    path = data_dir / SECRET_KEY_FILE
    if not path.exists():
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=data_dir, prefix=f".{SECRET_KEY_FILE}.")  # mode 0600
        except OSError as error:
            raise ImproperlyConfigured(
                f"SECRET_KEY is not set and no key can be kept in {data_dir} ({error.strerror}): "
                "set SECRET_KEY, or OCCVIZ_DATA_DIR to a folder occviz may write."
            ) from None
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(50) + "\n")
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):  # another process got there first: its key is the key
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it (a new key is generated) or set SECRET_KEY.")
    return key


def is_loopback(host: str) -> bool:
    """Whether an address to bind (127.0.0.1, ::1, [::1], localhost) is reachable only from this machine."""
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:  # another host name, or "" (every address): treated as public
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def public_bind_problems(host: str) -> list[str]:
    """Why serving on `host` would be unsafe with this environment, one sentence each; [] on loopback.

    On a public address the defaults meant for one's own machine no longer hold: the secret
    key kept in the data folder, the host names of a loopback server, and DEBUG's pages.
    """
    if is_loopback(host):
        return []
    problems = []
    if not envstr("SECRET_KEY", "").strip():
        problems.append(
            "SECRET_KEY is not set: give the site a long random key of its own "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    if not envstr("ALLOWED_HOSTS", "").strip(" ,"):
        problems.append(
            "ALLOWED_HOSTS is not set: list the names and addresses clients use to reach it "
            "(comma-separated, e.g. ALLOWED_HOSTS=occviz.example.org,192.168.1.20)"
        )
    if envbool("DEBUG", False):
        problems.append("DEBUG is on: its error pages would show code and settings to anyone who can connect")
    return problems

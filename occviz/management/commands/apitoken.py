"""`manage.py apitoken <username> [--name NAME] [--read-only]`: a new API bearer token, alone on the last line."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.api.models import ApiToken


class Command(BaseCommand):
    help = "Create a bearer token for the API (Authorization: Bearer <token>), printed alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help='What the token is for (default "cli").')
        parser.add_argument("--read-only", action="store_true", help="The token may only read.")

    def handle(self, *args: Any, **options: Any) -> None:
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(options["username"])
        except model.DoesNotExist:
            raise CommandError(
                f"no user named {options['username']!r}: create one with `manage.py createsuperuser`"
            ) from None
        name = options["name"].strip()
        if not name or len(name) > 64:
            raise CommandError("--name must be 1 to 64 characters")
        row, token = ApiToken.issue(user, name, read_only=options["read_only"])
        access = "read-only" if row.read_only else "read-write"
        self.stderr.write(f"A {access} token {name!r} for {user.get_username()} (shown once):")
        self.stdout.write(token)

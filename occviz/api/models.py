"""Bearer tokens for the API: a user creates them in the dashboard or with `manage.py apitoken`."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token: only its SHA-256 is stored; the token itself is shown once, when it is made."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64, help_text='What it is for: "laptop", "kubeconfig".')
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(
        max_length=12, editable=False, help_text="The token's first characters, to tell it apart."
    )
    read_only = models.BooleanField(default=False, help_text="Reads only: a write with it is refused (403).")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...) of {self.user}"

    @classmethod
    def issue(cls, user: object, name: str, *, read_only: bool = False) -> tuple[ApiToken, str]:
        """A new token for `user`: the stored row, and the token (shown this once)."""
        token = "occviz_" + secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name, digest=_digest(token), prefix=token[:12], read_only=read_only)
        return row, token

    @classmethod
    def authenticate(cls, token: str) -> ApiToken | None:
        """The token's row (with its user), if the token is one that was issued and its user is active."""
        row = cls.objects.select_related("user").filter(digest=_digest(token)).first()
        if row is None or not row.user.is_active:
            return None
        cls.objects.filter(pk=row.pk).update(last_used_at=timezone.now())
        return row

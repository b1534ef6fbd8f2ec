"""The token of a student link: its id, signed with Django's signing under a salt of its own.

The token is the student's only credential. What it may open is decided from the link's row
each time it is used, so a revoked or expired link stops working at once, everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core import signing

from occviz.students.models import StudentLink

SALT = "occviz.students.link"
_signer = signing.Signer(salt=SALT)


def token_for(link: StudentLink) -> str:
    return _signer.sign(str(link.pk))


@dataclass
class LinkRefused(Exception):
    """Why a token opens nothing: `status` 403 (not a link of ours) or 410 (a link that was, and is no more)."""

    status: int
    title: str
    reason: str

    def __str__(self) -> str:
        return self.reason


TAMPERED = LinkRefused(
    403, "Not a student link", "This link is not one the teacher made: it was altered or mistyped. Ask for it again."
)


def link_id(token: str) -> int:
    """The link id a token names, if it is signed by us (LinkRefused otherwise); the row is not read."""
    try:
        value = _signer.unsign(token)
    except signing.BadSignature:
        raise TAMPERED from None
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise TAMPERED
    return int(value)


def open_link(token: str) -> StudentLink:
    """The usable link a token names, with its job; LinkRefused says why not (altered, unknown, revoked, expired)."""
    return usable(StudentLink.objects.select_related("job").filter(pk=link_id(token)).first())


def usable(link: StudentLink | None) -> StudentLink:
    """The link as read (None: no such row) if it may still be used; LinkRefused says why not."""
    if link is None:
        raise LinkRefused(410, "Link withdrawn", "This student link no longer exists: ask the teacher for a new one.")
    if link.revoked:
        raise LinkRefused(410, "Link revoked", "The teacher revoked this student link: ask for a new one.")
    if link.is_expired:
        raise LinkRefused(
            410,
            "Link expired",
            f"This student link expired at {link.expires:%H:%M} UTC: ask the teacher for a new one.",
        )
    return link


def lookup(token_or_id: str) -> StudentLink | None:
    """The link named by a token or by its id (for the command line and the admin), usable or not."""
    text = token_or_id.strip()
    if text.isascii() and text.isdigit() and len(text) <= 18:
        pk = int(text)
    else:
        try:
            pk = link_id(text)
        except LinkRefused:
            return None
    return StudentLink.objects.filter(pk=pk).first()

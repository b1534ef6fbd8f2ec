"""Student links: a signed URL a teacher hands the class, and the students who joined a job through one.

A link is a row (who made it, until when, whether it was revoked); the URL carries only its
id, signed (tokens.py). A student is a nickname on a job, made through a link: no account,
no session user. The nickname is their lane's name when they write to the job's object.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from occviz.jobs.models import Job

DEFAULT_MINUTES = 120
MAX_MINUTES = 24 * 60
MAX_STUDENTS_PER_JOB = 200
MAX_NICKNAME = 32


class StudentLink(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="student_links")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(default=timezone.now)
    expires = models.DateTimeField()
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"student link {self.pk} to job {self.job_id}"

    @classmethod
    def make(cls, job: Job, user: object, minutes: int = DEFAULT_MINUTES) -> StudentLink:
        """A new link to `job`, valid for `minutes` (1..MAX_MINUTES; the caller has checked them)."""
        now = timezone.now()
        owner = user if getattr(user, "pk", None) else None
        return cls.objects.create(job=job, created_by=owner, created=now, expires=now + timedelta(minutes=minutes))

    @property
    def is_expired(self) -> bool:
        return timezone.now() >= self.expires

    @property
    def is_usable(self) -> bool:
        return not self.revoked and not self.is_expired

    def revoke(self) -> bool:
        """Revoke it, once: False if it already was (the first revocation's time is kept)."""
        moved = StudentLink.objects.filter(pk=self.pk, revoked=False).update(revoked=True, revoked_at=timezone.now())
        self.refresh_from_db(fields=["revoked", "revoked_at"])
        return moved == 1


class Student(models.Model):
    """One nickname on one job: unique there whatever its case, and the name of the student's lane."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="students")
    link = models.ForeignKey(StudentLink, on_delete=models.CASCADE, related_name="students")
    nickname = models.CharField(max_length=MAX_NICKNAME)
    created = models.DateTimeField(default=timezone.now)
    # The rate limit's window (writes_in_window writes since window_start), moved by compare-and-swap.
    window_start = models.DateTimeField(null=True, blank=True)
    writes_in_window = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["created"]
        constraints = [models.UniqueConstraint(Lower("nickname"), "job", name="student_nickname_unique_per_job")]

    def __str__(self) -> str:
        return f"{self.nickname} on job {self.job_id}"

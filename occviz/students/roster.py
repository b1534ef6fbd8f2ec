"""Who joined a job through a student link: nicknames checked once, here, and the class's size bounded.

A nickname is 1 to 32 characters of text a person could type: no control characters (NUL
included) and no markup, unique on its job whatever its case. A refusal says why and stores
nothing. At most MAX_STUDENTS_PER_JOB students join one job: the count and the insert happen
under a lock on the job's roster, so two students joining at once cannot both be the 201st.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from django.core.signing import BadSignature, Signer
from django.db import IntegrityError, connection, transaction

from occviz.students.models import MAX_NICKNAME, MAX_STUDENTS_PER_JOB, Student, StudentLink

# The advisory lock's first key: this module's (the second is the job's id).
_ROSTER_LOCK = 0x5747
_MARKUP = set("<>&\"'`")
_seat_signer = Signer(salt="occviz.students.seat")


class JoinRefused(ValueError):
    """A nickname or a join refused: the message says why, for the student."""


def clean_nickname(raw: str) -> str:
    """The nickname as stored (NFC, outer spaces trimmed), or JoinRefused saying what is wrong with it."""
    if len(raw) > 4 * MAX_NICKNAME:  # said before any work on a long text
        raise JoinRefused(f"A nickname is at most {MAX_NICKNAME} characters; this one has {len(raw)}.")
    if "\x00" in raw:
        raise JoinRefused("A nickname cannot contain a NUL character.")
    nickname = unicodedata.normalize("NFC", raw).strip()
    if not nickname:
        raise JoinRefused("Pick a nickname: it cannot be empty.")
    if len(nickname) > MAX_NICKNAME:
        raise JoinRefused(f"A nickname is at most {MAX_NICKNAME} characters; this one has {len(nickname)}.")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") for c in nickname):
        raise JoinRefused("A nickname cannot contain control or invisible characters (tabs, line breaks...).")
    if _MARKUP & set(nickname):
        raise JoinRefused("A nickname cannot contain markup: leave out < > & \" ' and `.")
    return nickname


def join(link: StudentLink, raw_nickname: str) -> Student:
    """A new student on the link's job, or JoinRefused: a bad or taken nickname, or a full class."""
    nickname = clean_nickname(raw_nickname)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_ROSTER_LOCK, link.job_id])
        if Student.objects.filter(job_id=link.job_id, nickname__iexact=nickname).exists():
            raise JoinRefused(f"The nickname {nickname!r} is taken on this job: pick another.")
        if Student.objects.filter(job_id=link.job_id).count() >= MAX_STUDENTS_PER_JOB:
            raise JoinRefused(f"This job is full: {MAX_STUDENTS_PER_JOB} students have joined it already.")
        try:
            with transaction.atomic():
                return Student.objects.create(job_id=link.job_id, link=link, nickname=nickname)
        except IntegrityError:  # the unique constraint, should a join bypass this lock
            raise JoinRefused(f"The nickname {nickname!r} is taken on this job: pick another.") from None


_SEAT_COOKIE = "occviz-student-"


def seat_cookie_name(link: StudentLink) -> str:
    return f"{_SEAT_COOKIE}{link.job_id}"


def seat_value(student: Student) -> str:
    """What the student's cookie holds: their row's id, signed, so it names no one else's row."""
    return _seat_signer.sign(str(student.pk))


def seated(link: StudentLink, value: str | None) -> Student | None:
    """The student a cookie value names, if it is one of ours and a student of the link's job."""
    pk = _seat_of(value)
    return None if pk is None else Student.objects.filter(pk=pk, job_id=link.job_id).first()


def seats(cookies: Mapping[str, str]) -> dict[str, int]:
    """The students the seat cookies among `cookies` name (signed by us), by their job's id (as text).

    Which of them is a student of the job is for the reader to check, as `seated` does.
    """
    found = {}
    for name, value in cookies.items():
        job = name.removeprefix(_SEAT_COOKIE)
        if job != name and job.isascii() and job.isdigit() and len(job) <= 18 and (pk := _seat_of(value)) is not None:
            found[str(int(job))] = pk
    return found


def _seat_of(value: str | None) -> int | None:
    """The student's id a seat cookie's value names, if we signed it."""
    if not value:
        return None
    try:
        pk = _seat_signer.unsign(value)
    except BadSignature:
        return None
    if not (pk.isascii() and pk.isdigit() and len(pk) <= 18):
        return None
    return int(pk)

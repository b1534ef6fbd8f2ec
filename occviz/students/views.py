"""The student pages (/s/<token>/...), where the token is the only credential, and the teacher's link controls.

A student page never looks at `request.user`: whoever holds the token sees the job it names,
read-only, and after picking a nickname may press +1 (presses.py). The teacher's views make
and revoke links, for whoever may control the job (its owner, staff).
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from occviz.jobs.models import Job
from occviz.live import fragments
from occviz.live.jobstate import job_state
from occviz.scenarios import SCENARIOS
from occviz.students import roster
from occviz.students.models import MAX_MINUTES, MAX_NICKNAME, Student, StudentLink
from occviz.students.presses import MAX_PRESSES_PER_S, NOT_SEATED, Pressed, Read, read_for_press, takes_presses
from occviz.students.tokens import LinkRefused, open_link
from occviz.web.views import events_response


def _refused(request: HttpRequest, refused: LinkRefused) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"error": refused.reason}, status=refused.status)
    return render(request, "students/refused.html", {"refused": refused}, status=refused.status)


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "") or request.path.endswith(".json")


@require_http_methods(["GET", "HEAD", "POST"])
def student_page(request: HttpRequest, token: str) -> HttpResponse:
    """The nickname form, then the job live, read-only, with the +1 button where the scenario takes writes."""
    try:
        link = open_link(token)
    except LinkRefused as refused:
        return _refused(request, refused)
    student = roster.seated(link, request.COOKIES.get(roster.seat_cookie_name(link)))
    if student is None and request.method == "POST":
        return _join(request, link, token)
    if student is None:
        return render(request, "students/join.html", _join_context(link, token))
    return render(request, "students/student_page.html", _page_context(link, token, student))


def _join_context(link: StudentLink, token: str, **more: Any) -> dict[str, Any]:
    return {"link": link, "job": link.job, "token": token, "max_nickname": MAX_NICKNAME, **more}


def _join(request: HttpRequest, link: StudentLink, token: str) -> HttpResponse:
    raw = request.POST.get("nickname", "")
    try:
        student = roster.join(link, raw)
    except roster.JoinRefused as why:
        # The refused text is not echoed back into the form: a megabyte or markup would only come back.
        context = _join_context(link, token, error=str(why))
        return render(request, "students/join.html", context, status=400)
    response = redirect("students:page", token=token)
    # Path "/": sent with the student's pages (/s/) and with their socket (/ws/s/), which presses too.
    response.set_cookie(
        roster.seat_cookie_name(link),
        roster.seat_value(student),
        expires=link.expires,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=request.is_secure(),
    )
    return response


def _page_context(link: StudentLink, token: str, student: Student, pressed: Pressed | None = None) -> dict[str, Any]:
    job = link.job
    spec = SCENARIOS.get(job.scenario)
    return {
        "link": link,
        "job": job,
        "token": token,
        "student": student,
        "spec": spec,
        "vocabulary": spec.vocabulary(job.params) if spec else None,
        "live": fragments.first_render_context(job_state(job)),
        "takes_presses": takes_presses(job.scenario),
        "strategy": job.params.get("strategy") or "",
        "max_presses": MAX_PRESSES_PER_S,
        "pressed": pressed,
    }


@require_safe
def student_events(request: HttpRequest, token: str) -> HttpResponse:
    """The stored events of the link's job, as the job page reads them: its catch-up after a gap."""
    try:
        link = open_link(token)
    except LinkRefused as refused:
        return JsonResponse({"error": refused.reason}, status=refused.status)
    return events_response(request, link.job)


@require_POST
async def student_press(request: HttpRequest, token: str) -> HttpResponse:
    """One +1 on the job's object: JSON for the page's script, the page again without one.

    Async, so that the think between the read and the write is awaited here, holding no thread:
    the database work goes to the thread Django gives sync code, a step at a time.
    """
    started = await sync_to_async(_read_then_let_go)(request, token)
    if isinstance(started, HttpResponse):
        return started
    link, student, read = started
    if isinstance(read, Read):
        await asyncio.sleep(read.think_s)
        pressed = await sync_to_async(read.write)()
    else:
        pressed = read
    if _wants_json(request):
        return JsonResponse(pressed.as_json(), status=pressed.status)
    context = await sync_to_async(_page_context)(link, token, student, pressed)
    return await sync_to_async(render)(request, "students/student_page.html", context, status=pressed.status)


def _read_then_let_go(request: HttpRequest, token: str) -> HttpResponse | tuple[StudentLink, Student, Read | Pressed]:
    """`_read_for_press`, then its database connection back to the pool: the think after it holds none.

    (Without a pool, as in runserver, the connection is kept: a new one for the write would
    take longer than the think.)
    """
    try:
        return _read_for_press(request, token)
    finally:
        if getattr(connection, "pool", None) is not None:
            connection.close()


def _read_for_press(request: HttpRequest, token: str) -> HttpResponse | tuple[StudentLink, Student, Read | Pressed]:
    """The press's link and read, or the refusal to answer (a refused link, no nickname)."""
    try:
        link = open_link(token)
    except LinkRefused as refused:
        return _refused(request, refused)
    student = roster.seated(link, request.COOKIES.get(roster.seat_cookie_name(link)))
    if student is None:
        pressed = NOT_SEATED
        if _wants_json(request):
            return JsonResponse(pressed.as_json(), status=pressed.status)
        return render(request, "students/join.html", _join_context(link, token, error=pressed.message), status=403)
    return link, student, read_for_press(link.job, student)


def _back(request: HttpRequest, job: Job) -> str:
    """Where the teacher made or revoked the link (the job page, a lesson run), else the job page."""
    wanted = request.POST.get("next", "")
    if wanted and url_has_allowed_host_and_scheme(wanted, {request.get_host()}, require_https=request.is_secure()):
        return f"{wanted}#student-link"
    return f"{reverse('job_detail', args=[job.pk])}#student-link"


def parse_minutes(raw: str) -> int:
    """Minutes a link stays valid: a whole number 1..MAX_MINUTES (ValueError says what is wrong)."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        raise ValueError(f"minutes must be a whole number of minutes from 1 to {MAX_MINUTES} (24 hours), not {raw!r}")
    minutes = int(text)
    if not 1 <= minutes <= MAX_MINUTES:
        raise ValueError(f"a student link lasts 1 to {MAX_MINUTES} minutes (at most 24 hours), not {minutes}")
    return minutes


def _not_allowed(what: str) -> HttpResponse:
    return HttpResponse(
        f"Only whoever launched this job, or staff, may {what}.", status=403, content_type="text/plain; charset=utf-8"
    )


@require_POST
@login_required
def link_create(request: HttpRequest, job_id: int) -> HttpResponseBase:
    job = get_object_or_404(Job, pk=job_id)
    if not job.may_be_controlled_by(request.user):
        return _not_allowed("make a student link to it")
    try:
        minutes = parse_minutes(request.POST.get("minutes", "120"))
    except ValueError as why:
        return HttpResponse(f"No link made: {why}.", status=400, content_type="text/plain; charset=utf-8")
    StudentLink.make(job, request.user, minutes)
    return redirect(_back(request, job))


@require_POST
@login_required
def link_revoke(request: HttpRequest, link_id: int) -> HttpResponseBase:
    link = get_object_or_404(StudentLink.objects.select_related("job"), pk=link_id)
    if not link.job.may_be_controlled_by(request.user):
        return _not_allowed("revoke its student links")
    link.revoke()
    return redirect(_back(request, link.job))

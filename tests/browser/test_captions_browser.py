"""Captions in the browser: paced for reading, key moments pinned, and replay saying what the live page said.

The pacing is read from the page's own clock (Occviz.captions.state(): when each caption
was shown and replaced), so a caption replaced too soon fails the check without the test
having to watch it for long.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Event, Job
from occviz.jobs.tasks import launch
from occviz.scenarios import SCENARIOS
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def caption_state(page: Page) -> dict[str, Any]:
    return page.evaluate("Occviz.captions.state()")  # type: ignore[no-any-return]


def python_words(job_id: int) -> tuple[dict[int, str], dict[int, str]]:
    """Each stored event's caption, and its log sentence, as the server words them, by seq."""
    spec = SCENARIOS[Job.objects.get(pk=job_id).scenario]
    captions, sentences = {}, {}
    for row in Event.objects.filter(job_id=job_id).order_by("seq").values():
        event = {**row, "detail": json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]}
        caption = spec.caption(event)
        if caption is not None:
            captions[row["seq"]] = caption
            sentences[row["seq"]] = spec.describe(event)
    return captions, sentences


def python_captions(job_id: int) -> dict[int, str]:
    return python_words(job_id)[0]


def key_moments(page: Page) -> list[tuple[str, str, str]]:
    return [
        (item.get_attribute("data-kind") or "", item.get_attribute("data-seq") or "", item.inner_text())
        for item in page.locator("#key-moments li").all()
    ]


def test_captions_are_paced_and_the_rest_counted_by_kind(page: Page, app_url: str, teacher: User) -> None:
    sign_in(page, app_url, teacher)
    job = launch(
        "counter", {"strategy": "occ", "writers": 8, "seconds": 3, "think_ms": 2, "retry": "immediate"}, teacher
    )
    page.goto(f"{app_url}/jobs/{job.pk}/")

    # Off by default on the normal page, with a toggle a keyboard reaches.
    toggle = page.locator("[data-captions-toggle]")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    expect(page.locator("[data-captions-body]")).to_be_hidden()
    toggle.focus()
    page.keyboard.press("Enter")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    page.keyboard.press("Enter")
    expect(toggle).to_have_attribute("aria-pressed", "false")

    # Presenter mode turns them on; its `c` key (the event, and its toggle of the body's class) turns them off.
    page.evaluate("document.body.classList.add('presenting')")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    page.evaluate(
        "document.body.classList.toggle('captions-on');"
        "document.dispatchEvent(new CustomEvent('occviz:captions-toggle'))"
    )
    expect(toggle).to_have_attribute("aria-pressed", "false")
    page.wait_for_timeout(200)
    assert page.evaluate("document.body.classList.contains('captions-on')") is False
    expect(toggle).to_have_attribute("aria-pressed", "false")
    page.evaluate("document.body.classList.remove('presenting')")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#captions [data-caption]")).to_contain_text("In Kubernetes", timeout=15_000)

    # While the first caption is up, the conflicts that come faster than it can be read are counted under it.
    expect(page.locator("#captions [data-caption-more]")).to_have_text(re.compile(r"and \d+ more conflicts"))
    page.wait_for_function("Occviz.captions.state().history.length >= 2", timeout=15_000)
    first = caption_state(page)["history"][0]
    assert first["until"] - first["since"] >= 3000, first
    assert re.search(r"and (\d+) more conflicts", first["more"]), first

    # Every caption stayed up its 3 s, by the page's clock; the job's verdict ends the list.
    page.wait_for_function("Occviz.captions.state().history.some((h) => h.kind === 'verdict')", timeout=30_000)
    history = caption_state(page)["history"]
    assert all(h["until"] - h["since"] >= 3000 for h in history if h["until"] is not None), history
    expect(page.locator("#key-moments li[data-kind=verdict]")).to_contain_text("Invariant holds")
    expected = python_captions(job.pk)
    assert all(h["text"] == expected[h["seq"]] for h in history if h["seq"] is not None)


def test_a_failover_is_a_key_moment_live_and_replay_says_the_same(page: Page, app_url: str, teacher: User) -> None:
    sign_in(page, app_url, teacher)
    params = {
        "replicas": 3,
        "lease_duration": 1,
        "renew_deadline": 0.6,
        "retry_period": 0.2,
        "seconds": 4,
        "kill_leader_at": 1,
    }
    job = launch("leader-election", params, teacher)
    # Presenter mode's address: captions on from the start.
    page.goto(f"{app_url}/jobs/{job.pk}/?present=1")
    expect(page.locator("[data-captions-toggle]")).to_have_attribute("aria-pressed", "true")

    # The failover stays pinned among the key moments, however many renewals and back-offs follow.
    failover = page.locator(
        "#key-moments li[data-kind=acquired]", has_text=re.compile(r"after replica-\d (\(process \d+\) )?was killed")
    )
    expect(failover).to_have_count(1, timeout=15_000)
    expect(failover).to_contain_text("never by the holder's renewTime")
    expect(page.locator("#key-moments li[data-kind=killed]")).to_have_count(1)
    expect(page.locator("#key-moments li[data-kind=verdict]")).to_have_count(1, timeout=20_000)
    live = key_moments(page)
    expected, sentences = python_words(job.pk)
    # A key moment is listed with its caption, or, once that caption's situation was explained, its log sentence.
    for kind, seq, text in live:
        if kind != "verdict":
            assert text.endswith((expected[int(seq)], sentences[int(seq)])), (text, expected[int(seq)])
    assert not any(kind in ("renewed", "backed_off") for kind, _, _ in live)

    # A presenter's `c` key sends this event: captions off, and on again.
    page.evaluate("document.dispatchEvent(new CustomEvent('occviz:captions-toggle'))")
    expect(page.locator("[data-captions-body]")).to_be_hidden()
    page.evaluate("document.dispatchEvent(new CustomEvent('occviz:captions-toggle'))")
    expect(page.locator("[data-captions-body]")).to_be_visible()

    # Opened again once finished, the job page reads its stored events: the same key moments, the verdict shown.
    page.goto(f"{app_url}/jobs/{job.pk}/?present=1")
    expect(page.locator("#captions [data-caption]")).to_contain_text("Invariant holds")
    assert key_moments(page) == live
    # The verdict has no time: its first word starts where the caption's line does, not after an empty time column.
    indent = page.evaluate(
        "document.querySelector('#captions [data-caption]').getClientRects()[0].left"
        " - document.querySelector('#captions .caption-text').getBoundingClientRect().left"
    )
    assert indent < 2, indent

    # Replay reads the same stored events: dragged to the end, the same key moments and the verdict.
    page.goto(f"{app_url}/jobs/{job.pk}/replay/?present=1")
    page.wait_for_selector("[data-page=replay][data-ready='1']")
    scrub = page.locator("[data-scrub]")
    scrub.fill(scrub.get_attribute("max") or "0")
    expect(page.locator("#key-moments li[data-kind=verdict]")).to_have_count(1)
    assert key_moments(page) == live
    # A step (here, a drag while paused) shows its caption at once: the latest captioned event up to it.
    state = caption_state(page)
    assert state["current"]["kind"] == "verdict"
    failover_seq = int(failover_seq_of(live))
    t_ms = Event.objects.get(job_id=job.pk, seq=failover_seq).t_ms
    scrub.fill(str(t_ms))
    page.wait_for_function("(seq) => Occviz.captions.state().current.text.includes('was killed')", arg=failover_seq)
    assert caption_state(page)["current"]["text"] == expected[failover_seq]
    assert [kind for kind, _, _ in key_moments(page)][-1] == "acquired"

    # Played, replay paces its captions by its own clock: each shown at least 3 s of playing.
    scrub.fill("0")
    page.click("[data-play]")
    page.wait_for_function("Occviz.captions.state().history.length >= 3", timeout=15_000)
    history = caption_state(page)["history"]
    assert all(h["until"] - h["since"] >= 3000 for h in history if h["until"] is not None), history
    assert all(h["text"] == expected[h["seq"]] for h in history if h["seq"] is not None)


def failover_seq_of(moments: list[tuple[str, str, str]]) -> str:
    return next(seq for kind, seq, text in moments if kind == "acquired" and "was killed" in text)

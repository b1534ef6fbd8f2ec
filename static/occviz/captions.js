/* occviz captions: what just happened, one sentence at a time, and the key moments pinned.

   The words are the scenario's own: each event kind of interest declares its captions in the
   vocabulary (kind.captions, filled by Vocabulary.fill, the rules of the server's `fill`), whether
   it is a key moment (kind.key) and the noun its events are counted by (kind.plural). pages.js
   tells this script each batch of events it applied ("occviz:events": live, the history of a
   finished job, or replay) and the job's end ("occviz:job-end").

   Captions are paced for reading: each stays at least MIN_SHOWN_MS by the page's clock (replay's
   own, which stops while replay is paused). When more arrive than can be read, the latest waits
   its turn and those it superseded are counted under the caption they followed ("and 41 more
   conflicts"); a key moment is never counted away, and is listed in #key-moments, where
   renewals and back-offs cannot push it out. */
"use strict";

(function () {
  const MIN_SHOWN_MS = 3000;
  // Captions waiting their turn (key moments of different kinds, then the latest other one); more are counted.
  const MAX_WAITING = 4;
  // Key moments of one kind listed one by one (with their caption the first time it says something new, in
  // their log sentence after); the rest of that kind are counted on one line.
  const LISTED_PER_KIND = 4;
  const HISTORY = 200;

  /** What to say for the events counted rather than shown, the most numerous kind first. */
  function countedText(more) {
    const parts = [...more.values()].sort((a, b) => b.n - a.n).map((c) => (c.n === 1 ? `one more ${c.singular}` : `${c.n} more ${c.plural}`));
    return parts.length ? "and " + parts.join(", ") : "";
  }

  function addCount(more, kind, singular, plural, n) {
    const found = more.get(kind) || { n: 0, singular, plural };
    found.n += n;
    more.set(kind, found);
  }

  /** The captions in turn: the one shown, those waiting, and what was counted after each. */
  class CaptionQueue {
    constructor(now) {
      this.now = now;
      this.clear();
    }

    clear() {
      this.current = null;
      this.waiting = [];
      this.history = [];
    }

    push(entry) {
      entry.more = new Map();
      if (!this.current) return this.show(entry);
      // A key moment always gets its turn, unless the next to come is one more of its kind.
      let last;
      while ((last = this.waiting[this.waiting.length - 1]) && (!last.key || last.kind === entry.kind)) {
        const before = this.waiting.length > 1 ? this.waiting[this.waiting.length - 2] : this.current;
        if (!entry.key && last.kind !== before.kind && entry.kind === before.kind) {
          // What waits says something new; one more of what is shown is counted under it instead.
          this.count(last, entry);
          return;
        }
        // Superseded before its turn: counted under the caption before it, and the newer one waits instead.
        this.waiting.pop();
        this.count(before, last);
      }
      // However many kinds of key moments come at once, the captions stay at most a few turns behind.
      if (this.waiting.length >= MAX_WAITING) this.count(this.waiting[this.waiting.length - 1], entry);
      else this.waiting.push(entry);
    }

    /** Shows `entry` at once, forgetting what waited: a step in replay says what the step did. */
    replace(entry) {
      entry.more = new Map();
      this.waiting = [];
      this.show(entry);
    }

    count(into, entry) {
      addCount(into.more, entry.kind, entry.singular, entry.plural, 1);
      for (const [kind, c] of entry.more) addCount(into.more, kind, c.singular, c.plural, c.n);
    }

    /** The next caption, once the one shown has been up long enough; true if it changed. */
    tick() {
      if (!this.current || !this.waiting.length || this.now() - this.current.since < MIN_SHOWN_MS) return false;
      this.show(this.waiting.shift());
      return true;
    }

    show(entry) {
      const at = this.now();
      if (this.current) this.current.until = at;
      entry.since = at;
      this.current = entry;
      this.history.push(entry);
      if (this.history.length > HISTORY) this.history.shift();
    }
  }

  /** The key moments list: each in time order, LISTED_PER_KIND of a kind, then a line counting the rest. */
  class KeyMoments {
    constructor(list) {
      this.list = list;
      this.reset();
    }

    reset() {
      this.list.replaceChildren();
      this.byKind = new Map();
      this.explained = new Set();
    }

    add(entry) {
      const seen = this.byKind.get(entry.kind) || { n: 0, line: null };
      this.byKind.set(entry.kind, seen);
      seen.n += 1;
      if (seen.n <= LISTED_PER_KIND) {
        const explained = this.explained.has(entry.said) && entry.short;
        this.explained.add(entry.said);
        this.list.appendChild(this.item(explained ? { ...entry, text: entry.short } : entry));
        return;
      }
      if (!seen.line) {
        seen.line = this.item({ ...entry, text: "", t_ms: null });
        seen.line.classList.add("key-more");
        seen.line.dataset.more = entry.kind;
        this.list.appendChild(seen.line);
      }
      const rest = seen.n - LISTED_PER_KIND;
      seen.line.lastChild.textContent = rest === 1 ? `and one more ${entry.singular}` : `and ${rest} more ${entry.plural}`;
    }

    item(entry) {
      const li = document.createElement("li");
      li.dataset.kind = entry.kind;
      if (entry.seq != null) li.dataset.seq = String(entry.seq);
      li.style.setProperty("--kind", entry.color || "#16202c");
      const at = document.createElement("span");
      at.className = "key-at";
      at.textContent = entry.t_ms != null ? window.Occviz.fmtMs(entry.t_ms) : entry.kind === "verdict" ? "end" : "";
      const text = document.createElement("span");
      text.textContent = entry.text;
      li.append(at, " ", text);
      return li;
    }
  }

  /** An event as a caption entry, or null for a kind without captions (or one none of whose templates fill). */
  function entryFor(vocabulary, e) {
    const kind = vocabulary.kind(e.kind);
    if (!kind.captions || !kind.captions.length) return null;
    const who = vocabulary.actorName(e.actor);
    for (const [index, template] of kind.captions.entries()) {
      const text = vocabulary.fill(template, e, who);
      if (text != null) {
        return {
          text,
          kind: kind.name,
          // Which of the kind's captions: each situation is explained in full once in the key moments.
          said: `${kind.name} ${index}`,
          key: Boolean(kind.key),
          plural: kind.plural,
          singular: kind.singular || kind.label,
          color: kind.color,
          // The event's log sentence: how a key moment of a kind already explained is listed.
          short: kind.key ? vocabulary.sentence(e) : "",
          seq: e.seq,
          t_ms: e.t_ms,
        };
      }
    }
    return null;
  }

  /** The caption of the last captioned event among `events`, or null. */
  function lastEntry(vocabulary, events) {
    for (let i = events.length - 1; i >= 0; i--) {
      const entry = entryFor(vocabulary, events[i]);
      if (entry) return entry;
    }
    return null;
  }

  /** The job's verdict as a caption: its status and invariant, from the stored summary. */
  async function verdictEntry(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) return null;
    const job = await response.json();
    if (!["succeeded", "failed", "cancelled"].includes(job.status)) return null;
    const ended = job.status === "succeeded" ? "" : `The job ${job.status === "failed" ? "failed" : "was cancelled"}. `;
    const text = job.summary && job.summary.invariant
      ? `${ended}${job.invariant_ok ? "Invariant holds" : "Invariant broken"}: ${job.summary.invariant}`
      : `${ended}It ended without a summary.`;
    return { text, kind: "verdict", key: true, plural: "verdicts", singular: "verdict", color: job.invariant_ok ? "#1a9e4b" : "#d62828", seq: null, t_ms: null };
  }

  /** Wall time that stops while replay is paused midway: replay's own clock for pacing its captions.
      (At its end it runs on, so that the last captions and the verdict still get their turn.) */
  function replayClock(page, atEnd) {
    let t = 0;
    let last = performance.now();
    return () => {
      const wall = performance.now();
      if (page.dataset.playing === "1" || atEnd()) t += wall - last;
      last = wall;
      return t;
    };
  }

  function captions(section) {
    const page = document.querySelector("[data-page]");
    const replay = page && page.dataset.page === "replay";
    let replayAtEnd = false;
    const now = replay ? replayClock(page, () => replayAtEnd) : () => performance.now();
    const queue = new CaptionQueue(now);
    const keys = new KeyMoments(section.querySelector("#key-moments"));
    const button = section.querySelector("[data-captions-toggle]");
    const body = section.querySelector("[data-captions-body]");
    const caption = section.querySelector("[data-caption]");
    const at = section.querySelector("[data-caption-at]");
    const more = section.querySelector("[data-caption-more]");
    const none = section.querySelector("[data-key-moments-empty]");
    const summaryUrl = section.dataset.summaryUrl;
    let on = false;
    let verdict = null; // the verdict's entry, once known
    let verdictShown = false;
    // Replay shows only finished jobs' events: its verdict is known from the start.
    let verdictLoad = replay ? verdictEntry(summaryUrl).catch(() => null) : null;

    const render = () => {
      const entry = queue.current;
      caption.textContent = entry ? entry.text : "Nothing yet: captions follow the job's events as they happen.";
      at.textContent = entry && entry.t_ms != null ? window.Occviz.fmtMs(entry.t_ms) : "";
      section.style.setProperty("--kind", entry ? entry.color : "transparent");
      const counted = entry ? countedText(entry.more) : "";
      more.textContent = counted;
      more.hidden = !counted;
      none.hidden = keys.list.children.length > 0;
      section.dataset.shown = String(queue.history.length);
    };

    const setOn = (value) => {
      on = value;
      body.hidden = !on;
      button.setAttribute("aria-pressed", String(on));
      document.body.classList.toggle("captions-on", on);
    };
    button.addEventListener("click", () => setOn(!on));
    // Presenter mode's `c` key (and whoever else wants them) toggles captions through this event.
    document.addEventListener("occviz:captions-toggle", () => setOn(!on));
    // Entering presenter mode turns captions on; in it, `c` may turn them off again.
    const presenting = () => document.body.classList.contains("presenting");
    let wasPresenting = presenting();
    new MutationObserver(() => {
      if (presenting() && !wasPresenting && !on) setOn(true);
      wasPresenting = presenting();
    }).observe(document.body, { attributes: true, attributeFilter: ["class"] });
    setOn(new URLSearchParams(window.location.search).get("present") === "1" || presenting());

    const showVerdict = async (paced) => {
      if (verdictShown) return;
      verdictShown = true;
      verdict = verdict || (await (verdictLoad || (verdictLoad = verdictEntry(summaryUrl).catch(() => null))));
      if (!verdict || !verdictShown) return; // none, or replay went back in time meanwhile
      keys.add({ ...verdict });
      if (paced) queue.push({ ...verdict });
      else queue.replace({ ...verdict });
      render();
    };

    document.addEventListener("occviz:events", (ev) => {
      const { events, model, mode, reset, playing, atEnd } = ev.detail;
      if (mode === "replay") replayAtEnd = Boolean(atEnd);
      if (reset) {
        queue.clear();
        keys.reset();
        verdictShown = false;
      }
      // Live and playing replay queue each caption; a finished job's history and a step or a drag of
      // replay show the latest at once (the key moments list keeps them all).
      const paced = mode === "live" || (mode === "replay" && playing);
      const vocabulary = model.vocabulary;
      for (const e of events) {
        // Unpaced, only key moments are worded here (a finished job's history may be 100,000 events).
        if (!paced && !vocabulary.kind(e.kind).key) continue;
        const entry = entryFor(vocabulary, e);
        if (!entry) continue;
        if (entry.key) keys.add({ ...entry });
        if (paced) queue.push(entry);
      }
      if (!paced && mode === "replay") {
        const latest = lastEntry(vocabulary, events);
        if (latest) queue.replace(latest);
      }
      if (atEnd) showVerdict(paced);
      render();
    });
    document.addEventListener("occviz:job-end", () => showVerdict(queue.current != null));

    setInterval(() => {
      if (queue.tick()) render();
    }, 100);
    render();

    // The queue's state by the page's own clock, for tests and a curious teacher's dev tools.
    window.Occviz.captions = {
      MIN_SHOWN_MS,
      state: () => ({
        on,
        now: now(),
        current: queue.current && { text: queue.current.text, kind: queue.current.kind, since: queue.current.since, more: countedText(queue.current.more) },
        waiting: queue.waiting.length,
        history: queue.history.map((h) => ({ text: h.text, kind: h.kind, seq: h.seq, since: h.since, until: h.until ?? null, more: countedText(h.more) })),
      }),
    };
  }

  // A deferred script runs once the page is parsed, before pages.js's DOMContentLoaded starts the flow of events.
  const section = document.getElementById("captions");
  if (section && window.Occviz) captions(section);
})();

/* occviz accessibility: what the canvases show, in words, and the moments that matter, announced.
   Each chart, when drawn (viz.js `drawn`: an `occviz:drawn` event with what it shows), gets a
   visually hidden text of its own, linked by aria-describedby and rewritten at most once a
   second: a table of each actor's events by kind for the timeline, each rate's peak and
   latest value, the quota's numbers. One polite live region says the verdict when a job
   ends and, as they happen, the key moments: the kinds the scenario marks `key` (a change
   of leader, a fenced write, a kill, a leak, a resync, an erased field). */
"use strict";

(function () {
  const O = window.Occviz;
  const EVERY_MS = 1000;
  let made = 0;

  function el(tag, text) {
    const node = document.createElement(tag);
    if (text != null) node.textContent = text;
    return node;
  }

  /** The hidden text that describes `canvas`, made once, after its buttons and wrapper. */
  function descriptionOf(canvas) {
    if (canvas.occvizDescription) return canvas.occvizDescription;
    const box = el("div");
    box.className = "sr-only";
    box.id = `chart-text-${++made}`;
    box.dataset.chartText = "";
    (canvas.closest(".canvas-wrap") || canvas).after(box);
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-describedby", box.id);
    canvas.occvizDescription = box;
    return box;
  }

  /** The timeline as a table: one row per actor, one column per kind of event it shows. */
  function timelineText(box, { model, t0, t1 }) {
    const vocabulary = model.vocabulary;
    const counts = new Map();
    const kinds = new Set();
    for (const e of model.events) {
      if (e.t_ms < t0 || e.t_ms > t1) continue;
      const row = counts.get(e.actor) || {};
      row[e.kind] = (row[e.kind] || 0) + 1;
      counts.set(e.actor, row);
      kinds.add(e.kind);
    }
    const order = vocabulary.data.kinds.map((k) => k.name).filter((k) => kinds.has(k));
    for (const k of kinds) if (!order.includes(k)) order.push(k);
    const table = el("table");
    table.appendChild(el("caption", `Events of each ${vocabulary.data.actor_noun || "actor"} from ${O.fmtMs(t0)} to ${O.fmtMs(t1)}, by kind`));
    const head = table.createTHead().insertRow();
    head.appendChild(el("th", "actor")).scope = "col";
    for (const k of order) head.appendChild(el("th", vocabulary.kind(k).label)).scope = "col";
    const body = table.createTBody();
    for (let actor = 1; actor <= model.lanes; actor++) {
      const row = body.insertRow();
      row.appendChild(el("th", vocabulary.actorName(actor))).scope = "row";
      const seen = counts.get(actor) || {};
      for (const k of order) row.insertCell().textContent = String(seen[k] || 0);
    }
    box.replaceChildren(table);
  }

  /** Each rate's peak and its latest value, in words. */
  function ratesText(box, { series, vocabulary }) {
    const per = 1000 / series.bin_ms;
    const list = el("ul");
    for (const [kind, values] of Object.entries(series.rates)) {
      const label = vocabulary.kind(kind).label;
      if (!values.length) {
        list.appendChild(el("li", `${label}: none yet`));
        continue;
      }
      let peak = 0;
      values.forEach((v, i) => {
        if (v > values[peak]) peak = i;
      });
      const rate = (v) => String(+(v * per).toFixed(1));
      list.appendChild(el("li", `${label}: at most ${rate(values[peak])} per second (at ${O.fmtMs(peak * series.bin_ms)}), ${rate(values[values.length - 1])} per second at ${O.fmtMs((values.length - 1) * series.bin_ms)}`));
    }
    box.replaceChildren(el("p", "Events per second, by kind:"), list);
  }

  function quotaText(box, { quota }) {
    const leak = quota.used - quota.actual;
    box.textContent =
      `Quota hard ${quota.hard}; charged used ${quota.used}; the pods that exist request ${quota.actual}` +
      (leak > 0 ? `: ${leak} leaked` : "") +
      `; ${quota.resyncs} resync${quota.resyncs === 1 ? "" : "s"} so far.`;
  }

  function describe(canvas, facts) {
    const box = descriptionOf(canvas);
    if (facts.model) timelineText(box, facts);
    else if (facts.series) ratesText(box, facts);
    else if (facts.quota) quotaText(box, facts);
  }

  /** Rewrites a chart's text at most once a second, and once more after the last drawing. */
  document.addEventListener("occviz:drawn", (ev) => {
    const canvas = ev.target;
    canvas.occvizFacts = ev.detail;
    if (canvas.occvizDescribing) return;
    describe(canvas, ev.detail);
    canvas.occvizDescribing = setTimeout(function again() {
      canvas.occvizDescribing = null;
      if (canvas.occvizFacts !== ev.detail) describe(canvas, canvas.occvizFacts);
    }, EVERY_MS);
  });

  /** The page's one live region: what is said replaces what was said. */
  function announcer() {
    const region = el("div");
    region.className = "sr-only";
    region.setAttribute("aria-live", "polite");
    region.dataset.announce = "";
    document.body.appendChild(region);
    return (text) => {
      region.textContent = text;
    };
  }

  /** On a job page: the verdict when the job ends, and leadership changes while it runs. */
  function jobAnnouncements(page, say) {
    const verdictNow = () => {
      const verdict = document.querySelector("#live-status .verdict");
      return verdict ? verdict.textContent.replace(/\s+/g, " ").trim() : "";
    };
    let said = verdictNow(); // a finished job's verdict is on the page already, not news
    new MutationObserver(() => {
      const verdict = verdictNow();
      if (verdict && verdict !== said) {
        said = verdict;
        say(`Job finished. ${verdict}`);
      }
    }).observe(page, { childList: true, subtree: true });

    let seen = null; // the last seq looked at; the events already there when the page opened are not news
    page.addEventListener("occviz:drawn", (ev) => {
      const model = ev.detail.model;
      if (!model) return;
      if (seen == null || page.dataset.finished === "1") {
        seen = model.lastSeq;
        return;
      }
      const news = [];
      for (let i = model.events.length - 1; i >= 0 && model.events[i].seq > seen; i--) {
        const e = model.events[i];
        const kind = model.vocabulary.kind(e.kind);
        if (kind.key) news.unshift(model.vocabulary.sentence(e));
      }
      seen = model.lastSeq;
      if (news.length) say(news.slice(-3).join(" "));
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.querySelector('[data-page="job"]');
    if (page) jobAnnouncements(page, announcer());
  });
})();

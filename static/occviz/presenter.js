/* occviz presenter mode: a job, its replay or a lesson step projected for a class.

   `?present=1` or the Present button: full screen (when the browser allows it; the layout
   does not depend on it), large type, high contrast, a colour-blind-safe palette, and one
   screen with the figures, the scenario's state, the timeline and the captions (presenter.css).
   The keys (listed on `?`) drive what the page already has: the failure control buttons
   (so through the same /jobs/<id>/control/ endpoint), replay's player, the live view's
   drawing (Occviz.setFrozen). Also on every page: the failure controls mark the replica that
   leads and disable a replica that is down, from the state rows the server renders
   (data-actor, data-leads, data-down). */
"use strict";

(function () {
  const O = window.Occviz || {};
  const root = document.documentElement;

  // Okabe and Ito's palette, safe for the common colour blindnesses: each kind colour the
  // scenarios declare is shown as its nearest counterpart. Shapes and words stay as declared.
  const PALETTE = {
    "#d62828": "#d55e00", // conflict, refusal: vermillion, still read as red
    "#1a9e4b": "#009e73", // commit, success: bluish green
    "#f08c00": "#e69f00", // retry wait: orange
    "#1c64d6": "#0072b2", // lock wait: blue
    "#8b3fd9": "#cc79a7", // serialization failure: reddish purple
    "#0f766e": "#56b4e9", // outside write: sky blue
    "#7a1010": "#882255", // errors, deadlocks: wine
  };
  const safe = (color) => PALETTE[String(color).toLowerCase()] || color;

  const CONTROL_KEYS = { k: "kill", g: "stop", p: "pause", x: "cut_off" };
  const KEYS = [
    ["Space", "pause / resume (live: the drawing waits while events keep arriving; replay: the player)"],
    ["← →", "one event back / forward (replay)"],
    ["1 – 9", "select a replica or actor"],
    ["k", "kill the selected one"],
    ["g", "stop it gracefully"],
    ["p", "pause it"],
    ["x", "cut it off from the database"],
    ["a", "add a replica"],
    ["r", "run it again: a new job (in a lesson, the step again in the same lesson run)"],
    ["c", "captions on / off"],
    ["s", "the student link (its address and QR code) large, for the class to scan; again to hide"],
    ["f", "full screen on / off"],
    ["?", "this list"],
    ["Esc", "leave presenter mode (and full screen)"],
  ];

  let selected = 0;
  let noteTimer = null;

  const page = () => document.querySelector("[data-page]");
  const presenting = () => root.classList.contains("presenting");

  // -- entering and leaving --------------------------------------------------------------

  function setUrl(on) {
    const url = new URL(window.location.href);
    if (on) url.searchParams.set("present", "1");
    else url.searchParams.delete("present");
    history.replaceState(history.state, "", url);
  }

  function enter({ fullScreen = false } = {}) {
    root.classList.add("presenting");
    document.body.classList.add("presenting");
    setUrl(true);
    recolour(true);
    quieten();
    onResize();
    if (!document.body.classList.contains("captions-on")) toggleCaptions();
    if (fullScreen) requestFullScreen();
    window.dispatchEvent(new Event("resize")); // the canvases redraw at their new size
  }

  function leave() {
    root.classList.remove("presenting");
    document.body.classList.remove("presenting", "showing-student-link");
    setUrl(false);
    recolour(false);
    onResize();
    showKeys(false);
    if (O.frozen) pauseOrResume(); // the live view catches up: a page left frozen would look broken
    if (document.fullscreenElement) document.exitFullscreen().catch(() => {});
    window.dispatchEvent(new Event("resize"));
  }

  function requestFullScreen() {
    // Refused without a user's gesture or by policy: the layout is made for the window as it is.
    if (root.requestFullscreen) root.requestFullscreen().catch(() => {});
  }

  let windowed = false; // full screen left with `f`, not with Esc: presenter mode stays

  function toggleFullScreen() {
    if (document.fullscreenElement) {
      windowed = true;
      document.exitFullscreen().catch(() => {});
    } else {
      requestFullScreen();
    }
  }

  /** Esc in full screen is the browser's: it leaves full screen before the page hears of it. */
  function onFullScreenChange() {
    if (!document.fullscreenElement && presenting() && !windowed) leave();
    windowed = false;
  }

  /** The canvases' text follows the presenter's type size (viz.js reads --canvas-text). */
  function fitCanvasText() {
    if (presenting()) {
      const rootPx = parseFloat(getComputedStyle(root).fontSize) || 17;
      root.style.setProperty("--canvas-text", String(Math.round(rootPx * 0.8)));
    } else {
      root.style.removeProperty("--canvas-text");
    }
  }

  /** The rate chart takes the height left under the timeline (and the quota chart), so the charts fill
      the screen without running off it whatever the number of lanes; with too little left, it is left out. */
  function fitCharts() {
    const rates = document.querySelector(".job-page > .viz [data-rates]");
    const timeline = document.querySelector(".job-page > .viz [data-timeline]");
    if (!rates || !timeline) return false;
    const viz = rates.closest(".viz");
    const before = `${rates.style.getPropertyValue("--chart-height")} ${viz.classList.contains("cramped")}`;
    if (presenting()) {
      const heading = parseFloat(getComputedStyle(root).fontSize) * 1.7; // the rate chart's title
      const room = Math.floor(viz.getBoundingClientRect().bottom - timeline.getBoundingClientRect().bottom - heading - 10);
      viz.classList.toggle("cramped", room < 70);
      rates.style.setProperty("--chart-height", String(Math.max(70, Math.min(320, room))));
    } else {
      viz.classList.remove("cramped");
      rates.style.removeProperty("--chart-height");
    }
    return `${rates.style.getPropertyValue("--chart-height")} ${viz.classList.contains("cramped")}` !== before;
  }

  /** The key moments under the caption: shown while their heading and the first line of the first moment fit under
      it, else not at all, rather than a heading cut in half (on a projector's 720 lines a tall state leaves the
      caption little room). */
  function fitKeyMoments() {
    const box = document.querySelector("#captions .key-moments");
    if (!box) return;
    let fits = true;
    if (presenting() && box.getClientRects().length) {
      const bottom = box.getBoundingClientRect().bottom + 1;
      const title = box.querySelector("h2");
      const first = [...box.querySelectorAll("#key-moments li, [data-key-moments-empty]")].find((el) => el.getClientRects().length);
      const line = first ? parseFloat(getComputedStyle(first).fontSize) * 1.3 : 0;
      fits = title.getBoundingClientRect().bottom <= bottom && (!first || first.getBoundingClientRect().top + line <= bottom);
    }
    box.classList.toggle("unfit", !fits);
  }

  function onResize() {
    fitCanvasText();
    fitCharts();
    fitKeyMoments();
  }

  /** In presenter mode, only what this job has: figures still at zero and kinds not yet seen are left out. */
  function quieten() {
    const data = vocabularyData();
    const alarms = new Set(((data && data.figures) || []).filter((f) => f.alarm).map((f) => f.key));
    for (const dd of document.querySelectorAll("#live-figures dd[data-counter]")) {
      const nil = /^(0|0\.0+|—|—( \/ —)+)$/.test(dd.textContent.trim());
      dd.parentElement.classList.toggle("nil", nil && !alarms.has(dd.dataset.counter));
    }
    const seen = new Set();
    for (const vocabulary of (O.Vocabulary && O.Vocabulary.onPage) || []) for (const kind of vocabulary.seen) seen.add(kind);
    for (const li of document.querySelectorAll("[data-legend] li[data-kind]")) li.classList.toggle("unseen", !seen.has(li.dataset.kind));
  }

  function vocabularyData() {
    const el = document.getElementById("scenario-vocabulary");
    return el ? JSON.parse(el.textContent) : null;
  }

  // -- the palette ---------------------------------------------------------------------------

  const declared = new Map(); // element -> its declared colour, to put back on leaving

  function recolour(on) {
    // The vocabularies the page's charts draw with (made from the page's declaration): marks and lines follow.
    for (const vocabulary of (O.Vocabulary && O.Vocabulary.onPage) || []) {
      for (const kind of vocabulary.kinds.values()) {
        if (!kind.declared) kind.declared = kind.color;
        kind.color = on ? safe(kind.declared) : kind.declared;
      }
    }
    for (const mark of document.querySelectorAll("[data-legend] .mk, #live-log li")) recolourOne(mark, on);
  }

  function recolourOne(el, on) {
    const prop = el.classList.contains("mk") ? "--mk" : "--kind";
    if (!declared.has(el)) declared.set(el, el.style.getPropertyValue(prop).trim());
    const color = declared.get(el);
    if (color) el.style.setProperty(prop, on ? safe(color) : color);
  }

  // -- the failure controls: who leads, who is down, who is selected -----------------------

  function markActorRows() {
    const controls = document.getElementById("actor-controls");
    const state = document.getElementById("live-state");
    if (!controls) return;
    for (const row of controls.querySelectorAll("tr[data-actor-row]")) {
      const n = row.dataset.actorRow;
      const shown = state && state.querySelector(`[data-actor="${n}"]`);
      const leads = !!(shown && shown.hasAttribute("data-leads"));
      const down = shown ? shown.dataset.down || "" : "";
      row.classList.toggle("leads", leads);
      row.classList.toggle("down", !!down);
      row.classList.toggle("selected", String(selected) === n);
      let badge = row.querySelector("[data-row-badge]");
      const text = leads ? "★ leads" : down ? down : "";
      if (text && !badge) {
        badge = document.createElement("span");
        badge.dataset.rowBadge = "";
        row.querySelector("th").append(" ", badge);
      }
      if (badge && badge.textContent !== text) {
        // Only when it changes: a change is itself a mutation this function runs after.
        badge.textContent = text;
        badge.className = leads ? "leads-badge" : "down-badge";
        badge.hidden = !text;
      }
      // A replica that is gone can be neither killed nor paused again.
      for (const button of row.querySelectorAll("button[data-control]")) {
        button.disabled = !!down;
        if (down) button.title = `${row.querySelector("th").firstChild.textContent.trim()} is ${down}`;
      }
    }
    if (state) {
      for (const el of state.querySelectorAll("[data-actor]")) el.classList.toggle("selected", String(selected) === el.dataset.actor);
    }
  }

  function actorName(n) {
    const row = document.querySelector(`#actor-controls tr[data-actor-row="${n}"] th`);
    if (row) return row.firstChild.textContent.trim();
    const data = vocabularyData();
    return data && data.actors[n - 1] ? data.actors[n - 1] : `actor ${n}`;
  }

  function actorCount() {
    const rows = document.querySelectorAll("#actor-controls tr[data-actor-row]").length;
    if (rows) return rows;
    const data = vocabularyData();
    return data ? data.actors.length : 0;
  }

  function select(n) {
    if (n > actorCount()) {
      say(`There is no ${n}: this job has ${actorCount()}.`);
      return;
    }
    selected = n;
    bar().querySelector("[data-selected]").textContent = `selected: ${actorName(n)}`;
    markActorRows();
  }

  function control(action) {
    const offered = document.querySelector(`#actor-controls button[data-control="${action}"]`);
    if (!offered) {
      say(`No “${action.replace("_", " ")}” here${document.querySelector("[data-page=job][data-finished='1']") ? ": the job has ended" : " in this scenario"}.`);
      return;
    }
    if (!selected) {
      say("Select one first: 1 – 9.");
      return;
    }
    const button = document.querySelector(`#actor-controls tr[data-actor-row="${selected}"] button[data-control="${action}"]`);
    if (!button) say(`${actorName(selected)} has no “${action}”.`);
    else if (button.disabled) say(`${actorName(selected)} is down.`);
    else button.click(); // the button's own form: the same endpoint and checks as a click
  }

  function addActor() {
    const button = document.querySelector("#actor-controls button[data-adds-actor]");
    if (button) button.click();
    else say("No replica to add in this scenario.");
  }

  // -- space, arrows, again, captions ----------------------------------------------------------

  function pauseOrResume() {
    const p = page();
    if (!p) return;
    if (p.occvizReplay) {
      p.occvizReplay.toggle();
      return;
    }
    if (p.dataset.page !== "job" || !O.setFrozen) return;
    O.setFrozen(!O.frozen);
    document.body.classList.toggle("frozen", O.frozen);
    bar().querySelector("[data-frozen]").hidden = !O.frozen;
  }

  /** The same job again: a lesson's step again in the same lesson run (so its runs compare), else the same parameters. */
  function runAgain() {
    const p = page();
    const job = p && p.dataset.job;
    if (!job) {
      say("Run again from a job's page.");
      return;
    }
    const lesson = document.querySelector("[data-lesson-of-job][data-again-url]");
    const form = document.createElement("form");
    form.method = "post";
    form.action = lesson ? lesson.dataset.againUrl : `/jobs/${job}/again/`;
    const headers = JSON.parse(document.body.getAttribute("hx-headers") || "{}");
    const fields = [["csrfmiddlewaretoken", headers["X-CSRFToken"] || ""], ["present", "1"]];
    if (lesson) fields.push(["run", lesson.dataset.run]);
    for (const [name, value] of fields) {
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = value;
      form.append(input);
    }
    document.body.append(form);
    say("Running it again…");
    form.submit();
  }

  /** The student link made on this page (students' panel), shown over the page large enough to scan from a seat. */
  function toggleStudentLink() {
    const panel = document.getElementById("student-link");
    if (!panel || !panel.querySelector(".student-link-item")) {
      document.body.classList.remove("showing-student-link");
      return say(panel ? "No student link yet: make one on the normal page (Esc), under Students." : "No student link on this page.");
    }
    document.body.classList.toggle("showing-student-link");
  }

  const studentLinkShown = () => document.body.classList.contains("showing-student-link");

  function toggleCaptions() {
    const on = document.body.classList.toggle("captions-on");
    document.dispatchEvent(new CustomEvent("occviz:captions-toggle", { detail: { on } }));
  }

  // -- what the presenter sees of this script: a bar, the key list, a note --------------------

  function bar() {
    let el = document.getElementById("presenter-bar");
    if (el) return el;
    el = document.createElement("div");
    el.id = "presenter-bar";
    el.className = "presenter-bar";
    el.innerHTML =
      '<span data-selected></span><strong data-frozen hidden>⏸ paused: the job runs on, space resumes</strong>' +
      '<span class="presenter-note" data-presenter-note role="status" aria-live="polite"></span>' +
      '<button type="button" data-show-keys>? keys</button><button type="button" data-leave>Esc leave</button>';
    el.querySelector("[data-show-keys]").addEventListener("click", () => showKeys(true));
    el.querySelector("[data-leave]").addEventListener("click", leave);
    document.body.append(el);
    return el;
  }

  function say(text) {
    const note = bar().querySelector("[data-presenter-note]");
    note.textContent = text;
    clearTimeout(noteTimer);
    noteTimer = setTimeout(() => (note.textContent = ""), 6000);
  }

  function showKeys(on) {
    let overlay = document.getElementById("presenter-keys");
    if (!overlay && !on) return;
    if (!overlay) {
      overlay = document.createElement("div");
      overlay.id = "presenter-keys";
      overlay.className = "presenter-keys";
      overlay.setAttribute("role", "dialog");
      overlay.setAttribute("aria-label", "Presenter keys");
      const rows = KEYS.map(([key, what]) => `<tr><th scope="row"><kbd>${key}</kbd></th><td>${what}</td></tr>`).join("");
      overlay.innerHTML = `<div><h2>Presenter keys</h2><table>${rows}</table><p class="muted">Keys do nothing while a form field has focus. Press ? or Esc to close.</p></div>`;
      overlay.addEventListener("click", () => showKeys(false));
      document.body.append(overlay);
    }
    overlay.hidden = !on;
  }

  const keysShown = () => {
    const overlay = document.getElementById("presenter-keys");
    return !!overlay && !overlay.hidden;
  };

  function inField(target) {
    return !!(target && target.closest && target.closest("input, select, textarea, [contenteditable=''], [contenteditable=true]"));
  }

  function onKey(ev) {
    if (!presenting() || ev.ctrlKey || ev.metaKey || ev.altKey || inField(ev.target)) return;
    const key = ev.key;
    if (key === "?") return done(ev, () => showKeys(!keysShown()));
    if (key === "Escape") {
      if (keysShown()) return done(ev, () => showKeys(false));
      return done(ev, studentLinkShown() ? toggleStudentLink : leave);
    }
    if (key === " ") return done(ev, pauseOrResume);
    const replay = page() && page().occvizReplay;
    if (replay && (key === "ArrowLeft" || key === "ArrowRight")) return done(ev, () => replay.step(key === "ArrowLeft" ? -1 : 1));
    if (/^[1-9]$/.test(key)) return done(ev, () => select(Number(key)));
    const lower = key.length === 1 ? key.toLowerCase() : key;
    if (lower in CONTROL_KEYS) return done(ev, () => control(CONTROL_KEYS[lower]));
    const actions = { a: addActor, r: runAgain, c: toggleCaptions, f: toggleFullScreen, s: toggleStudentLink };
    if (lower in actions) return done(ev, actions[lower]);
  }

  function done(ev, action) {
    ev.preventDefault();
    action();
  }

  // -- wiring ----------------------------------------------------------------------------------

  /** After each swap of the server's fragments: the marks on the control rows, the new log lines' colours, the note. */
  function watchSwaps() {
    const container = page() || document.body;
    let lastNote = "";
    new MutationObserver(() => {
      markActorRows();
      if (presenting()) quieten();
      if (presenting() && fitCharts()) window.dispatchEvent(new Event("resize"));
      fitKeyMoments();
      if (presenting()) for (const li of document.querySelectorAll("#live-log li")) if (!declared.has(li)) recolourOne(li, true);
      const note = document.querySelector("#actor-controls [data-control-note]");
      const text = note ? note.textContent.trim() : "";
      if (text && text !== lastNote && presenting()) say(text);
      lastNote = text;
    }).observe(container, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-last-seq", "data-seq-shown"] });
  }

  /** In presenter mode, the way on (a lesson's next step, its run, a job of it) stays in presenter mode. */
  function keepPresenting(ev) {
    if (!presenting()) return;
    const staysIn = (url) => url.origin === window.location.origin && /^\/(jobs|lessons)\//.test(url.pathname);
    if (ev.type === "click") {
      const link = ev.target.closest && ev.target.closest("a[href]");
      if (!link || link.hasAttribute("download")) return;
      const url = new URL(link.href, window.location.href);
      if (staysIn(url) && !url.searchParams.has("present")) {
        url.searchParams.set("present", "1");
        link.href = url.href;
      }
    } else if (ev.target.matches("form") && staysIn(new URL(ev.target.action, window.location.href))) {
      if (!ev.target.querySelector("input[name=present]")) {
        const input = document.createElement("input");
        input.type = "hidden";
        input.name = "present";
        input.value = "1";
        ev.target.append(input);
      }
    }
  }

  function init() {
    document.addEventListener("click", keepPresenting, true);
    document.addEventListener("submit", keepPresenting, true);
    document.addEventListener("keydown", onKey);
    document.addEventListener("fullscreenchange", onFullScreenChange);
    // Delegated: the job page's controls are swapped in again when the job ends.
    document.addEventListener("click", (ev) => {
      if (!(ev.target.closest && ev.target.closest("[data-present]"))) return;
      ev.preventDefault();
      enter({ fullScreen: true });
    });
    window.addEventListener("resize", onResize);
    // A lane added (a replica joins) makes the timeline taller: the rate chart gives way.
    if (window.ResizeObserver) {
      const refit = new ResizeObserver(() => fitCharts() && window.dispatchEvent(new Event("resize")));
      for (const canvas of document.querySelectorAll(".viz canvas:not([data-rates])")) refit.observe(canvas);
      const viz = document.querySelector(".job-page > .viz");
      if (viz) refit.observe(viz);
      const moments = document.querySelector("#captions .key-moments");
      if (moments) new ResizeObserver(fitKeyMoments).observe(moments);
    }
    watchSwaps();
    markActorRows();
    if (presenting()) {
      enter();
      bar();
    }
  }

  document.addEventListener("DOMContentLoaded", init);
})();

/* Step mode's page behaviour (templates/scenarios/step.html draws the state).

   On a running job's page: a click on a transaction's column (or its Step button) runs its
   next step, and so do the keys `1`-`4` (choose a transaction) then space (step it), on the
   normal page and in presenter mode alike. A step is the job's `step` control, posted by the
   control's own button in the job's control rows, the same endpoint and checks as any control;
   those rows are hidden here, the columns stand for them. A transaction that is blocked or has
   run its script is not posted for: the note says why. Nothing here computes the state: every
   frame brings the server's rendering of it.

   On the launch form: each built-in script can be used or copied into the text field to edit,
   and a script refused for a line has that line numbered and selected in the field. */
"use strict";

(function () {
  const KEYS_HINT = "Click a column, or press 1 – 4 to choose a transaction and space to run its next step; n runs the next line as written.";
  let selected = 0;
  let noteTimer = null;
  let sending = false; // a step posted, its outcome not drawn yet

  const page = () => document.querySelector(".job-page[data-page]");
  const live = () => page() && page().dataset.page === "job";
  const stateEl = () => document.querySelector("#live-state [data-step-state]");
  const presenting = () => document.documentElement.classList.contains("presenting");
  const lane = (n) => stateEl() && stateEl().querySelector(`th[data-step-lane="${n}"]`);
  const laneCount = () => (stateEl() ? stateEl().querySelectorAll("th[data-step-lane]").length : 0);
  const nameOf = (n) => {
    const head = lane(n);
    return head ? head.querySelector(".step-actor-name").textContent.trim() : `T${n}`;
  };
  const controlButton = (n) => document.querySelector(`#actor-controls tr[data-actor-row="${n}"] button[data-control="step"]`);

  /** A job launched to run in its written order takes no steps from the page. */
  function runsItself() {
    const el = document.getElementById("scenario-vocabulary");
    const params = el ? JSON.parse(el.textContent).params || {} : {};
    return params.pace === "written order";
  }

  // -- what the teacher reads: one line above the script ------------------------------------------------

  function noteEl() {
    let note = document.querySelector("[data-step-note]");
    if (note) return note;
    const state = document.getElementById("live-state");
    if (!state) return null;
    note = document.createElement("p");
    note.className = "step-note";
    note.dataset.stepNote = "";
    note.setAttribute("role", "status");
    note.setAttribute("aria-live", "polite");
    state.before(note);
    return note;
  }

  function say(text, { sticky = false } = {}) {
    const note = noteEl();
    if (!note) return;
    note.textContent = text;
    clearTimeout(noteTimer);
    if (!sticky) noteTimer = setTimeout(hint, 8000);
  }

  /** The standing line: how to step, or why nothing can be stepped here. */
  function hint() {
    const note = noteEl();
    if (!note) return;
    const finished = page() && page().dataset.finished === "1";
    if (runsItself()) {
      note.textContent = finished ? "" : "This script runs by itself, in its written order.";
      return;
    }
    if (finished || !document.querySelector("#actor-controls button[data-control='step']")) {
      note.textContent = finished || !document.getElementById("actor-controls") ? "" : "Only whoever launched this job, or staff, can step it.";
      return;
    }
    note.textContent = KEYS_HINT;
  }

  // -- stepping -------------------------------------------------------------------------------------------

  function step(n) {
    if (runsItself()) return say("This script runs by itself, in its written order: nothing to step.");
    const head = lane(n);
    if (!head) return say(`There is no transaction ${n}: this script has ${laneCount()}.`);
    const name = nameOf(n);
    const status = head.dataset.status;
    if (status === "blocked") {
      const badge = head.querySelector("[data-waits]");
      const waits = badge ? badge.textContent.replace(/^\s*waits for\s*/, "").trim() : "another transaction";
      return say(`${name} is blocked, waiting for ${waits}: it goes on by itself when ${waits} commits or aborts. Step another one meanwhile.`);
    }
    if (!head.querySelector("[data-step-actor]") || head.querySelector("[data-step-actor]").disabled) {
      if (page().dataset.finished === "1") return say("The job has ended: replay it to go through its steps again.");
      if (status === "done" || status === "failed" || !stateEl().querySelector(`td[data-step-lane="${n}"][data-next]`)) {
        return say(`${name} has run all its steps.`);
      }
    }
    const button = controlButton(n);
    if (!button) {
      if (page().dataset.finished === "1" || !document.getElementById("actor-controls")) return say("The job has ended.");
      return say("Only whoever launched this job, or staff, can step it.");
    }
    for (const cell of stateEl().querySelectorAll(`[data-step-lane="${n}"][data-next]`)) cell.classList.add("step-sending");
    say(`${name}: running line ${lineOf(n)}…`);
    sending = true;
    button.click(); // its form posts the control (htmx), as a click on it would
  }

  /** The script's next line in its written order, whoever's it is (the job's `next` control). */
  function nextLine() {
    if (runsItself()) return say("This script runs by itself, in its written order: nothing to step.");
    const button = document.querySelector("#actor-controls button[data-control='next']");
    if (!button) return say(page().dataset.finished === "1" ? "The job has ended." : "No next line to run here.");
    say("Running the next line…");
    sending = true;
    button.click();
  }

  function lineOf(n) {
    const next = stateEl() && stateEl().querySelector(`td[data-step-lane="${n}"][data-next]`);
    return next ? next.closest("tr").dataset.line : "?";
  }

  function select(n) {
    if (n > laneCount()) return say(`There is no ${n}: this script has ${laneCount()} transactions.`);
    selected = n;
    markSelected();
    say(`${nameOf(n)} chosen: space runs its next step.`);
  }

  function markSelected() {
    const state = stateEl();
    if (!state) return;
    for (const el of state.querySelectorAll("[data-step-lane]")) el.classList.toggle("step-selected", String(selected) === el.dataset.stepLane);
  }

  // -- the mouse and the keys ---------------------------------------------------------------------------

  function onClick(ev) {
    if (!live()) return;
    if (ev.target.closest && ev.target.closest("#live-state [data-step-next-line]")) return nextLine();
    const target = ev.target.closest && ev.target.closest("#live-state [data-step-lane]");
    if (!target) return;
    // A row's text may be selected to copy it: a drag is not a click on the column.
    if (String(window.getSelection && window.getSelection()).trim() && !ev.target.closest("button")) return;
    ev.preventDefault();
    const n = Number(ev.target.closest("[data-step-actor]") ? ev.target.closest("[data-step-actor]").dataset.stepActor : target.dataset.stepLane);
    selected = n;
    markSelected();
    step(n);
  }

  function inField(target) {
    return !!(target && target.closest && target.closest("input, select, textarea, [contenteditable=''], [contenteditable=true]"));
  }

  /** On window, before presenter.js hears the key on the document: space steps the chosen transaction. */
  function onKey(ev) {
    if (!live() || !stateEl() || ev.ctrlKey || ev.metaKey || ev.altKey || inField(ev.target)) return;
    if (document.getElementById("presenter-keys") && !document.getElementById("presenter-keys").hidden) return;
    const key = ev.key;
    if (/^[1-4]$/.test(key)) {
      // In presenter mode presenter.js chooses the same one (its bar says so): both hear the key.
      if (Number(key) <= laneCount()) {
        select(Number(key));
        if (!presenting()) ev.preventDefault();
      }
      return;
    }
    if (key === "n" || key === "N") {
      ev.preventDefault();
      return nextLine();
    }
    if (key !== " " && key !== "Spacebar") return;
    const other = ev.target.closest && ev.target.closest("button, a[href], summary, [role=button]");
    if (other && !other.closest("[data-step-state]")) return; // a focused button's own space
    if (!selected) {
      if (presenting()) return; // presenter mode's space: pause the drawing
      ev.preventDefault();
      return say(KEYS_HINT);
    }
    ev.preventDefault();
    ev.stopImmediatePropagation();
    step(selected);
  }

  // -- after each frame: the choice kept, the next steps in view, the control's answer ------------------

  function afterSwap() {
    markSelected();
    if (runsItself() && stateEl()) for (const button of stateEl().querySelectorAll("button")) button.disabled = true;
    if (sending) {
      sending = false;
      hint(); // its outcome is drawn: the note is the standing line again
    }
    const state = stateEl();
    if (!state) return;
    const wrap = state.querySelector(".step-script-wrap");
    const next = state.querySelector("td[data-next]");
    // Inside the script's own box only: the page itself does not move under the teacher.
    if (wrap && next && wrap.scrollHeight > wrap.clientHeight) {
      const below = next.getBoundingClientRect().top - wrap.getBoundingClientRect().top;
      wrap.scrollTop = Math.max(0, wrap.scrollTop + below - wrap.clientHeight / 3);
    }
  }

  function watch() {
    const section = document.getElementById("live-state") && document.getElementById("live-state").parentElement;
    if (section) new MutationObserver(afterSwap).observe(section, { childList: true });
    // The control's answer ("Sent: step T1.") comes in the control rows, hidden here: shown in the note.
    const controls = document.getElementById("actor-controls");
    if (controls) {
      new MutationObserver(() => {
        const sent = document.querySelector("#actor-controls [data-control-note]");
        if (sent && sent.textContent.trim() && sending) say(sent.textContent.trim().replace(/^Sent: step /, "Sent: a step of ").replace(/\.$/, "…"));
        if (!document.querySelector("#actor-controls button[data-control='step']")) hint();
      }).observe(controls.parentElement, { childList: true });
    }
    // Refused (a job that ended meanwhile, say): the server's words.
    document.body.addEventListener("htmx:responseError", (ev) => {
      const path = ev.detail && ev.detail.requestConfig && ev.detail.requestConfig.path;
      if (path && /\/control\/$/.test(path)) say(`Not sent: ${ev.detail.xhr.responseText}`, { sticky: true });
    });
  }

  // -- the launch form ----------------------------------------------------------------------------------

  function launchForm() {
    document.addEventListener("click", (ev) => {
      const use = ev.target.closest && ev.target.closest("[data-step-use], [data-step-copy]");
      if (!use) return;
      const form = document.getElementById("launch-form");
      if (!form) return;
      const select = form.querySelector("select[name=script]");
      const text = form.querySelector("textarea[name=text]");
      if (!select || !text) return;
      ev.preventDefault();
      const item = use.closest("[data-step-builtin]");
      if (use.hasAttribute("data-step-use")) {
        select.value = item.dataset.stepBuiltin;
        text.value = "";
        select.focus();
      } else {
        select.value = "";
        text.value = item.querySelector("[data-step-text]").textContent;
        text.focus();
        text.setSelectionRange(0, 0);
        text.scrollTop = 0;
      }
      const level = form.querySelector("select[name=isolation]");
      if (level && item.dataset.isolation) level.value = item.dataset.isolation;
      gutter();
      text.closest("[data-field]").scrollIntoView({ block: "nearest" });
    });
    document.body.addEventListener("htmx:afterSwap", gutter);
    gutter();
  }

  /** The text field with its lines numbered beside it, and the line a refusal names selected and marked. */
  function gutter() {
    const text = document.querySelector("#launch-form textarea[name=text]");
    if (!text) return;
    let numbers = text.parentElement.querySelector("[data-step-gutter]");
    if (!numbers) {
      const box = document.createElement("div");
      box.className = "step-text-box";
      text.before(box);
      numbers = document.createElement("pre");
      numbers.className = "step-gutter";
      numbers.dataset.stepGutter = "";
      numbers.setAttribute("aria-hidden", "true");
      box.append(numbers, text);
      text.addEventListener("input", () => draw(text, numbers));
      text.addEventListener("scroll", () => (numbers.scrollTop = text.scrollTop));
    }
    draw(text, numbers);
    const error = text.closest("[data-field]").querySelector(".errorlist");
    const found = error && /\bline (\d+)\b/.exec(error.textContent);
    if (!found) return;
    const wrong = Number(found[1]);
    numbers.dataset.wrong = String(wrong);
    draw(text, numbers);
    // The line selected, so the cursor is where the fix goes.
    const lines = text.value.split("\n");
    const start = lines.slice(0, wrong - 1).reduce((sum, line) => sum + line.length + 1, 0);
    text.focus();
    text.setSelectionRange(start, start + (lines[wrong - 1] || "").length);
    const lineHeight = parseFloat(getComputedStyle(text).lineHeight) || 20;
    text.scrollTop = Math.max(0, (wrong - 3) * lineHeight);
    numbers.scrollTop = text.scrollTop;
  }

  function draw(text, numbers) {
    const count = Math.max(text.value.split("\n").length, Number(text.getAttribute("rows")) || 1);
    const wrong = Number(numbers.dataset.wrong || 0);
    numbers.innerHTML = "";
    for (let n = 1; n <= count; n++) {
      const line = document.createElement("span");
      line.textContent = String(n);
      if (n === wrong) line.className = "step-gutter-wrong";
      numbers.append(line, "\n");
    }
  }

  /** Presenter mode's key list (presenter.js draws it on `?`) gains step mode's keys. */
  function listKeys() {
    new MutationObserver(() => {
      const table = document.querySelector("#presenter-keys table");
      if (!table || table.querySelector("[data-step-keys]")) return;
      const rows = [
        ["1 – 4, then Space", "run the chosen transaction's next step (a click on its column does too)"],
        ["n", "run the script's next line, in its written order"],
      ];
      for (const [key, what] of rows.reverse()) {
        const row = table.insertRow(0);
        row.dataset.stepKeys = "";
        const th = document.createElement("th");
        th.scope = "row";
        const kbd = document.createElement("kbd");
        kbd.textContent = key;
        th.append(kbd);
        row.append(th);
        row.insertCell().textContent = what;
      }
    }).observe(document.body, { childList: true });
  }

  function init() {
    if (document.getElementById("launch-form") || document.querySelector("[data-step-builtins]")) launchForm();
    if (!stateEl()) return;
    page().classList.add("step-driven");
    if (!live()) return;
    document.addEventListener("click", onClick);
    window.addEventListener("keydown", onKey, true);
    listKeys();
    watch();
    hint();
    afterSwap();
  }

  document.addEventListener("DOMContentLoaded", init);
})();

/* The watch page: polls the object's history.json every half second with its cursors, adds the
   new entries on top (keeping the newest N) and adds the new counts to each writer's row. The
   server words every entry; this only places it. */
"use strict";

(function () {
  const POLL_MS = 500;
  const page = document.querySelector('[data-page="watch"]');
  if (!page) return;
  const url = page.dataset.historyUrl;
  const newest = Number(page.dataset.newest);
  const entries = page.querySelector("[data-entries]");
  const counts = page.querySelector("[data-counts]");
  let afterChange = page.dataset.afterChange;
  let afterSeq = page.dataset.afterSeq;

  function cell(row, text, tag = "td") {
    const el = document.createElement(tag);
    el.textContent = text;
    row.appendChild(el);
    return el;
  }

  function addEntries(list) {
    if (!list.length) return;
    const none = entries.querySelector("[data-none]");
    if (none) none.remove();
    // The server sends the newest first; inserted in reverse, the newest ends on top.
    for (const entry of list.slice().reverse()) {
      if (entries.querySelector(`[data-key="${CSS.escape(entry.key)}"]`)) continue;
      const row = document.createElement("tr");
      row.dataset.key = entry.key;
      row.dataset.type = entry.type;
      cell(row, entry.version == null ? "v?" : `v${entry.version}`);
      cell(row, entry.type);
      cell(row, entry.writer);
      cell(row, entry.what);
      cell(row, entry.at.slice(11, 23));
      entries.insertBefore(row, entries.firstChild);
    }
    while (entries.children.length > newest) entries.lastChild.remove();
  }

  function addCounts(more) {
    for (const [writer, tally] of Object.entries(more)) {
      let row = Array.from(counts.children).find((r) => r.dataset.writer === writer);
      if (!row) {
        row = document.createElement("tr");
        row.dataset.writer = writer;
        cell(row, writer, "th").scope = "row";
        cell(row, "0");
        cell(row, "0");
        counts.appendChild(row);
      }
      row.children[1].textContent = String(Number(row.children[1].textContent) + tally.versions);
      row.children[2].textContent = String(Number(row.children[2].textContent) + tally.conflicts);
    }
  }

  function showNow(object, job) {
    // No object: deleted (or not made yet) since the last poll.
    page.querySelector("[data-now-stored]").hidden = !object;
    page.querySelector("[data-now-missing]").hidden = Boolean(object);
    if (object) {
      page.querySelector("[data-version]").textContent = `v${object.version}`;
      // Worded by the server (nested values such as a quota's `hard` as YAML lines).
      page.querySelector("[data-fields]").textContent = object.text;
    }
    const status = page.querySelector("[data-job-status]");
    if (status && job) status.textContent = job.status;
  }

  async function poll() {
    try {
      const response = await fetch(`${url}?after_change=${afterChange}&after_seq=${afterSeq}`, {
        headers: { Accept: "application/json" },
      });
      if (response.ok) {
        const data = await response.json();
        addEntries(data.entries);
        addCounts(data.counts);
        showNow(data.object, data.job);
        afterChange = data.after_change;
        afterSeq = data.after_seq;
        page.dataset.polled = String(Number(page.dataset.polled || 0) + 1);
      }
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }
  setTimeout(poll, POLL_MS);
})();

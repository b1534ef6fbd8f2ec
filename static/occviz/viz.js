/* occviz visual pieces: a job's event model, the swimlane timeline, the rate chart,
   counters, rows and the readable log. Plain JavaScript on <canvas>, no dependencies.
   pages.js wires them to the live stream, the stored events, replay and compare. */
"use strict";

(function () {
  const KIND_STYLE = {
    read: { color: "#8a94a6", label: "read" },
    committed: { color: "#1a9e4b", label: "committed" },
    conflict: { color: "#d62828", label: "conflict" },
    retry: { color: "#f08c00", label: "retry wait" },
    lock_wait: { color: "#1c64d6", label: "lock wait" },
    serialization_failure: { color: "#8b3fd9", label: "serialization failure" },
    gave_up: { color: "#111111", label: "gave up" },
    deadlock: { color: "#7a1010", label: "deadlock" },
    lock_timeout: { color: "#7a1010", label: "lock timeout" },
    error: { color: "#7a1010", label: "error" },
  };
  const FAILURES = ["conflict", "serialization_failure", "deadlock", "lock_timeout"];
  const BASE_BIN_MS = 100;
  // Bin widths for the rate chart, so that it never has more than about 150 points (as the server's).
  const DISPLAY_BINS_MS = [100, 250, 500, 1000, 2000, 5000, 10000, 30000, 60000];
  // The timeline keeps at most this many events; counters and rates keep counting beyond it.
  const MAX_KEPT_EVENTS = 200000;

  function displayBin(durationMs) {
    return DISPLAY_BINS_MS.find((b) => durationMs / b <= 150) || DISPLAY_BINS_MS[DISPLAY_BINS_MS.length - 1];
  }

  function percentile(sorted, p) {
    if (!sorted.length) return null;
    // Linear interpolation, as PostgreSQL's percentile_cont that the job's summary uses.
    const pos = (sorted.length - 1) * p;
    const lo = Math.floor(pos);
    const hi = Math.ceil(pos);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
  }

  /** Everything the pages show about a job, accumulated from its events in seq order. */
  class JobModel {
    constructor({ writers, initialValue }) {
      this.writers = Math.max(1, writers || 1);
      this.initialValue = initialValue || 0;
      this.reset();
    }

    reset() {
      this.events = [];
      this.lastSeq = 0;
      this.counts = {};
      this.lockWaitMs = 0;
      this.latencies = [];
      this.sortedLatencies = null;
      this.rows = new Map(); // row id -> {value, version}
      this.bins = { committed: [], conflict: [] };
      this.maxT = 0;
      this.dropped = 0;
    }

    add(events) {
      let added = 0;
      for (const e of events) {
        if (e.seq <= this.lastSeq) continue; // a resent frame: never count an event twice
        this.lastSeq = e.seq;
        this.addOne(e);
        added += 1;
      }
      if (this.events.length > MAX_KEPT_EVENTS) {
        const cut = this.events.length - MAX_KEPT_EVENTS;
        this.events.splice(0, cut);
        this.dropped += cut;
      }
      return added;
    }

    addOne(e) {
      // Events read back from the store may carry detail as JSON text rather than an object.
      if (typeof e.detail === "string") e.detail = e.detail ? JSON.parse(e.detail) : {};
      this.events.push(e);
      this.counts[e.kind] = (this.counts[e.kind] || 0) + 1;
      if (e.t_ms > this.maxT) this.maxT = e.t_ms;
      if (e.kind === "lock_wait" && e.duration_ms) this.lockWaitMs += e.duration_ms;
      if (e.kind === "committed") {
        if (e.latency_ms != null) {
          this.latencies.push(e.latency_ms);
          this.sortedLatencies = null;
        }
        if (e.row != null && e.version_written != null) {
          const row = this.rows.get(e.row);
          // Writers commit out of t_ms order by a hair: the highest version is the row's state.
          if (!row || e.version_written > row.version) this.rows.set(e.row, { value: e.value_written, version: e.version_written });
        }
      }
      if (e.kind in this.bins) {
        const bin = Math.max(0, Math.floor(e.t_ms / BASE_BIN_MS));
        const values = this.bins[e.kind];
        while (values.length <= bin) values.push(0);
        values[bin] += 1;
      }
    }

    count(kind) {
      return this.counts[kind] || 0;
    }

    totals(elapsedMs) {
      const committed = this.count("committed");
      if (!this.sortedLatencies) this.sortedLatencies = this.latencies.slice().sort((a, b) => a - b);
      let gained = 0;
      for (const row of this.rows.values()) gained += row.value - this.initialValue;
      const ms = elapsedMs != null ? elapsedMs : this.maxT;
      return {
        attempts: committed + FAILURES.reduce((n, k) => n + this.count(k), 0),
        committed,
        conflicts: this.count("conflict"),
        retries: this.count("retry"),
        gave_up: this.count("gave_up"),
        lock_waits: this.count("lock_wait"),
        lock_wait_ms: this.lockWaitMs,
        serialization_failures: this.count("serialization_failure"),
        deadlocks: this.count("deadlock"),
        commits_per_s: ms > 0 ? committed / (ms / 1000) : 0,
        latency_ms: {
          p50: percentile(this.sortedLatencies, 0.5),
          p95: percentile(this.sortedLatencies, 0.95),
          p99: percentile(this.sortedLatencies, 0.99),
        },
        // Every committed increment should have raised a row by one: the shortfall was erased.
        lost_updates: committed - gained,
      };
    }

    /** Commits and conflicts per display bin, as a series for RateChart. */
    series(durationMs) {
      const binMs = displayBin(durationMs != null ? durationMs : this.maxT);
      const per = binMs / BASE_BIN_MS;
      const fold = (values) => {
        const out = [];
        values.forEach((n, i) => {
          const j = Math.floor(i / per);
          while (out.length <= j) out.push(0);
          out[j] += n;
        });
        return out;
      };
      return { bin_ms: binMs, committed: fold(this.bins.committed), conflict: fold(this.bins.conflict) };
    }
  }

  function setupCanvas(canvas, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.parentElement.clientWidth || 600;
    const height = cssHeight;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.height = height + "px";
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, width, height };
  }

  function fmtMs(ms) {
    if (ms == null) return "–";
    if (ms >= 10000) return (ms / 1000).toFixed(1) + " s";
    if (ms >= 1000) return (ms / 1000).toFixed(2) + " s";
    if (ms >= 10) return ms.toFixed(0) + " ms";
    return ms.toFixed(1) + " ms";
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function firstAtOrAfter(events, t) {
    let lo = 0;
    let hi = events.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (events[mid].t_ms < t) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  // Threads stamp t_ms just before the recorder numbers an event, so seq order is t_ms order
  // to within a fraction of a millisecond; this much slack keeps the binary searches honest.
  const T_SLACK_MS = 5;

  /** One lane per writer, time left to right; each kind of event its own mark. */
  class Timeline {
    constructor(canvas, tooltip) {
      this.canvas = canvas;
      this.tooltip = tooltip;
      this.view = null;
      canvas.addEventListener("mousemove", (ev) => this.hover(ev));
      canvas.addEventListener("mouseleave", () => {
        if (this.tooltip) this.tooltip.hidden = true;
      });
    }

    layout(writers) {
      const laneH = writers <= 8 ? 28 : writers <= 16 ? 18 : writers <= 32 ? 10 : 6;
      return { top: 8, left: 86, laneH, height: 8 + writers * laneH + 24 };
    }

    /** Draw `events` (sorted by t_ms) with t in [t0, t1]; `cursor`, if given, marks the moment shown. */
    draw(model, { t0, t1, events, cursor }) {
      const lay = this.layout(model.writers);
      const { ctx, width, height } = setupCanvas(this.canvas, lay.height);
      const plotW = width - lay.left - 10;
      const span = Math.max(1, t1 - t0);
      const x = (t) => lay.left + ((t - t0) / span) * plotW;
      this.view = { model, t0, t1, events, lay, x, plotW, span };
      ctx.clearRect(0, 0, width, height);
      ctx.font = "12px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      for (let w = 1; w <= model.writers; w++) {
        const y = lay.top + (w - 1) * lay.laneH;
        if (w % 2 === 0) {
          ctx.fillStyle = "#f3f5f8";
          ctx.fillRect(lay.left, y, plotW, lay.laneH);
        }
        if (lay.laneH >= 10 || w % 4 === 1) {
          ctx.fillStyle = "#4a5568";
          ctx.fillText("writer " + w, 4, y + lay.laneH / 2);
        }
      }
      this.drawAxis(ctx, lay, x, t0, t1, model.writers);
      const from = firstAtOrAfter(events, t0 - T_SLACK_MS - 2000);
      for (let i = from; i < events.length; i++) {
        const e = events[i];
        if (e.t_ms > t1 + T_SLACK_MS) break;
        if (e.actor < 1 || e.actor > model.writers) continue;
        this.mark(ctx, e, x, lay.top + (e.actor - 1) * lay.laneH, lay.laneH, t0, t1);
      }
      if (cursor != null) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        ctx.moveTo(x(cursor), lay.top);
        ctx.lineTo(x(cursor), lay.top + model.writers * lay.laneH);
        ctx.stroke();
      }
    }

    drawAxis(ctx, lay, x, t0, t1, writers) {
      const yAxis = lay.top + writers * lay.laneH;
      const step = niceMax((t1 - t0) / 8);
      ctx.fillStyle = "#4a5568";
      ctx.strokeStyle = "#d5dae1";
      ctx.lineWidth = 1;
      ctx.textAlign = "center";
      for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
        ctx.beginPath();
        ctx.moveTo(x(t), lay.top);
        ctx.lineTo(x(t), yAxis + 4);
        ctx.stroke();
        ctx.fillText(fmtMs(t), x(t), yAxis + 14);
      }
      ctx.textAlign = "left";
    }

    mark(ctx, e, x, y, h, t0, t1) {
      const style = KIND_STYLE[e.kind] || KIND_STYLE.error;
      const cx = x(e.t_ms);
      const cy = y + h / 2;
      const r = Math.max(2, Math.min(6, h / 3));
      ctx.fillStyle = style.color;
      ctx.strokeStyle = style.color;
      ctx.lineWidth = 2;
      switch (e.kind) {
        case "read":
          ctx.fillRect(cx - 0.5, y + h * 0.3, 1.5, h * 0.4);
          break;
        case "committed":
          ctx.beginPath();
          ctx.arc(cx, cy, r, 0, 2 * Math.PI);
          ctx.fill();
          if (e.detail && e.detail.overwrote) {
            // A blind write that landed over newer versions: the updates it erased are lost.
            ctx.strokeStyle = KIND_STYLE.conflict.color;
            ctx.stroke();
          }
          break;
        case "conflict":
          ctx.beginPath();
          ctx.moveTo(cx - r, cy - r);
          ctx.lineTo(cx + r, cy + r);
          ctx.moveTo(cx + r, cy - r);
          ctx.lineTo(cx - r, cy + r);
          ctx.stroke();
          break;
        case "retry": {
          // The wait before the next attempt, drawn forward from when it began.
          const end = Math.min(t1, e.t_ms + (e.duration_ms || 0));
          ctx.fillRect(cx, cy - 1.5, Math.max(2, x(end) - cx), 3);
          break;
        }
        case "lock_wait": {
          // Recorded when the lock was granted: the wait lies behind it.
          const start = Math.max(t0, e.t_ms - (e.duration_ms || 0));
          ctx.globalAlpha = 0.55;
          ctx.fillRect(x(start), y + h * 0.2, Math.max(2, cx - x(start)), h * 0.6);
          ctx.globalAlpha = 1;
          break;
        }
        case "serialization_failure":
          ctx.beginPath();
          ctx.moveTo(cx, cy - r);
          ctx.lineTo(cx + r, cy + r);
          ctx.lineTo(cx - r, cy + r);
          ctx.closePath();
          ctx.fill();
          break;
        case "gave_up":
          ctx.fillRect(cx - r, cy - r, 2 * r, 2 * r);
          break;
        default:
          ctx.beginPath();
          ctx.moveTo(cx, cy - r);
          ctx.lineTo(cx + r, cy);
          ctx.lineTo(cx, cy + r);
          ctx.lineTo(cx - r, cy);
          ctx.closePath();
          ctx.fill();
      }
    }

    hover(ev) {
      const v = this.view;
      if (!v || !this.tooltip) return;
      const rect = this.canvas.getBoundingClientRect();
      const px = ev.clientX - rect.left;
      const py = ev.clientY - rect.top;
      const actor = Math.floor((py - v.lay.top) / v.lay.laneH) + 1;
      if (actor < 1 || actor > v.model.writers || px < v.lay.left) {
        this.tooltip.hidden = true;
        return;
      }
      const t = v.t0 + ((px - v.lay.left) / v.plotW) * v.span;
      const tolerance = (6 / v.plotW) * v.span;
      let best = null;
      let bestD = Infinity;
      const from = firstAtOrAfter(v.events, t - tolerance - T_SLACK_MS);
      for (let i = from; i < v.events.length; i++) {
        const e = v.events[i];
        if (e.t_ms > t + tolerance + T_SLACK_MS) break;
        if (e.actor !== actor || e.t_ms > v.t1 + T_SLACK_MS) continue;
        const d = Math.abs(e.t_ms - t);
        // A read sits under its commit on short jobs: prefer the outcome when both are this close.
        const weight = e.kind === "read" ? d + tolerance / 3 : d;
        if (d <= tolerance && weight < bestD) {
          best = e;
          bestD = weight;
        }
      }
      if (!best) {
        this.tooltip.hidden = true;
        return;
      }
      this.tooltip.innerHTML = "";
      const lines = [
        [`#${best.seq} writer ${best.actor}: ${(KIND_STYLE[best.kind] || { label: best.kind }).label}`, true],
        [`at ${fmtMs(best.t_ms)}, increment ${best.op}, attempt ${best.attempt}${best.row != null ? ", row " + best.row : ""}`],
      ];
      if (best.version_read != null || best.version_written != null) {
        lines.push([`version read ${best.version_read ?? "–"}, written ${best.version_written ?? "–"}`]);
      }
      if (best.value_read != null || best.value_written != null) {
        lines.push([`value read ${best.value_read ?? "–"}, written ${best.value_written ?? "–"}`]);
      }
      if (best.duration_ms != null) lines.push([`took ${fmtMs(best.duration_ms)}`]);
      if (best.latency_ms != null) lines.push([`latency from first read ${fmtMs(best.latency_ms)}`]);
      if (best.detail && best.detail.overwrote) lines.push([`overwrote ${best.detail.overwrote} newer version(s)`]);
      if (best.kind === "conflict") {
        // What the Kubernetes API answers such a write: HTTP 409, reason Conflict.
        lines.push([`409 Conflict: Operation cannot be fulfilled on counters "${best.row}": the object has been modified`]);
      }
      if (best.detail && best.detail.message) lines.push([best.detail.message]);
      for (const [text, strong] of lines) {
        const div = document.createElement(strong ? "strong" : "div");
        div.textContent = text;
        this.tooltip.appendChild(div);
      }
      this.tooltip.hidden = false;
      const left = Math.min(px + 14, rect.width - 300);
      this.tooltip.style.left = Math.max(0, left) + "px";
      this.tooltip.style.top = py + 14 + "px";
    }
  }

  /** Commits (green) and conflicts (red) per second over time. */
  class RateChart {
    constructor(canvas) {
      this.canvas = canvas;
      // Read once: drawing changes the attribute to device pixels.
      this.cssHeight = Number(canvas.getAttribute("height")) || 200;
    }

    static maxRate(series) {
      const per = 1000 / series.bin_ms;
      return Math.max(0, ...series.committed.map((n) => n * per), ...series.conflict.map((n) => n * per));
    }

    /** `series` from JobModel.series or the compare view; yMax and xMaxMs let charts share a scale. */
    draw(series, { yMax, xMaxMs, cursor } = {}) {
      const { ctx, width, height } = setupCanvas(this.canvas, this.cssHeight);
      const left = 56;
      const bottom = height - 22;
      const top = 10;
      const plotW = width - left - 10;
      const per = 1000 / series.bin_ms;
      const n = Math.max(series.committed.length, series.conflict.length);
      const xMax = Math.max(xMaxMs || 0, n * series.bin_ms, 1);
      const ymax = niceMax(yMax != null ? yMax : RateChart.maxRate(series));
      const x = (t) => left + (t / xMax) * plotW;
      const y = (v) => bottom - (v / ymax) * (bottom - top);
      ctx.clearRect(0, 0, width, height);
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillStyle = "#4a5568";
      ctx.strokeStyle = "#d5dae1";
      ctx.lineWidth = 1;
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      for (let i = 0; i <= 4; i++) {
        const v = (ymax * i) / 4;
        ctx.beginPath();
        ctx.moveTo(left, y(v));
        ctx.lineTo(left + plotW, y(v));
        ctx.stroke();
        ctx.fillText(v >= 100 ? v.toFixed(0) : String(+v.toFixed(1)), left - 6, y(v));
      }
      ctx.textAlign = "center";
      const step = niceMax(xMax / 8);
      for (let t = 0; t <= xMax; t += step) ctx.fillText(fmtMs(t), x(t), bottom + 12);
      const line = (values, color) => {
        ctx.strokeStyle = color;
        ctx.lineWidth = 2.5;
        ctx.beginPath();
        values.forEach((count, i) => {
          const px = x((i + 0.5) * series.bin_ms);
          const py = y(count * per);
          if (i === 0) ctx.moveTo(px, py);
          else ctx.lineTo(px, py);
        });
        ctx.stroke();
      };
      line(series.committed, KIND_STYLE.committed.color);
      line(series.conflict, KIND_STYLE.conflict.color);
      if (cursor != null) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        ctx.moveTo(x(cursor), top);
        ctx.lineTo(x(cursor), bottom);
        ctx.stroke();
      }
      ctx.textAlign = "left";
      ctx.fillStyle = KIND_STYLE.committed.color;
      ctx.fillText("commits/s", left + 8, top + 8);
      ctx.fillStyle = KIND_STYLE.conflict.color;
      ctx.fillText("conflicts/s", left + 90, top + 8);
    }
  }

  const COUNTERS = [
    ["attempts", "attempts"],
    ["committed", "commits"],
    ["conflicts", "conflicts"],
    ["retries", "retries"],
    ["gave_up", "give-ups"],
    ["lock_waits", "lock waits"],
    ["lock_wait_ms", "lock wait"],
    ["serialization_failures", "serialization failures"],
    ["lost_updates", "lost updates"],
    ["commits_per_s", "commits / s"],
    ["p50", "latency p50"],
    ["p95", "latency p95"],
    ["p99", "latency p99"],
  ];

  function renderCounters(el, totals) {
    if (!el.firstChild) {
      for (const [key, label] of COUNTERS) {
        const box = document.createElement("div");
        box.className = "counter";
        box.dataset.counter = key;
        box.innerHTML = '<span class="value">–</span><span class="label"></span>';
        box.querySelector(".label").textContent = label;
        el.appendChild(box);
      }
    }
    for (const [key] of COUNTERS) {
      const box = el.querySelector(`[data-counter="${key}"]`);
      let value;
      if (key.startsWith("p")) value = fmtMs(totals.latency_ms[key]);
      else if (key === "lock_wait_ms") value = fmtMs(totals.lock_wait_ms);
      else if (key === "commits_per_s") value = totals.commits_per_s.toFixed(totals.commits_per_s >= 100 ? 0 : 1);
      else value = String(totals[key]);
      box.querySelector(".value").textContent = value;
      box.classList.toggle("alarm", key === "lost_updates" && totals.lost_updates > 0);
    }
  }

  function renderRows(el, rows) {
    if (!rows.size) return;
    const table = document.createElement("table");
    table.className = "rows";
    table.innerHTML = '<thead><tr><th scope="col">row</th><th scope="col" class="num">value</th><th scope="col" class="num">version</th></tr></thead>';
    const body = document.createElement("tbody");
    const ids = [...rows.keys()].sort((a, b) => a - b).slice(0, 64);
    for (const id of ids) {
      const row = rows.get(id);
      const tr = document.createElement("tr");
      for (const [text, cls] of [["#" + id, ""], [row.value, "num"], ["v" + row.version, "num"]]) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    table.appendChild(body);
    el.replaceChildren(table);
  }

  /** One event as a sentence a class can read aloud. */
  function describe(e) {
    const w = "writer " + e.actor;
    const at = e.row != null ? ` row ${e.row}` : "";
    switch (e.kind) {
      case "read":
        return `${w} read${at} v${e.version_read} (value ${e.value_read})`;
      case "committed":
        if (e.detail && e.detail.overwrote) {
          return `${w} blind-wrote v${e.version_written} (value ${e.value_written}) over ${e.detail.overwrote} newer version(s): their updates are lost`;
        }
        return `${w} committed v${e.version_written} (value ${e.value_written})${e.attempt > 1 ? ` on attempt ${e.attempt}` : ""}`;
      case "conflict":
        return `${w}'s write expected v${e.version_read} and matched 0 rows: conflict`;
      case "retry":
        return `${w} retries (attempt ${(e.detail && e.detail.next_attempt) || e.attempt + 1}) in ${fmtMs(e.duration_ms)}`;
      case "lock_wait":
        return `${w} waited ${fmtMs(e.duration_ms)} for the row lock${at}`;
      case "serialization_failure":
        return `${w}: could not serialize access (SQLSTATE 40001)`;
      case "gave_up":
        return `${w} gave up after ${e.attempt} attempts`;
      case "deadlock":
        return `${w}: deadlock detected (40P01)`;
      case "lock_timeout":
        return `${w}: lock timeout (55P03)`;
      default:
        return `${w}: ${e.kind}${e.detail && e.detail.message ? " " + e.detail.message : ""}`;
    }
  }

  function renderLog(el, events, count) {
    const latest = events.slice(-(count || 40)).reverse();
    el.replaceChildren(
      ...latest.map((e) => {
        const li = document.createElement("li");
        li.className = "k-" + e.kind;
        li.value = e.seq;
        const t = document.createElement("span");
        t.className = "t";
        t.textContent = fmtMs(e.t_ms);
        li.append(t, " " + describe(e));
        return li;
      })
    );
  }

  async function fetchJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response.json();
  }

  /** The stream's events (arrays in the order of the hello's `event_fields`) as objects keyed by field name. */
  function eventsFromArrays(fields, rows) {
    const n = fields.length;
    const events = new Array(rows.length);
    for (let i = 0; i < rows.length; i++) {
      const row = rows[i];
      const e = {};
      for (let j = 0; j < n; j++) e[fields[j]] = row[j];
      events[i] = e;
    }
    return events;
  }

  /** Read stored events after `after` page by page; `onPage(page)` for each; resolves with the last page. */
  async function loadEvents(eventsUrl, after, onPage, { limit = 5000, until = Infinity } = {}) {
    let page;
    do {
      page = await fetchJSON(`${eventsUrl}?after=${after}&limit=${limit}`);
      onPage(page);
      after = page.next_after;
    } while (page.more && after < until);
    return page;
  }

  window.Occviz = {
    JobModel,
    Timeline,
    RateChart,
    renderCounters,
    renderRows,
    renderLog,
    describe,
    fetchJSON,
    loadEvents,
    eventsFromArrays,
    fmtMs,
    displayBin,
  };
})();

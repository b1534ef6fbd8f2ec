/* occviz visual pieces: a job's events as the timeline and the rate chart draw them.
   Plain JavaScript on <canvas>, no dependencies.

   Nothing here knows a scenario: the server announces each scenario's vocabulary (its
   event kinds with their sentence, colour and mark; its actors) in the stream's hello and
   in the page (json_script "scenario-vocabulary"). A scenario may add a script of its own
   that registers a plug-in (Occviz.plugins[name]) to draw on the lanes. Nothing here
   computes a figure or renders a job's state: the server renders those (the same
   fragments live, in replay and for every viewer) and pages.js swaps them in. */
"use strict";

(function () {
  const BASE_BIN_MS = 100;
  // Bin widths for the rate chart, so that it never has more than about 150 points (as the server's).
  const DISPLAY_BINS_MS = [100, 250, 500, 1000, 2000, 5000, 10000, 30000, 60000];
  // The timeline keeps at most this many events; the rates keep counting beyond it.
  const MAX_KEPT_EVENTS = 200000;
  const FALLBACK_COLOR = "#7a1010";
  const plugins = {};

  function displayBin(durationMs) {
    return DISPLAY_BINS_MS.find((b) => durationMs / b <= 150) || DISPLAY_BINS_MS[DISPLAY_BINS_MS.length - 1];
  }

  function fmtMs(ms) {
    if (ms == null) return "–";
    if (ms >= 10000) return (ms / 1000).toFixed(1) + " s";
    if (ms >= 1000) return (ms / 1000).toFixed(2) + " s";
    if (ms >= 10) return ms.toFixed(0) + " ms";
    return ms.toFixed(1) + " ms";
  }

  const PLACEHOLDER = /\{([a-z_][a-z_.0-9]*)(?::(ms|s))?\}/g;

  /** A scenario's vocabulary as the server declares it: kinds, figures, actors, sentences. */
  class Vocabulary {
    constructor(data) {
      this.data = data || { kinds: [], figures: [], rates: [], actors: [], actor_label: "actor {n}", state_keys: [] };
      this.name = this.data.name;
      this.kinds = new Map(this.data.kinds.map((k) => [k.name, k]));
      this.figures = this.data.figures;
      this.rates = this.data.rates;
      this.actors = this.data.actors || [];
      // Lanes of writers from outside the job (the admin, the API): named by their events' detail.lane.
      this.laneNames = {};
      // The kinds of event seen so far (presenter mode's legend shows only these).
      this.seen = new Set();
    }

    static fromPage(id = "scenario-vocabulary") {
      const el = document.getElementById(id);
      const vocabulary = new Vocabulary(el ? JSON.parse(el.textContent) : null);
      Vocabulary.onPage.push(vocabulary); // presenter mode recolours them in place
      return vocabulary;
    }

    kind(name) {
      return this.kinds.get(name) || { name, label: name, color: FALLBACK_COLOR, mark: "diamond", sentences: [] };
    }

    color(name) {
      return this.kind(name).color;
    }

    actorName(n) {
      return this.laneNames[n] || this.actors[n - 1] || this.data.actor_label.replace("{n}", String(n));
    }

    value(e, path, who) {
      if (path === "who") return who;
      if (path === "next_attempt") return e.attempt == null ? null : e.attempt + 1;
      if (path.startsWith("detail.")) return (e.detail || {})[path.slice(7)];
      return e[path];
    }

    /** A template filled with the event's values, or null if one is missing (the server's `fill`). */
    fill(template, e, who) {
      let missing = false;
      const text = template.replace(PLACEHOLDER, (_, path, fmt) => {
        const v = this.value(e, path, who);
        if (v == null || v === "") {
          missing = true;
          return "";
        }
        if (fmt === "ms") return fmtMs(Number(v));
        if (fmt === "s") return Number(v).toFixed(1) + " s";
        return String(v);
      });
      return missing ? null : text;
    }

    /** One event as a sentence: the first of its kind's templates whose values are all there. */
    sentence(e) {
      const who = this.actorName(e.actor);
      const kind = this.kind(e.kind);
      for (const template of kind.sentences) {
        const text = this.fill(template, e, who);
        if (text != null) return text;
      }
      return `${who}: ${kind.label}`;
    }
  }

  Vocabulary.onPage = [];

  /** What the timeline and the rate chart draw of a job, accumulated from its events in seq order. */
  class JobModel {
    constructor(vocabulary) {
      this.vocabulary = vocabulary;
      this.plugin = plugins[vocabulary.name] || {};
      this.reset();
    }

    reset() {
      this.events = [];
      this.lastSeq = 0;
      this.bins = {};
      for (const kind of this.vocabulary.rates) this.bins[kind] = [];
      this.maxT = 0;
      this.maxActor = this.vocabulary.actors.length;
      this.dropped = 0;
      if (this.plugin.reset) this.plugin.reset(this);
    }

    get lanes() {
      return Math.max(1, this.maxActor);
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
      if (e.t_ms > this.maxT) this.maxT = e.t_ms;
      if (e.actor > this.maxActor) this.maxActor = e.actor;
      if (e.detail && e.detail.lane) this.vocabulary.laneNames[e.actor] = e.detail.lane;
      this.vocabulary.seen.add(e.kind);
      if (e.kind in this.bins) {
        const bin = Math.max(0, Math.floor(e.t_ms / BASE_BIN_MS));
        const values = this.bins[e.kind];
        while (values.length <= bin) values.push(0);
        values[bin] += 1;
      }
      if (this.plugin.add) this.plugin.add(this, e);
    }

    /** Events per second of each rate kind, per display bin, as a series for RateChart. */
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
      const rates = {};
      for (const kind of this.vocabulary.rates) rates[kind] = fold(this.bins[kind]);
      return { bin_ms: binMs, rates };
    }
  }

  /** The canvases' text size in px: the page's --canvas-text (A+ and presenter mode raise it), else 12. */
  function textPx(canvas) {
    return Number(getComputedStyle(canvas).getPropertyValue("--canvas-text")) || 12;
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

  /** Tells the page a chart was drawn (a bubbling `occviz:drawn` on its canvas): `redraw(canvas)` draws the
      same again onto another canvas (slides.js's SVG recorder), `facts` are what it shows (a11y.js's text). */
  function drawn(canvas, redraw, facts) {
    canvas.dispatchEvent(new CustomEvent("occviz:drawn", { bubbles: true, detail: { redraw, ...facts } }));
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

  /** One lane per actor, time left to right; each kind of event its declared mark. */
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

    layout(lanes, px, names) {
      const base = lanes <= 8 ? 28 : lanes <= 16 ? 18 : lanes <= 32 ? 10 : 6;
      // Larger text needs taller lanes (while they are few enough to label) and a wider name column.
      const laneH = base >= 28 ? Math.max(base, Math.round(px * 1.9)) : base >= 18 ? Math.max(base, Math.round(px * 1.35)) : base;
      const left = Math.max(96, Math.ceil(names) + 12);
      return { top: 8, left, laneH, height: 8 + lanes * laneH + px * 2 };
    }

    /** Draw `events` (sorted by t_ms) with t in [t0, t1]; `cursor`, if given, marks the moment shown. */
    draw(model, { t0, t1, events, cursor }, canvas = this.canvas) {
      const lanes = model.lanes;
      // Sized by the page's canvas (its type size follows A+), drawn on `canvas` (the page's, or a copy).
      const px = textPx(this.canvas);
      const font = `${px}px system-ui, sans-serif`;
      const measure = this.canvas.getContext("2d");
      measure.font = font;
      let names = 0;
      for (let w = 1; w <= Math.min(lanes, 64); w++) names = Math.max(names, measure.measureText(model.vocabulary.actorName(w)).width);
      const lay = this.layout(lanes, px, names);
      const { ctx, width, height } = setupCanvas(canvas, lay.height);
      const plotW = width - lay.left - 10;
      const span = Math.max(1, t1 - t0);
      const x = (t) => lay.left + ((t - t0) / span) * plotW;
      const laneY = (actor) => lay.top + (actor - 1) * lay.laneH;
      const view = { model, t0, t1, events, lay, x, plotW, span, laneY, lanes };
      // Hovering reads the view of the canvas on the page, not that of a copy drawn elsewhere.
      if (canvas === this.canvas) this.view = view;
      this.canvas.dataset.lanes = String(lanes);
      ctx.clearRect(0, 0, width, height);
      ctx.font = font;
      ctx.textBaseline = "middle";
      for (let w = 1; w <= lanes; w++) {
        const y = laneY(w);
        if (w % 2 === 0) {
          ctx.fillStyle = "#f3f5f8";
          ctx.fillRect(lay.left, y, plotW, lay.laneH);
        }
        if (lay.laneH >= 10 || w % 4 === 1) {
          ctx.fillStyle = "#4a5568";
          ctx.fillText(model.vocabulary.actorName(w), 4, y + lay.laneH / 2);
        }
      }
      this.drawAxis(ctx, lay, x, t0, t1, lanes, px, width);
      // A scenario's own drawing under the marks (leadership bands, say).
      if (model.plugin.drawLanes) model.plugin.drawLanes(ctx, view);
      const from = firstAtOrAfter(events, t0 - T_SLACK_MS - 2000);
      // Marks from before t0 (a live view scrolled on) stay right of the lanes' names, not drawn over them.
      ctx.save();
      ctx.beginPath();
      ctx.rect(lay.left - 7, 0, width - lay.left + 7, lay.height); // the names end 8 px before lay.left
      ctx.clip();
      for (let i = from; i < events.length; i++) {
        const e = events[i];
        if (e.t_ms > t1 + T_SLACK_MS) break;
        if (e.actor < 1 || e.actor > lanes) continue;
        this.mark(ctx, model.vocabulary.kind(e.kind), e, x, laneY(e.actor), lay.laneH, t0, t1);
      }
      ctx.restore();
      if (cursor != null) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        ctx.moveTo(x(cursor), lay.top);
        ctx.lineTo(x(cursor), lay.top + lanes * lay.laneH);
        ctx.stroke();
      }
      if (canvas === this.canvas) drawn(canvas, (target) => this.draw(model, { t0, t1, events, cursor }, target), { model, t0, t1 });
    }

    drawAxis(ctx, lay, x, t0, t1, lanes, px, width) {
      const yAxis = lay.top + lanes * lay.laneH;
      // As many time labels as fit, each about six characters wide.
      const room = Math.max(2, Math.min(8, Math.floor((x(t1) - x(t0)) / (px * 6))));
      const step = niceMax((t1 - t0) / room);
      ctx.fillStyle = "#4a5568";
      ctx.strokeStyle = "#d5dae1";
      ctx.lineWidth = 1;
      ctx.textAlign = "center";
      for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
        ctx.beginPath();
        ctx.moveTo(x(t), lay.top);
        ctx.lineTo(x(t), yAxis + 4);
        ctx.stroke();
        const label = fmtMs(t);
        ctx.fillText(label, Math.min(x(t), width - 2 - ctx.measureText(label).width / 2), yAxis + 4 + px * 0.9);
      }
      ctx.textAlign = "left";
    }

    mark(ctx, kind, e, x, y, h, t0, t1) {
      const cx = x(e.t_ms);
      const cy = y + h / 2;
      const r = Math.max(2, Math.min(h >= 28 ? h / 4 : 6, h / 3));
      ctx.fillStyle = kind.color;
      ctx.strokeStyle = kind.color;
      ctx.lineWidth = 2;
      switch (kind.mark) {
        case "tick":
          ctx.fillRect(cx - 0.5, y + h * 0.3, 1.5, h * 0.4);
          break;
        case "dot":
          ctx.beginPath();
          ctx.arc(cx, cy, r, 0, 2 * Math.PI);
          ctx.fill();
          break;
        case "cross":
          ctx.beginPath();
          ctx.moveTo(cx - r, cy - r);
          ctx.lineTo(cx + r, cy + r);
          ctx.moveTo(cx + r, cy - r);
          ctx.lineTo(cx - r, cy + r);
          ctx.stroke();
          break;
        case "bar-after": {
          // A wait that began at the event, drawn forward.
          const end = Math.min(t1, e.t_ms + (e.duration_ms || 0));
          ctx.fillRect(cx, cy - 1.5, Math.max(2, x(end) - cx), 3);
          break;
        }
        case "bar-before": {
          // Recorded when the wait ended: it lies behind.
          const start = Math.max(t0, e.t_ms - (e.duration_ms || 0));
          ctx.globalAlpha = 0.55;
          ctx.fillRect(x(start), y + h * 0.2, Math.max(2, cx - x(start)), h * 0.6);
          ctx.globalAlpha = 1;
          break;
        }
        case "triangle":
          ctx.beginPath();
          ctx.moveTo(cx, cy - r);
          ctx.lineTo(cx + r, cy + r);
          ctx.lineTo(cx - r, cy + r);
          ctx.closePath();
          ctx.fill();
          break;
        case "square":
          ctx.fillRect(cx - r, cy - r, 2 * r, 2 * r);
          break;
        case "star":
          ctx.beginPath();
          for (let i = 0; i < 10; i++) {
            const a = -Math.PI / 2 + (i * Math.PI) / 5;
            const rr = i % 2 ? r * 0.45 : r * 1.2;
            ctx.lineTo(cx + rr * Math.cos(a), cy + rr * Math.sin(a));
          }
          ctx.closePath();
          ctx.fill();
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
      if (kind.ring_when && e.detail && e.detail[kind.ring_when]) {
        // e.g. a blind write that landed over newer versions: the updates it erased are lost.
        ctx.strokeStyle = "#d62828";
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.arc(cx, cy, r + 1.5, 0, 2 * Math.PI);
        ctx.stroke();
      }
    }

    hover(ev) {
      const v = this.view;
      if (!v || !this.tooltip) return;
      const rect = this.canvas.getBoundingClientRect();
      const px = ev.clientX - rect.left;
      const py = ev.clientY - rect.top;
      const actor = Math.floor((py - v.lay.top) / v.lay.laneH) + 1;
      if (actor < 1 || actor > v.lanes || px < v.lay.left) {
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
        // A tick (a read) sits under its outcome on short jobs: prefer the outcome when both are this close.
        const weight = v.model.vocabulary.kind(e.kind).mark === "tick" ? d + tolerance / 3 : d;
        if (d <= tolerance && weight < bestD) {
          best = e;
          bestD = weight;
        }
      }
      if (!best) {
        this.tooltip.hidden = true;
        return;
      }
      const vocabulary = v.model.vocabulary;
      const kind = vocabulary.kind(best.kind);
      this.tooltip.innerHTML = "";
      const lines = [
        [`#${best.seq} ${vocabulary.actorName(best.actor)}: ${kind.label}`, true],
        [vocabulary.sentence(best)],
        [`at ${fmtMs(best.t_ms)}, operation ${best.op}, attempt ${best.attempt}${best.row != null ? ", row " + best.row : ""}`],
      ];
      if (best.version_read != null || best.version_written != null) {
        lines.push([`version read ${best.version_read ?? "–"}, written ${best.version_written ?? "–"}`]);
      }
      if (best.value_read != null || best.value_written != null) {
        lines.push([`value read ${best.value_read ?? "–"}, written ${best.value_written ?? "–"}`]);
      }
      if (best.duration_ms != null) lines.push([`took ${fmtMs(best.duration_ms)}`]);
      if (best.latency_ms != null) lines.push([`latency from first read ${fmtMs(best.latency_ms)}`]);
      if (kind.explain) {
        const text = vocabulary.fill(kind.explain, best, vocabulary.actorName(best.actor));
        if (text) lines.push([text]);
      }
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

  // Each rate line's dash, in order, and the length of the line drawn before its label in the legend.
  const RATE_DASHES = [[], [8, 4], [2, 3], [12, 3, 3, 3]];
  const LEGEND_LINE = 24;

  /** Events per second over time, one line per rate kind, each in its kind's colour and its own dash. */
  class RateChart {
    constructor(canvas, vocabulary) {
      this.canvas = canvas;
      this.vocabulary = vocabulary;
      // Read once: drawing changes the attribute to device pixels.
      this.cssHeight = Number(canvas.getAttribute("height")) || 200;
    }

    static maxRate(series) {
      const per = 1000 / series.bin_ms;
      const all = Object.values(series.rates).flat();
      return Math.max(0, ...all.map((n) => n * per));
    }

    /** `series` from JobModel.series or the compare view; yMax and xMaxMs let charts share a scale. */
    draw(series, { yMax, xMaxMs, cursor } = {}, canvas = this.canvas) {
      // A page may set the chart's height in CSS (--chart-height: presenter mode fits it to the screen).
      const cssHeight = Number(getComputedStyle(this.canvas).getPropertyValue("--chart-height")) || this.cssHeight;
      const { ctx, width, height } = setupCanvas(canvas, cssHeight);
      const px = textPx(this.canvas);
      const left = Math.round(px * 4.6);
      const bottom = height - Math.round(px * 1.8);
      const plotW = width - left - 10;
      const per = 1000 / series.bin_ms;
      const kinds = Object.keys(series.rates);
      ctx.font = `${px}px system-ui, sans-serif`;
      // The legend goes above the plot, on as many rows as it needs: drawn over it, it hid the highest rates.
      const rowH = Math.round(px * 1.25);
      const legend = [];
      let labelX = left + 8;
      let row = 0;
      for (const kind of kinds) {
        const label = this.vocabulary.kind(kind).label + "/s";
        const labelW = ctx.measureText(label).width + LEGEND_LINE;
        if (labelX > left + 8 && labelX + labelW > left + plotW) {
          labelX = left + 8; // a legend wider than the chart goes on to a second row
          row += 1;
        }
        legend.push({ label, x: labelX, y: 4 + Math.round(px * 0.6) + row * rowH });
        labelX += labelW + 16;
      }
      const top = kinds.length ? 4 + (row + 1) * rowH + 8 : 10;
      const n = Math.max(0, ...kinds.map((k) => series.rates[k].length));
      const xMax = Math.max(xMaxMs || 0, n * series.bin_ms, 1);
      const ymax = niceMax(yMax != null ? yMax : RateChart.maxRate(series));
      const x = (t) => left + (t / xMax) * plotW;
      const y = (v) => bottom - (v / ymax) * (bottom - top);
      ctx.clearRect(0, 0, width, height);
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
      // About one time label per 72 px, so narrow charts (compare's columns) do not run them together;
      // the last is kept inside the canvas.
      const step = niceMax(xMax / Math.max(2, Math.floor(plotW / (px * 6))));
      for (let t = 0; t <= xMax; t += step) {
        const label = fmtMs(t);
        ctx.fillText(label, Math.min(x(t), width - 2 - ctx.measureText(label).width / 2), bottom + px);
      }
      ctx.textAlign = "left";
      let lines = 0;
      kinds.forEach((kind, k) => {
        const color = this.vocabulary.color(kind);
        const dash = RATE_DASHES[k % RATE_DASHES.length];
        const values = series.rates[kind];
        ctx.strokeStyle = color;
        ctx.lineWidth = 2.5;
        ctx.setLineDash(dash);
        // Each bin's rate at its middle; one bin alone (a run shorter than a bin, or its events all in the
        // first) is a line across that bin, since a lone point draws nothing.
        const points =
          values.length === 1
            ? [[x(0), y(values[0] * per)], [x(series.bin_ms), y(values[0] * per)]]
            : values.map((count, i) => [x((i + 0.5) * series.bin_ms), y(count * per)]);
        ctx.beginPath();
        points.forEach(([cx, cy], i) => (i === 0 ? ctx.moveTo(cx, cy) : ctx.lineTo(cx, cy)));
        ctx.stroke();
        if (points.length > 1) lines += 1;
        // The legend shows each line's dash too: the lines are told apart by more than colour.
        const { label, x: lx, y: ly } = legend[k];
        ctx.beginPath();
        ctx.moveTo(lx, ly);
        ctx.lineTo(lx + LEGEND_LINE - 6, ly);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.fillStyle = color;
        ctx.fillText(label, lx + LEGEND_LINE, ly);
      });
      if (cursor != null) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 1.5;
        ctx.beginPath();
        ctx.moveTo(x(cursor), top);
        ctx.lineTo(x(cursor), bottom);
        ctx.stroke();
      }
      // How many kinds have a line drawn (readable from outside: tests, a curious user's dev tools).
      canvas.dataset.lines = String(lines);
      if (canvas === this.canvas) drawn(canvas, (target) => this.draw(series, { yMax, xMaxMs, cursor }, target), { series, vocabulary: this.vocabulary });
    }
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

  // While the live view is frozen (presenter mode's space), the newest fragment of each id waits here.
  const held = new Map();

  /** Swap in the server-rendered fragments of a frame: each top-level element replaces the one with its id. */
  function swapFragments(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    for (const fresh of [...template.content.children]) {
      if (window.Occviz.frozen && fresh.id) held.set(fresh.id, fresh);
      else replaceById(fresh);
    }
  }

  function replaceById(fresh) {
    const current = fresh.id && document.getElementById(fresh.id);
    if (current) current.replaceWith(fresh);
  }

  /** Freeze or resume the live view's drawing; resumed, it catches up with what arrived meanwhile. */
  function setFrozen(on) {
    window.Occviz.frozen = on;
    if (on) return;
    for (const fresh of held.values()) replaceById(fresh);
    held.clear();
    window.dispatchEvent(new Event("resize")); // the pages redraw on resize
  }

  window.Occviz = {
    Vocabulary,
    JobModel,
    Timeline,
    RateChart,
    fetchJSON,
    loadEvents,
    eventsFromArrays,
    swapFragments,
    setFrozen,
    frozen: false,
    fmtMs,
    textPx,
    displayBin,
    drawn,
    plugins,
  };
})();

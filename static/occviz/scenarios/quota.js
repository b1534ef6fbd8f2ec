/* The quota race's plug-in: one chart of hard, charged `used` and what the pods that exist
   request, over time, above the timeline (the leak is the gap between the two lines, a resync
   is a dashed mark that closes it). The chart is drawn from the events: `used` from the writes that moved the quota's version, what exists
   from the stored pods. Kind colours come from the vocabulary the server declares. */
"use strict";

(function () {
  const WRITES = new Set(["admitted", "resync"]);
  const RESYNCS = new Set(["resync", "resync_in_sync"]);
  const CHART_HEIGHT = 170;

  /** The chart's canvas, made once above the timeline (outside the fragments the stream swaps). */
  function chartCanvas() {
    let canvas = document.querySelector("[data-quota-chart]");
    if (canvas) return canvas;
    const viz = document.querySelector("section.viz");
    if (!viz) return null;
    const title = document.createElement("h2");
    title.innerHTML = 'Quota over time <small class="muted">hard, charged used and what the pods that exist request; the gap is the leak</small>';
    const wrap = document.createElement("div");
    wrap.className = "canvas-wrap";
    canvas = document.createElement("canvas");
    canvas.dataset.quotaChart = "";
    canvas.setAttribute("aria-label", "Quota: hard, used and actually used over time");
    wrap.appendChild(canvas);
    viz.prepend(title, wrap);
    return canvas;
  }

  function step(ctx, points, x, y, until) {
    ctx.beginPath();
    points.forEach((p, i) => {
      if (i === 0) ctx.moveTo(x(p.t), y(p.v));
      else {
        ctx.lineTo(x(p.t), y(points[i - 1].v));
        ctx.lineTo(x(p.t), y(p.v));
      }
    });
    if (points.length) ctx.lineTo(x(until), y(points[points.length - 1].v));
    ctx.stroke();
  }

  function drawChart(model, t0, t1, left, canvas = chartCanvas()) {
    if (!canvas) return;
    const q = model.quota;
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 600;
    // Its height and text follow the page's (A+, presenter mode), as the other charts' do: read from the
    // chart on the page, also when drawing a copy (an SVG download).
    const shown = chartCanvas() || canvas;
    const height = Number(getComputedStyle(shown).getPropertyValue("--chart-height")) || CHART_HEIGHT;
    const px = window.Occviz.textPx(shown);
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = height + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const top = Math.round(px * 1.9);
    const bottom = height - 10;
    const plotW = width - left - 10;
    const span = Math.max(1, t1 - t0);
    const maxV = Math.max(q.hard, ...q.used.map((p) => p.v), ...q.actual.map((p) => p.v), 1);
    const x = (t) => left + ((Math.min(Math.max(t, t0), t1) - t0) / span) * plotW;
    const y = (v) => bottom - (v / (maxV * 1.1)) * (bottom - top);
    ctx.font = `${px}px system-ui, sans-serif`;
    ctx.textBaseline = "middle";
    // The resyncs: the marked moments the gap closes at.
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1.5;
    ctx.strokeStyle = model.vocabulary.color("resync");
    for (const t of q.resyncs) {
      if (t < t0 || t > t1) continue;
      ctx.beginPath();
      ctx.moveTo(x(t), top - 4);
      ctx.lineTo(x(t), bottom);
      ctx.stroke();
    }
    ctx.setLineDash([]);
    // The leak: where charged usage stands above what exists.
    ctx.fillStyle = "rgba(240, 140, 0, 0.25)";
    const changes = [...q.used.map((p) => [p.t, 0, p.v]), ...q.actual.map((p) => [p.t, 1, p.v])].sort((a, b) => a[0] - b[0]);
    let used = 0;
    let actual = 0;
    changes.forEach(([t, which, v], i) => {
      if (which === 0) used = v;
      else actual = v;
      const next = i + 1 < changes.length ? changes[i + 1][0] : model.maxT;
      if (used > actual && next > t) ctx.fillRect(x(t), y(used), Math.max(1, x(next) - x(t)), y(actual) - y(used));
    });
    // Each line has its own dash, shown again before its label: they are told apart by more than colour.
    const lines = [
      ["hard", "#4a5568", [{ t: 0, v: q.hard }], [2, 3]],
      ["used (charged)", "#d62828", [{ t: 0, v: 0 }, ...q.used], []],
      ["actually used", "#1c64d6", [{ t: 0, v: 0 }, ...q.actual], [8, 4]],
    ];
    let labelX = left;
    for (const [label, color, points, dash] of lines) {
      ctx.strokeStyle = color;
      ctx.lineWidth = 2;
      ctx.setLineDash(dash);
      step(ctx, points, x, y, model.maxT);
      ctx.beginPath();
      ctx.moveTo(labelX, Math.round(px * 0.8));
      ctx.lineTo(labelX + 18, Math.round(px * 0.8));
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = color;
      ctx.fillText(label, labelX + 24, Math.round(px * 0.8));
      labelX += ctx.measureText(label).width + 42;
    }
    ctx.fillStyle = "#4a5568";
    ctx.textAlign = "right";
    ctx.fillText(String(q.hard), left - 6, y(q.hard));
    ctx.fillText("0", left - 6, y(0));
    ctx.textAlign = "left";
    // The numbers now, readable from outside (tests, a curious user's dev tools).
    const now = latest(model);
    canvas.dataset.hard = String(q.hard);
    canvas.dataset.used = String(now.used);
    canvas.dataset.actual = String(now.actual);
    canvas.dataset.resyncs = String(q.resyncs.length);
    canvas.dataset.points = String(q.used.length + q.actual.length);
    if (canvas === chartCanvas()) window.Occviz.drawn(canvas, (target) => drawChart(model, t0, t1, left, target), { quota: { ...now, hard: q.hard, resyncs: q.resyncs.length } });
  }

  function latest(model) {
    const q = model.quota;
    const used = q.used.length ? q.used[q.used.length - 1].v : 0;
    const actual = q.actual.length ? q.actual[q.actual.length - 1].v : 0;
    return { used, actual, gap: used - actual };
  }

  window.Occviz.plugins.quota = {
    reset(model) {
      const params = model.vocabulary.data.params || {};
      model.quota = { hard: Number(params.hard || 0), used: [], actual: [], resyncs: [], version: 0 };
    },

    add(model, e) {
      const q = model.quota;
      // Writers record a hair out of order: the highest version written is the quota's state.
      if (WRITES.has(e.kind) && e.version_written != null && e.version_written > q.version) {
        q.version = e.version_written;
        q.used.push({ t: e.t_ms, v: e.value_written });
      }
      if (e.kind === "stored" && e.value_written != null) {
        const last = q.actual.length ? q.actual[q.actual.length - 1].v : 0;
        q.actual.push({ t: e.t_ms, v: Math.max(last, e.value_written) });
      }
      if (RESYNCS.has(e.kind)) q.resyncs.push(e.t_ms);
    },

    /** The chart shares the timeline's time axis, so a resync lines up with the controller's mark. */
    drawLanes(ctx, view) {
      drawChart(view.model, view.t0, view.t1, view.lay.left);
    },
  };
})();

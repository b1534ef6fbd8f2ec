/* The sweep's contention curve: committed per second (above) and conflict rate (below) against
   writers on a log2 scale (or, on the latency axis, the writers' one-way latency), one line per series. Drawn from the curve the state fragment carries
   (json_script "sweep-curve"), so the live page, replay and every viewer draw the same; redrawn
   whenever the page swaps that fragment in. A point is a link to its job, as in the table. */
"use strict";

(function () {
  const HEIGHT = 340;
  const HIT_PX = 9;
  const WRITERS = { key: "writers", label: "writers (pgbench: clients), log scale", log: true };

  /** The curve as of the state shown; before the job's first snapshot (a replay's start), an empty one. */
  function curve() {
    const el = document.getElementById("sweep-curve");
    return el ? { series: [], levels: [], points: [], running: null, axis: WRITERS, ...JSON.parse(el.textContent) } : null;
  }

  /** A point's place on the x-axis: its writers, or its latency in ms. */
  function at(data, point) {
    return Number(point[(data.axis || WRITERS).key]);
  }

  function shownCanvas() {
    return document.querySelector("[data-sweep-chart]");
  }

  /** A round step (1, 2 or 5 times a power of ten) at least `raw`: the gridlines fall on round numbers. */
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function label(v) {
    return v >= 1000 ? `${Number((v / 1000).toFixed(1))}k` : String(Math.round(v));
  }

  /** Where everything goes, for a canvas `width` wide: shared by drawing and by finding the point under the pointer. */
  function layout(data, width, px) {
    const levels = data.levels.length ? data.levels : [1];
    const log = (data.axis || WRITERS).log;
    const maxLevel = Math.max(...levels, log ? 2 : 1);
    const left = Math.round(px * 5.2);
    const right = width - Math.round(px * 1.5);
    const gap = Math.round(px * 3.2);
    const top1 = Math.round(px * 1.8);
    const bottom2 = HEIGHT - Math.round(px * 3.4);
    const panel = (bottom2 - top1 - gap) * 0.5;
    const bottom1 = top1 + panel * 1.2;
    const top2 = bottom1 + gap;
    const step = niceStep((Math.max(1, ...data.points.map((p) => p.commits_per_s)) * 1.05) / 4);
    const maxCommits = step * Math.ceil((Math.max(1, ...data.points.map((p) => p.commits_per_s)) * 1.05) / step);
    const share = log ? (level) => Math.log2(level) / Math.log2(maxLevel) : (level) => level / maxLevel;
    const x = (level) => left + share(level) * (right - left);
    return {
      levels,
      left,
      right,
      top1,
      bottom1,
      top2,
      bottom2,
      maxCommits,
      step,
      x,
      y1: (v) => bottom1 - (v / maxCommits) * (bottom1 - top1),
      y2: (rate) => bottom2 - rate * (bottom2 - top2),
    };
  }

  function draw(canvas = shownCanvas(), data = curve()) {
    if (!canvas || !data) return;
    const shown = shownCanvas() || canvas;
    const px = window.Occviz.textPx(shown);
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 600;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(HEIGHT * dpr);
    canvas.style.height = HEIGHT + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, HEIGHT);
    const lay = layout(data, width, px);
    ctx.font = `${px}px system-ui, sans-serif`;
    ctx.textBaseline = "middle";

    // The level measured now: a light band, so the curve's growing edge shows.
    if (data.running) {
      ctx.fillStyle = "rgba(28, 100, 214, 0.08)";
      const xr = lay.x(at(data, data.running));
      ctx.fillRect(xr - px, lay.top1, 2 * px, lay.bottom2 - lay.top1);
    }

    // Axes and grid: writers below, committed/s and conflict rate on the left.
    ctx.strokeStyle = "#e2e6ec";
    ctx.fillStyle = "#4a5568";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    for (let v = 0; v <= lay.maxCommits + lay.step / 2; v += lay.step) {
      const y = lay.y1(v);
      ctx.beginPath();
      ctx.moveTo(lay.left, y);
      ctx.lineTo(lay.right, y);
      ctx.stroke();
      ctx.fillText(label(v), lay.left - 6, y);
    }
    for (const rate of [0, 0.5, 1]) {
      const y = lay.y2(rate);
      ctx.beginPath();
      ctx.moveTo(lay.left, y);
      ctx.lineTo(lay.right, y);
      ctx.stroke();
      ctx.fillText(`${Math.round(rate * 100)}%`, lay.left - 6, y);
    }
    ctx.textAlign = "center";
    for (const level of lay.levels) {
      const x = lay.x(level);
      ctx.beginPath();
      ctx.moveTo(x, lay.top1);
      ctx.lineTo(x, lay.bottom2);
      ctx.stroke();
      ctx.fillText(String(level), x, lay.bottom2 + px * 1.1);
    }
    ctx.fillText((data.axis || WRITERS).label, (lay.left + lay.right) / 2, lay.bottom2 + px * 2.5);
    ctx.textAlign = "left";
    ctx.fillStyle = "#1f2933";
    ctx.fillText("committed per second", lay.left, lay.top1 - px * 0.9);
    ctx.fillText("conflict rate (share of attempts refused)", lay.left, lay.top2 - px * 0.9);

    // One line per series in each panel, its points filled.
    for (const line of data.series) {
      const points = data.points.filter((p) => p.strategy === line.name).sort((a, b) => at(data, a) - at(data, b));
      for (const [value, y] of [[(p) => p.commits_per_s, lay.y1], [(p) => p.conflict_rate, lay.y2]]) {
        ctx.strokeStyle = line.color;
        ctx.fillStyle = line.color;
        ctx.lineWidth = 2.5;
        ctx.setLineDash(line.dash);
        ctx.beginPath();
        points.forEach((p, i) => (i ? ctx.lineTo(lay.x(at(data, p)), y(value(p))) : ctx.moveTo(lay.x(at(data, p)), y(value(p)))));
        ctx.stroke();
        ctx.setLineDash([]);
        for (const p of points) {
          ctx.beginPath();
          ctx.arc(lay.x(at(data, p)), y(value(p)), 4, 0, Math.PI * 2);
          ctx.fill();
        }
      }
    }

    // What it shows, readable from outside (tests, a curious user's dev tools).
    if (canvas === shownCanvas()) {
      canvas.dataset.points = String(data.points.length);
      canvas.dataset.series = data.series.map((s) => s.name).join(",");
      canvas.dataset.levels = lay.levels.join(",");
      canvas.sweepPositions = data.points.map((p) => ({ job: p.job, strategy: p.strategy, writers: p.writers, x: lay.x(at(data, p)), y: lay.y1(p.commits_per_s) }));
      window.Occviz.drawn(canvas, (target) => draw(target, data), { sweep: { points: data.points.length } });
    }
  }

  /** The measured point under the pointer (in either panel), or null. */
  function pointAt(canvas, ev) {
    const data = curve();
    if (!data) return null;
    const box = canvas.getBoundingClientRect();
    const mx = ev.clientX - box.left;
    const my = ev.clientY - box.top;
    const lay = layout(data, canvas.clientWidth, window.Occviz.textPx(canvas));
    let best = null;
    let bestD = HIT_PX;
    for (const p of data.points) {
      for (const y of [lay.y1(p.commits_per_s), lay.y2(p.conflict_rate)]) {
        const d = Math.hypot(lay.x(at(data, p)) - mx, y - my);
        if (d <= bestD) {
          best = p;
          bestD = d;
        }
      }
    }
    return best;
  }

  /** A point's job page, as the table links it (the server names the address). */
  function linkOf(point) {
    return point && point.job ? document.querySelector(`a[data-point-job="${point.job}"]`) : null;
  }

  function follow(canvas) {
    if (canvas.sweepFollowed) return;
    canvas.sweepFollowed = true;
    canvas.addEventListener("mousemove", (ev) => {
      const point = pointAt(canvas, ev);
      canvas.style.cursor = linkOf(point) ? "pointer" : "";
      canvas.title = point
        ? `${point.strategy} at ${point.writers} writers${point.latency_ms != null ? ` ${point.latency_ms} ms away` : ""}: ` +
          `${Math.round(point.commits_per_s)} commits/s, ` +
          `conflict rate ${Math.round(point.conflict_rate * 100)}%${point.job ? ` (job #${point.job})` : ""}`
        : "";
    });
    canvas.addEventListener("click", (ev) => {
      const link = linkOf(pointAt(canvas, ev));
      if (link) window.location.href = link.href;
    });
  }

  // The state fragment is replaced as a whole by each frame (and by replay's seeking): draw each new one.
  let drawnFrom = null;
  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const canvas = shownCanvas();
      if (!canvas) return;
      follow(canvas);
      drawnFrom = document.getElementById("sweep-curve");
      draw(canvas);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    schedule();
    new MutationObserver(() => {
      if (document.getElementById("sweep-curve") !== drawnFrom) schedule();
    }).observe(document.body, { childList: true, subtree: true });
    window.addEventListener("resize", schedule);
  });
})();

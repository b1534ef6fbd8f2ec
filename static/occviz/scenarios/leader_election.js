/* The leader election's plug-in: leadership as bands on the replicas' lanes, so a gap
   (no one believes it leads) and an overlap (two do: a stale leader) show at a glance. */
"use strict";

(function () {
  const STARTS = new Set(["acquired"]);
  const ENDS = new Set(["lost", "released", "killed", "stopped"]);

  window.Occviz.plugins["leader-election"] = {
    reset(model) {
      model.bands = new Map(); // actor -> [{start, end}] while it believes it leads
    },

    add(model, e) {
      if (STARTS.has(e.kind)) {
        // An outside client's leadership ends when another takes the lease: its stop is not seen.
        for (const [actor, others] of model.bands) {
          const last = others[others.length - 1];
          if (actor !== e.actor && model.vocabulary.laneNames[actor] && last && last.end == null) last.end = e.t_ms;
        }
      }
      const bands = model.bands.get(e.actor) || [];
      const open = bands.length && bands[bands.length - 1].end == null ? bands[bands.length - 1] : null;
      if (STARTS.has(e.kind) && !open) bands.push({ start: e.t_ms, end: null });
      else if (ENDS.has(e.kind) && open) open.end = e.t_ms;
      model.bands.set(e.actor, bands);
    },

    /** Bands under the marks; above the lanes, a red bar where two believe they lead, a grey dashed line where none does. */
    drawLanes(ctx, view) {
      const { model, t0, t1, x, laneY, lay } = view;
      const end = (band) => (band.end == null ? model.maxT : band.end);
      const edges = [];
      for (const [actor, bands] of model.bands) {
        if (actor < 1 || actor > view.lanes) continue;
        for (const band of bands) {
          const a = Math.max(t0, band.start);
          const b = Math.min(t1, end(band));
          edges.push([band.start, 1], [end(band), -1]);
          if (b <= a) continue;
          ctx.fillStyle = "rgba(26, 158, 75, 0.18)";
          ctx.fillRect(x(a), laneY(actor) + 2, Math.max(1, x(b) - x(a)), lay.laneH - 4);
        }
      }
      // How many believe they lead, moment by moment.
      edges.sort((p, q) => p[0] - q[0] || p[1] - q[1]);
      let count = 0;
      let since = 0;
      const strip = (from, to, n) => {
        const a = Math.max(t0, from);
        const b = Math.min(t1, to);
        if (b <= a || n === 1) return;
        if (n === 0) {
          // No leader: a dashed grey line; two or more: a solid red bar (told apart by shape, not colour only).
          ctx.strokeStyle = "rgba(90, 90, 90, 0.8)";
          ctx.lineWidth = 2;
          ctx.setLineDash([4, 3]);
          ctx.beginPath();
          ctx.moveTo(x(a), lay.top - 4);
          ctx.lineTo(Math.max(x(a) + 1, x(b)), lay.top - 4);
          ctx.stroke();
          ctx.setLineDash([]);
          return;
        }
        ctx.fillStyle = "rgba(214, 40, 40, 0.85)";
        ctx.fillRect(x(a), lay.top - 6, Math.max(1, x(b) - x(a)), 4);
      };
      for (const [t, delta] of edges) {
        strip(since, t, count);
        count += delta;
        since = t;
      }
      strip(since, model.maxT, count);
      // Who holds a band now, readable from outside (tests, a curious user's dev tools).
      const leaders = [...model.bands].filter(([, b]) => b.length && b[b.length - 1].end == null).map(([a]) => a);
      ctx.canvas.dataset.leaders = leaders.sort((a, b) => a - b).join(",");
    },
  };
})();

/* Controllers A and B's plug-in: each erasure drawn as a line from the eraser's lane to the
   lane of the controller whose field it erased. */
"use strict";

(function () {
  window.Occviz.plugins.controllers = {
    drawLanes(ctx, view) {
      const { model, t0, t1, x, laneY, lay } = view;
      ctx.strokeStyle = model.vocabulary.color("erased");
      ctx.lineWidth = 1.5;
      for (const e of view.events) {
        if (e.kind !== "erased" || e.t_ms < t0 || e.t_ms > t1) continue;
        const victim = (e.detail || {}).victim_actor;
        if (!victim || victim > view.lanes || e.actor > view.lanes) continue;
        ctx.beginPath();
        ctx.moveTo(x(e.t_ms), laneY(e.actor) + lay.laneH / 2);
        ctx.lineTo(x(e.t_ms), laneY(victim) + lay.laneH / 2);
        ctx.stroke();
      }
    },
  };
})();

/* Controllers A and B's plug-in: each erasure drawn as a line from the eraser's lane to the
   lane of the controller whose field it erased, and, in replay, each controller's last write
   and writes erased at the moment shown (the live page gets them from the server). */
"use strict";

(function () {
  window.Occviz.plugins.controllers = {
    reset(model) {
      model.controllers = new Map(); // actor -> {field, value, version, lost}
      model.objectVersion = null;
    },

    add(model, e) {
      if (e.kind === "committed" && e.version_written != null) {
        const c = model.controllers.get(e.actor) || { lost: 0 };
        // Writers are recorded out of version order by a hair: keep each one's newest write.
        if (c.version == null || e.version_written > c.version) {
          Object.assign(c, { field: (e.detail || {}).field, value: e.value_written, version: e.version_written });
        }
        model.controllers.set(e.actor, c);
        if (model.objectVersion == null || e.version_written > model.objectVersion) model.objectVersion = e.version_written;
      } else if (e.kind === "erased") {
        const victim = (e.detail || {}).victim_actor;
        const c = model.controllers.get(victim) || { lost: 0 };
        c.lost += 1;
        model.controllers.set(victim, c);
      }
    },

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

    renderState(el, model) {
      if (!model.controllers.size) return;
      const p = document.createElement("p");
      p.textContent = `Deployment at v${model.objectVersion}`;
      const table = document.createElement("table");
      table.className = "replicas controllers";
      table.innerHTML =
        '<thead><tr><th scope="col">controller, its field</th>' +
        '<th scope="col">last write</th><th scope="col">erased</th></tr></thead>';
      const body = document.createElement("tbody");
      for (const actor of [...model.controllers.keys()].sort((a, b) => a - b)) {
        const c = model.controllers.get(actor);
        const tr = document.createElement("tr");
        tr.dataset.controller = actor;
        const th = document.createElement("th");
        th.scope = "row";
        const code = document.createElement("code");
        code.textContent = c.field || "–";
        th.append(model.vocabulary.actorName(actor), document.createElement("br"), code);
        tr.appendChild(th);
        for (const text of [c.version == null ? "–" : `${c.value} (v${c.version})`, String(c.lost)]) {
          const td = document.createElement("td");
          td.textContent = text;
          tr.appendChild(td);
        }
        body.appendChild(tr);
      }
      table.appendChild(body);
      el.replaceChildren(p, table);
    },
  };
})();

/* The counter race's plug-in: in replay, its rows and lost updates at the moment shown,
   rebuilt from the committed events (the live page gets them from the server). */
"use strict";

(function () {
  window.Occviz.plugins.counter = {
    reset(model) {
      model.counterRows = new Map(); // row id -> {value, version}
    },

    add(model, e) {
      if (e.kind !== "committed" || e.row == null || e.version_written == null) return;
      const row = model.counterRows.get(e.row);
      // Writers commit out of t_ms order by a hair: the highest version is the row's state.
      if (!row || e.version_written > row.version) model.counterRows.set(e.row, { value: e.value_written, version: e.version_written });
    },

    stateFigures(model) {
      // Every committed increment should have raised a row by one: the shortfall was erased.
      const initial = Number((model.vocabulary.data.params || {}).initial_value || 0);
      let gained = 0;
      for (const row of model.counterRows.values()) gained += row.value - initial;
      return { lost_updates: model.count(["committed"]) - gained };
    },

    renderState(el, model) {
      if (!model.counterRows.size) return;
      const table = document.createElement("table");
      table.className = "live-rows";
      table.innerHTML = "<thead><tr><th>row</th><th>value</th><th>version</th></tr></thead>";
      const body = document.createElement("tbody");
      for (const id of [...model.counterRows.keys()].sort((a, b) => a - b).slice(0, 64)) {
        const row = model.counterRows.get(id);
        const tr = document.createElement("tr");
        tr.dataset.row = id;
        for (const text of ["#" + id, row.value, "v" + row.version]) {
          const td = document.createElement("td");
          td.textContent = text;
          tr.appendChild(td);
        }
        body.appendChild(tr);
      }
      table.appendChild(body);
      el.replaceChildren(table);
    },
  };
})();

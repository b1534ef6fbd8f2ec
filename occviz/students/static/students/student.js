/* occviz student page: the +1 button sends one press and says what became of it (written, 409, too fast,
   the job over), without leaving the page that follows the job. The press goes over the page's open
   socket (pages.js announces it), or as a POST while there is none. Without this script the form
   posts and the page comes back with the same sentence. */
"use strict";

(function () {
  function pressForm(form) {
    const button = form.querySelector("[data-plus-one]");
    const result = form.querySelector("[data-press-result]");
    const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
    const page = document.querySelector("[data-student-page]");
    let sent = 0;
    let socket = null;
    document.addEventListener("occviz:socket", (event) => {
      socket = event.detail.socket;
    });

    const say = (message, ok, status) => {
      result.textContent = message;
      result.classList.toggle("bad", !ok);
      result.dataset.status = String(status);
    };
    document.addEventListener("occviz:pressed", (event) => {
      const data = event.detail;
      if (data.id !== sent) return; // an earlier press's answer: a later one has been sent since
      say(data.message, data.ok, data.status);
    });

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const mine = ++sent;
      result.classList.remove("bad");
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "press", id: mine }));
        return;
      }
      try {
        const response = await fetch(form.action, {
          method: "POST",
          headers: { Accept: "application/json", "X-CSRFToken": csrf },
          credentials: "same-origin",
        });
        const data = await response.json().catch(() => ({ ok: false, message: `The server answered ${response.status}.` }));
        if (mine !== sent) return; // a later press has spoken already
        say(data.message || data.error || `The server answered ${response.status}.`, data.ok, response.status);
      } catch (error) {
        result.textContent = "No answer from the server: press again.";
        result.classList.add("bad");
      }
    });

    // The job page's script marks the page finished when the job ends: the race is over, no more presses.
    if (page) {
      const sync = () => {
        if (page.dataset.finished === "1") button.disabled = true;
      };
      new MutationObserver(sync).observe(page, { attributes: true, attributeFilter: ["data-finished"] });
      sync();
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.querySelector("[data-press]");
    if (form) pressForm(form);
  });
})();

/* occviz pages: the live job page, replay and compare, wired to viz.js.
   The job page follows its one socket, the JSON event stream with ?html=1: the
   events feed the timeline and the rate chart, and each frame's server-rendered
   fragments (figures, state, log, status) are swapped in by id. It resumes with
   ?after=<last seq seen> after a drop and reads any gap from events.json; for a
   finished job, or when websockets fail, it reads the stored events over HTTP.
   Replay draws the stored events up to the moment shown and swaps in the same
   fragments as the server rendered them at that moment (/jobs/<id>/fragments/?seq=N). */
"use strict";

(function () {
  const O = window.Occviz;

  function largeTypeToggle() {
    const button = document.querySelector("[data-large-type]");
    if (!button) return;
    const sync = () => button.setAttribute("aria-pressed", String(document.documentElement.classList.contains("large")));
    sync();
    button.addEventListener("click", () => {
      const on = document.documentElement.classList.toggle("large");
      localStorage.setItem("occviz-large", on ? "1" : "0");
      sync();
      window.dispatchEvent(new Event("resize"));
    });
  }

  /** Tells the page's other scripts (captions.js) what happened: an `occviz:<name>` event on the document. */
  function announce(name, detail) {
    document.dispatchEvent(new CustomEvent(`occviz:${name}`, { detail }));
  }

  /** Adds events to the model, and announces those new to it (`mode`: live, or the history of a finished job). */
  function addEvents(model, events, mode) {
    const before = model.lastSeq;
    model.add(events);
    const added = events.filter((e) => e.seq > before);
    if (added.length) announce("events", { events: added, model, mode });
  }

  function modelFor() {
    return new O.JobModel(O.Vocabulary.fromPage());
  }

  /** Redraw at most once per animation frame, however many frames arrive. */
  function scheduler(draw) {
    let pending = false;
    const schedule = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        draw();
      });
    };
    window.addEventListener("resize", schedule);
    return schedule;
  }

  // What the job page and the replay page both draw into.
  function vizParts(page) {
    const model = modelFor();
    return {
      model,
      timeline: new O.Timeline(page.querySelector("[data-timeline]"), page.querySelector("[data-tooltip]")),
      // A scenario that charts no kind per second (a sweep draws its own curve) has no rate chart.
      rates: page.querySelector("[data-rates]") ? new O.RateChart(page.querySelector("[data-rates]"), model.vocabulary) : null,
    };
  }

  function jobPage(page) {
    const { model, timeline, rates } = vizParts(page);
    const note = page.querySelector("[data-viz-note]");
    const eventsUrl = page.dataset.eventsUrl;
    let finished = page.dataset.finished === "1";
    const mode = finished ? "history" : "live";
    let ended = false;

    const draw = () => {
      if (O.frozen) return; // presenter mode's pause: events keep arriving, the drawing waits
      // Live: the whole run while it is short, then the latest 10 s scrolling by.
      const t1 = finished ? Math.max(model.maxT, 1) : Math.max(model.maxT, 1000);
      const t0 = finished || t1 <= 10000 ? 0 : t1 - 10000;
      timeline.draw(model, { t0, t1, events: model.events });
      // While the timeline shows the whole run, the chart below it spans the run too (to its last bin's end).
      const span = t0 === 0 ? t1 : undefined;
      if (rates) rates.draw(model.series(span), { xMaxMs: span });
      // The last event drawn, readable from outside (tests, a curious user's dev tools).
      page.dataset.lastSeq = String(model.lastSeq);
      if (note && model.dropped) note.textContent = `The timeline shows the latest ${model.events.length} events; counters and rates count all ${model.lastSeq}.`;
    };
    const schedule = scheduler(draw);
    schedule();

    // Frames and HTTP pages are applied one after another, in order, never interleaved.
    let queue = Promise.resolve();
    const serial = (work) => {
      queue = queue.then(work).catch((error) => console.warn("occviz:", error));
      return queue;
    };
    const catchUp = (until) =>
      O.loadEvents(eventsUrl, model.lastSeq, (p) => {
        addEvents(model, p.events, mode);
        schedule();
      }, { until });

    const parts = lifetimeParts(!finished);
    const onEnd = () => {
      if (ended) return;
      ended = true;
      finished = true;
      page.dataset.finished = "1";
      schedule();
      parts.ended();
      announce("job-end");
    };

    if (finished) {
      serial(() => catchUp(Infinity)).then(onEnd);
      return;
    }

    const poll = () =>
      serial(async () => {
        const last = await catchUp(Infinity);
        if (["succeeded", "failed", "cancelled"].includes(last.status) && !last.more) {
          onEnd();
          return;
        }
        setTimeout(poll, 1000);
      });

    followSocket(page, () => model.lastSeq, {
      onFrame(data, events) {
        // The server's fragments as of this frame: those of figures, state, log and status that changed.
        if (data.html) O.swapFragments(data.html);
        parts.eventsFlow();
        serial(async () => {
          const complete = events && events.length === data.seq_to - data.seq_from + 1;
          // A gap (a dropped frame) or a frame sent as a range only: read what is missing from the store.
          if (data.seq_from > model.lastSeq + 1 || !complete) await catchUp(data.seq_to);
          else addEvents(model, events, "live");
          schedule();
        });
      },
      onEnd(data) {
        if (data.html) O.swapFragments(data.html);
        serial(() => catchUp(Infinity)).then(onEnd);
      },
      onBlocked() {
        // Websockets blocked (a proxy, say): read the store over HTTP instead.
        if (note) note.textContent = "Following the job over HTTP (websocket unavailable).";
        poll();
      },
    });
  }

  /** The job page's server-rendered parts that change with the job's lifetime, asked for again by their id. */
  function lifetimeParts(openedLive) {
    const refresh = (id) => {
      if (window.htmx && document.getElementById(id)) htmx.ajax("GET", window.location.pathname, { target: "#" + id, swap: "outerHTML" });
    };
    let objectsAsked = false;
    return {
      // A page opened before the job ran has no links to its objects: ask once its events flow, and at the end.
      eventsFlow() {
        if (objectsAsked || document.querySelector("#watched-objects [data-watch]")) return;
        objectsAsked = true;
        refresh("watched-objects");
      },
      // The controls: the finished version, without the cancel button (the verdict comes in the status fragment).
      ended() {
        refresh("controls");
        refresh("actor-controls");
        if (openedLive) refresh("watched-objects");
      },
    };
  }

  /** Follows a job's socket with the page's fragments (?html=1) from the last seq seen, again after a drop;
      after three opens that fail it leaves websockets to `onBlocked`. */
  function followSocket(page, lastSeq, { onFrame, onEnd, onBlocked }) {
    let failures = 0;
    let ended = false;
    const connect = () => {
      const scheme = window.location.protocol === "https:" ? "wss" : "ws";
      const socket = new WebSocket(`${scheme}://${window.location.host}${page.dataset.wsPath}?after=${lastSeq()}&html=1`);
      let opened = false;
      // Frames carry each event as an array of values in the order the hello names once.
      let fields = null;
      socket.onopen = () => {
        opened = true;
        failures = 0;
        announce("socket", { socket }); // a student page presses over it (student.js)
      };
      socket.onmessage = (message) => {
        const data = JSON.parse(message.data);
        if (data.type === "pressed") {
          announce("pressed", data);
        } else if (data.type === "hello") {
          fields = data.event_fields;
        } else if (data.type === "frame") {
          // Mapped to objects once, on receipt: everything after works on named fields.
          onFrame(data, fields && data.events ? O.eventsFromArrays(fields, data.events) : null);
        } else if (data.type === "end") {
          ended = true;
          onEnd(data);
        }
      };
      socket.onclose = () => {
        if (ended) return;
        failures += opened ? 0 : 1;
        if (failures >= 3) onBlocked();
        else setTimeout(connect, 500 + Math.random() * 1000);
      };
    };
    connect();
  }

  /** Swaps in the server's fragments as of one event, one request at a time: the newest moment asked for wins. */
  function fragmentsFollower(page) {
    const url = page.dataset.fragmentsUrl;
    let wanted = 0;
    let shown = 0;
    let busy = false;
    const pull = async () => {
      if (busy || wanted === shown) return;
      busy = true;
      const seq = wanted;
      try {
        const response = await fetch(`${url}?seq=${seq}`, { credentials: "same-origin" });
        if (response.ok) O.swapFragments(await response.text());
      } catch (error) {
        console.warn("occviz:", error);
      }
      // Marked shown even when it failed: the next moment asks again, rather than this one forever.
      shown = seq;
      page.dataset.seqShown = String(seq);
      busy = false;
      pull();
    };
    return (seq) => {
      wanted = seq;
      pull();
    };
  }

  function replayPage(page) {
    const { model, timeline, rates } = vizParts(page);
    const showFragments = fragmentsFollower(page);
    const play = page.querySelector("[data-play]");
    const speed = page.querySelector("[data-speed]");
    const scrub = page.querySelector("[data-scrub]");
    const clock = page.querySelector("[data-clock]");
    const loadNote = page.querySelector("[data-load-note]");
    let all = [];
    let duration = 0;
    let shown = 0; // index into `all` of the first event not yet in the model
    let seqShown = 0; // the highest seq among the events shown (events are in time order, seqs nearly so)
    let now = 0;
    let playing = false;
    let last = null;
    let yMax = 0;

    const moveTo = (t) => {
      now = Math.max(0, Math.min(duration, t));
      const added = [];
      let reset = false;
      if (shown > 0 && all[shown - 1].t_ms > now) {
        // Back in time: rebuild from the start (a few ms even for 100,000 events).
        model.reset();
        shown = 0;
        seqShown = 0;
        reset = true;
      }
      while (shown < all.length && all[shown].t_ms <= now) {
        const e = all[shown++];
        // Replay feeds events in time order, so seq order is not the guard here: add them directly.
        model.addOne(e);
        added.push(e);
        if (e.seq > seqShown) seqShown = e.seq;
      }
      const atEnd = now >= duration;
      if (added.length || reset || atEnd) announce("events", { events: added, model, mode: "replay", reset, playing, atEnd });
      scrub.value = String(now);
      clock.textContent = `${O.fmtMs(now)} of ${O.fmtMs(duration)}`;
      // Figures, state and log as the server rendered them at this moment: the live page's own fragments.
      showFragments(seqShown);
      schedule();
    };

    const draw = () => {
      timeline.draw(model, { t0: 0, t1: Math.max(duration, 1), events: model.events, cursor: now });
      // The chart keeps the whole run's scale, so the lines grow into a fixed frame as time passes.
      const series = model.series(duration);
      if (rates) rates.draw(series, { yMax, xMaxMs: duration, cursor: now });
    };
    const schedule = scheduler(draw);

    const tick = (ts) => {
      if (!playing) return;
      if (last != null) moveTo(now + (ts - last) * Number(speed.value));
      last = ts;
      if (now >= duration) {
        setPlaying(false);
        return;
      }
      requestAnimationFrame(tick);
    };
    const setPlaying = (on) => {
      playing = on;
      page.dataset.playing = on ? "1" : "0";
      play.textContent = on ? "Pause" : "Play";
      last = null;
      if (on) {
        if (now >= duration) moveTo(0);
        requestAnimationFrame(tick);
      }
    };
    play.addEventListener("click", () => setPlaying(!playing));
    // Presenter mode's keys: play/pause, and one event back or forward.
    page.occvizReplay = {
      toggle: () => !play.disabled && setPlaying(!playing),
      step(direction) {
        if (play.disabled) return;
        setPlaying(false);
        if (direction > 0 && shown < all.length) moveTo(all[shown].t_ms);
        else if (direction < 0 && shown > 0) {
          const latest = all[shown - 1].t_ms;
          let i = shown - 1;
          while (i > 0 && all[i - 1].t_ms >= latest) i--;
          moveTo(i > 0 ? all[i - 1].t_ms : -1);
        }
      },
    };
    scrub.addEventListener("input", () => moveTo(Number(scrub.value)));

    loadRun(page, loadNote).then((run) => {
      ({ all, duration, yMax } = run);
      scrub.max = String(duration);
      scrub.disabled = false;
      play.disabled = false;
      loadNote.textContent = `${all.length} events over ${O.fmtMs(duration)}. Play, or drag the slider to any moment.`;
      page.dataset.ready = "1";
      moveTo(0);
    }, (error) => {
      loadNote.textContent = "Could not load the events: " + error.message;
    });
  }

  /** A job's stored events in time order, the run's length, and the scale its whole rate chart needs. */
  async function loadRun(page, loadNote) {
    const collected = [];
    await O.loadEvents(page.dataset.eventsUrl, 0, (p) => {
      collected.push(...p.events);
      loadNote.textContent = `Loading the stored events… ${collected.length}`;
    });
    const whole = modelFor();
    whole.add(collected.slice().sort((a, b) => a.seq - b.seq));
    const all = collected.sort((a, b) => a.t_ms - b.t_ms || a.seq - b.seq);
    // Whole milliseconds: a slider's value may not round-trip a float exactly, and the end must show every event.
    const duration = all.length ? Math.ceil(all[all.length - 1].t_ms) : 0;
    return { all, duration, yMax: O.RateChart.maxRate(whole.series(duration)) };
  }

  function comparePage(container) {
    const data = JSON.parse(document.getElementById("compare-series").textContent);
    const charts = [...container.querySelectorAll("[data-compare-chart]")].map(
      (c, i) => new O.RateChart(c, new O.Vocabulary(data.jobs[i].vocabulary))
    );
    const series = data.jobs.map((j) => ({ bin_ms: data.bin_ms, rates: j.rates }));
    const xMaxMs = Math.max(...series.map((s) => Math.max(0, ...Object.values(s.rates).map((v) => v.length)) * data.bin_ms));
    // One y scale for every chart: the highest rate any of the jobs reached.
    const yMax = Math.max(...series.map((s) => O.RateChart.maxRate(s)));
    const draw = () => charts.forEach((chart, i) => chart.draw(series[i], { yMax, xMaxMs }));
    scheduler(draw)();
  }

  function homePage() {
    // The compare button is only useful with two or more ticked jobs.
    document.addEventListener("change", (ev) => {
      const form = ev.target.closest && ev.target.closest(".compare-form");
      if (!form) return;
      const ticked = form.querySelectorAll('input[name="id"]:checked').length;
      form.querySelector("[data-compare-ids]").textContent = ticked >= 2 ? `Compare ${ticked} jobs` : "Compare the ticked jobs";
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    largeTypeToggle();
    homePage();
    const page = document.querySelector("[data-page]");
    if (!page) return;
    if (page.dataset.page === "job") jobPage(page);
    else if (page.dataset.page === "replay") replayPage(page);
    else if (page.dataset.page === "compare") comparePage(page);
  });
})();

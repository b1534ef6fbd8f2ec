/* occviz slides: every chart out as PNG and as SVG, and a job's one-page report to print.
   A chart tells the page it was drawn (viz.js `drawn`: an `occviz:drawn` event whose
   `redraw(canvas)` draws the same again onto another canvas); the first time, its PNG and
   SVG buttons appear under it. PNG is the canvas's own pixels on white. SVG is a vector
   drawing: the chart is drawn again onto SvgContext, which records the part of
   CanvasRenderingContext2D the charts use as SVG elements. The report is the job page
   under print.css; "Print report" opens the browser's print dialog (save as PDF there). */
"use strict";

(function () {
  const TWO_PI = 2 * Math.PI;
  // A4's width less print.css's margins (186 mm), in CSS pixels.
  const PRINT_WIDTH = 703;
  const ALIGN = { left: "start", start: "start", center: "middle", right: "end", end: "end" };
  const BASELINE = { middle: "central", top: "text-before-edge", hanging: "hanging", bottom: "text-after-edge", ideographic: "ideographic" };
  // What each chart is called in its file's name and its buttons' labels, by its canvas's data attribute.
  const CHARTS = [
    ["timeline", "timeline"],
    ["rates", "rates"],
    ["quotaChart", "quota"],
    ["compareChart", "rates"],
  ];

  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  const n = (v) => String(Math.round(v * 100) / 100);

  /** "bold 12px system-ui, sans-serif" as SVG text attributes. */
  function fontAttributes(font) {
    const m = /^(.*?)(\d+(?:\.\d+)?)px\s+(.+)$/.exec(font.trim());
    if (!m) return ` font-size="10" font-family="sans-serif"`;
    const bold = /\bbold\b|\b[6-9]00\b/.test(m[1]) ? ` font-weight="bold"` : "";
    return ` font-size="${m[2]}" font-family="${esc(m[3])}"${bold}`;
  }

  /** A CanvasRenderingContext2D, as far as the charts use it, that records what is drawn as SVG. */
  class SvgContext {
    constructor(canvas) {
      this.canvas = canvas;
      this.elements = [];
      this.stack = [];
      this.font = "10px sans-serif";
      this.fillStyle = "#000";
      this.strokeStyle = "#000";
      this.lineWidth = 1;
      this.globalAlpha = 1;
      this.textAlign = "start";
      this.textBaseline = "alphabetic";
      this.dash = [];
      this.matrix = [1, 0, 0, 1, 0, 0];
      this.clipId = null; // the clip path in force (clip()), until the restore() that ends it
      this.clips = 0;
      this.beginPath();
      // Text is measured as the canvas would measure it.
      this.measurer = document.createElement("canvas").getContext("2d");
    }

    save() {
      const { font, fillStyle, strokeStyle, lineWidth, globalAlpha, textAlign, textBaseline, dash, matrix, clipId } = this;
      this.stack.push({ font, fillStyle, strokeStyle, lineWidth, globalAlpha, textAlign, textBaseline, dash, matrix, clipId });
    }

    restore() {
      if (this.stack.length) Object.assign(this, this.stack.pop());
    }

    setTransform(a, b, c, d, e, f) {
      this.matrix = [a, b, c, d, e, f];
    }

    translate(x, y) {
      const [a, b, c, d, e, f] = this.matrix;
      this.matrix = [a, b, c, d, e + a * x + c * y, f + b * x + d * y];
    }

    scale(sx, sy) {
      const [a, b, c, d, e, f] = this.matrix;
      this.matrix = [a * sx, b * sx, c * sy, d * sy, e, f];
    }

    setLineDash(dash) {
      this.dash = [...dash];
    }

    getLineDash() {
      return [...this.dash];
    }

    measureText(text) {
      this.measurer.font = this.font;
      return this.measurer.measureText(text);
    }

    transformAttribute() {
      const m = this.matrix;
      const identity = m[0] === 1 && m[1] === 0 && m[2] === 0 && m[3] === 1 && m[4] === 0 && m[5] === 0;
      return identity ? "" : ` transform="matrix(${m.map(n).join(" ")})"`;
    }

    emit(tag, attributes, content) {
      const transform = this.transformAttribute();
      const alpha = this.globalAlpha < 1 ? ` opacity="${n(this.globalAlpha)}"` : "";
      const element = content == null ? `<${tag}${attributes}${transform}${alpha}/>` : `<${tag}${attributes}${transform}${alpha}>${content}</${tag}>`;
      // In a group without a transform, so the clip path stays in the drawing's own coordinates.
      this.elements.push(this.clipId ? `<g clip-path="url(#${this.clipId})">${element}</g>` : element);
    }

    clip() {
      // The current path, as drawn under the transform in force now, limits what is drawn until restore().
      const id = `clip-${++this.clips}`;
      this.elements.push(`<clipPath id="${id}"><path d="${this.path.join("")}"${this.transformAttribute()}/></clipPath>`);
      this.clipId = id;
    }

    strokeAttributes() {
      const dash = this.dash.length ? ` stroke-dasharray="${this.dash.map(n).join(" ")}"` : "";
      return ` fill="none" stroke="${esc(this.strokeStyle)}" stroke-width="${n(this.lineWidth)}"${dash}`;
    }

    clearRect(x, y, w, h) {
      if (x <= 0 && y <= 0 && w >= this.canvas.width && h >= this.canvas.height) this.elements = [];
      else this.emit("rect", ` x="${n(x)}" y="${n(y)}" width="${n(w)}" height="${n(h)}" fill="#fff"`);
    }

    fillRect(x, y, w, h) {
      this.emit("rect", ` x="${n(x)}" y="${n(y)}" width="${n(w)}" height="${n(h)}" fill="${esc(this.fillStyle)}"`);
    }

    strokeRect(x, y, w, h) {
      this.emit("rect", ` x="${n(x)}" y="${n(y)}" width="${n(w)}" height="${n(h)}"${this.strokeAttributes()}`);
    }

    beginPath() {
      this.path = [];
      this.current = null; // the path's current point, if it has one
      this.subpathStart = null;
    }

    moveTo(x, y) {
      this.path.push(`M${n(x)} ${n(y)}`);
      this.current = [x, y];
      this.subpathStart = [x, y];
    }

    lineTo(x, y) {
      // As a canvas does: a line from no point starts the path there.
      if (!this.current) return this.moveTo(x, y);
      this.path.push(`L${n(x)} ${n(y)}`);
      this.current = [x, y];
    }

    closePath() {
      if (!this.current) return;
      this.path.push("Z");
      this.current = this.subpathStart;
    }

    rect(x, y, w, h) {
      this.moveTo(x, y);
      this.lineTo(x + w, y);
      this.lineTo(x + w, y + h);
      this.lineTo(x, y + h);
      this.closePath();
    }

    arc(cx, cy, r, a0, a1, anticlockwise = false) {
      const at = (a) => [cx + r * Math.cos(a), cy + r * Math.sin(a)];
      const [x0, y0] = at(a0);
      if (this.current) this.lineTo(x0, y0);
      else this.moveTo(x0, y0);
      const sweep = anticlockwise ? a0 - a1 : a1 - a0;
      if (sweep >= TWO_PI) {
        // A whole circle: two half arcs (one SVG arc cannot end where it starts).
        const [xh, yh] = at(a0 + Math.PI);
        this.path.push(`A${n(r)} ${n(r)} 0 1 1 ${n(xh)} ${n(yh)}`, `A${n(r)} ${n(r)} 0 1 1 ${n(x0)} ${n(y0)}`);
        this.current = [x0, y0];
        return;
      }
      const turned = ((sweep % TWO_PI) + TWO_PI) % TWO_PI;
      const [x1, y1] = at(a1);
      this.path.push(`A${n(r)} ${n(r)} 0 ${turned > Math.PI ? 1 : 0} ${anticlockwise ? 0 : 1} ${n(x1)} ${n(y1)}`);
      this.current = [x1, y1];
    }

    fill() {
      if (this.path.length) this.emit("path", ` d="${this.path.join("")}" fill="${esc(this.fillStyle)}"`);
    }

    stroke() {
      if (this.path.length) this.emit("path", ` d="${this.path.join("")}"${this.strokeAttributes()}`);
    }

    fillText(text, x, y) {
      const anchor = ALIGN[this.textAlign] || "start";
      const baseline = BASELINE[this.textBaseline];
      const attributes =
        ` x="${n(x)}" y="${n(y)}" fill="${esc(this.fillStyle)}"${fontAttributes(this.font)}` +
        (anchor === "start" ? "" : ` text-anchor="${anchor}"`) +
        (baseline ? ` dominant-baseline="${baseline}"` : "");
      this.emit("text", attributes, esc(text));
    }

    /** The drawing as an SVG document, `cssWidth` x `cssHeight` on the page, on white. */
    toSVG(cssWidth, cssHeight) {
      const { width, height } = this.canvas;
      return (
        `<svg xmlns="http://www.w3.org/2000/svg" width="${n(cssWidth)}" height="${n(cssHeight)}" viewBox="0 0 ${width} ${height}">\n` +
        `<rect width="${width}" height="${height}" fill="#fff"/>\n${this.elements.join("\n")}\n</svg>\n`
      );
    }
  }

  /** The chart shown on `canvas` as SVG text: drawn again onto an SvgContext, as wide as it is or `width`. */
  function chartAsSVG(canvas, width = canvas.clientWidth) {
    const target = {
      clientWidth: width,
      parentElement: canvas.parentElement,
      width: 0,
      height: 0,
      style: {},
      dataset: {},
      getAttribute: (name) => canvas.getAttribute(name),
    };
    const ctx = new SvgContext(target);
    target.getContext = () => ctx;
    canvas.occvizRedraw(target);
    return ctx.toSVG(target.clientWidth, parseFloat(target.style.height) || canvas.clientHeight);
  }

  /** The canvas's pixels on white (a canvas is transparent where nothing was drawn). */
  function chartAsPNG(canvas) {
    const flat = document.createElement("canvas");
    flat.width = canvas.width;
    flat.height = canvas.height;
    const ctx = flat.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, flat.width, flat.height);
    ctx.drawImage(canvas, 0, 0);
    return new Promise((resolve) => flat.toBlob(resolve, "image/png"));
  }

  function download(blob, filename) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = filename;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }

  function chartName(canvas) {
    const found = CHARTS.find(([key]) => key in canvas.dataset);
    return found ? found[1] : "chart";
  }

  /** "occviz-job-12-timeline" (a compare chart names its own job, a replay says so). */
  function fileStem(canvas) {
    const job = canvas.dataset.job || (canvas.closest("[data-job]") || {}).dataset?.job || "";
    const replay = canvas.closest('[data-page="replay"]') ? "-replay" : "";
    return `occviz-job-${job}${replay}-${chartName(canvas)}`;
  }

  /** The PNG and SVG buttons under a chart, made the first time it is drawn. */
  function addButtons(canvas) {
    const wrap = canvas.closest(".canvas-wrap") || canvas;
    const title = canvas.getAttribute("aria-label") || chartName(canvas);
    const tools = document.createElement("div");
    tools.className = "chart-out";
    tools.dataset.chartOut = chartName(canvas);
    for (const format of ["PNG", "SVG"]) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = format;
      button.dataset.download = format.toLowerCase();
      button.setAttribute("aria-label", `Download "${title}" as ${format}`);
      button.title = `Download this chart as ${format}`;
      button.addEventListener("click", async () => {
        const blob = format === "PNG" ? await chartAsPNG(canvas) : new Blob([chartAsSVG(canvas)], { type: "image/svg+xml" });
        download(blob, `${fileStem(canvas)}.${format.toLowerCase()}`);
      });
      tools.appendChild(button);
    }
    wrap.after(tools);
  }

  document.addEventListener("occviz:drawn", (ev) => {
    const canvas = ev.target;
    const first = !canvas.occvizRedraw;
    canvas.occvizRedraw = ev.detail.redraw;
    if (first) addButtons(canvas);
  });

  /** As the page prints, each chart of the job page drawn again at the sheet's width, as inline SVG that
      print.css shows instead of the canvas (a canvas would print its screen-wide pixels shrunk to half,
      its words with them). Inline, so that it is laid out at once, with nothing to load. */
  window.addEventListener("beforeprint", () => {
    for (const canvas of document.querySelectorAll('[data-page="job"] canvas')) {
      if (!canvas.occvizRedraw) continue;
      const copy = document.createElement("div");
      copy.className = "print-copy";
      copy.hidden = true;
      copy.setAttribute("aria-hidden", "true"); // the canvas, with its text, is the chart on screen
      copy.innerHTML = chartAsSVG(canvas, PRINT_WIDTH);
      canvas.after(copy);
    }
  });
  window.addEventListener("afterprint", () => document.querySelectorAll(".print-copy").forEach((copy) => copy.remove()));

  /** The job page's "Print report" button, beside its controls (outside the fragment the page swaps). */
  function printButton() {
    const head = document.querySelector('[data-page="job"] .jobhead');
    if (!head) return;
    const tools = document.createElement("div");
    tools.className = "report-out";
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.printReport = "";
    button.textContent = "Print report";
    button.title = "This job on one A4 page: verdict, figures, timeline, log and parameters (save as PDF from the dialog)";
    button.addEventListener("click", () => window.print());
    tools.appendChild(button);
    head.appendChild(tools);
  }

  document.addEventListener("DOMContentLoaded", printButton);

  window.Occviz.slides = { SvgContext, chartAsSVG };
})();

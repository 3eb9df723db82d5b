// A live line chart of one figure against step (uPlot), grown a point at a time. Its x axis spans
// the job's steps (0 to the last) from the first point on, so a chart shows how far the run has
// come; until that point it says why it is empty (the job's summary knows: queued, starting ...).
// Optionally with a reference line beside it (the validation chart's blind baseline), drawn dashed.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { h, number } from "./dom.js";

// When each chart last received a point and the frame that shows it began (performance.now()),
// for the console benchmark's latency: window.relayConsole.charts[name] = {points, received, drawn};
// window.relayConsole.plots[name] is the uPlot itself (the browser tests read its x scale).
const probe = (window.relayConsole ??= { charts: {} });
probe.plots ??= {};

export class LiveChart {
  // reference: { title, color } of a second figure given with each point (add's referenceValue).
  constructor(name, title, color, steps, reference = null) {
    this.name = name;
    this.steps = [];
    this.values = [];
    this.reference = reference;
    this.references = [];
    this.plot = null;
    this.color = color;
    this.title = title;
    this.lastStep = steps;
    this.empty = h("div.empty", { "data-empty": "" }, "Loading…");
    this.area = h("div");
    this.node = h("div.card.chart", { "data-chart": name, "data-points": "0" }, h("h3", {}, title), this.empty, this.area);
    probe.charts[name] = { points: 0, received: null, drawn: null };
  }

  // Why the chart has no points yet, in the words of the job's summary (its metrics_note).
  explain(text) {
    this.empty.textContent = text ? text[0].toUpperCase() + text.slice(1) : "No points yet";
  }

  add(step, value, receivedAt, referenceValue = null) {
    if (value === null || value === undefined || !Number.isFinite(value)) return;
    const last = this.steps.length ? this.steps[this.steps.length - 1] : -Infinity;
    if (step <= last) return; // a resumed attempt may report a step again
    this.steps.push(step);
    this.values.push(value);
    this.references.push(Number.isFinite(referenceValue) ? referenceValue : null);
    this.draw();
    const count = this.steps.length;
    // The frame that shows the new point.
    requestAnimationFrame(() => {
      probe.charts[this.name] = { points: count, received: receivedAt, drawn: performance.now() };
      this.node.dataset.points = String(count);
    });
  }

  draw() {
    const data = this.reference ? [this.steps, this.values, this.references] : [this.steps, this.values];
    if (this.plot) {
      this.plot.setData(data);
      return;
    }
    if (!this.node.isConnected || !this.steps.length) return;
    this.empty.remove();
    const width = Math.max(280, this.area.clientWidth || 340);
    const lastStep = this.lastStep;
    const series = [{ label: "step" }, { label: this.title, stroke: this.color, width: 2, points: { size: 4 } }];
    if (this.reference) series.push({ label: this.reference.title, stroke: this.reference.color, width: 1.5, dash: [6, 4], points: { show: false } });
    if (this.reference) this.node.append(h("div.legend", {}, h("span", { style: `color: ${this.color}` }, `— ${this.title}`), h("span", { style: `color: ${this.reference.color}` }, `- - ${this.reference.title}`)));
    this.plot = new uPlot(
      {
        width,
        height: 190,
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
        // 0 to the job's last step, whatever has arrived so far. Not max(lastStep, max): uPlot pads
        // the range of a single point (60 becomes 0..120) before it asks.
        scales: { x: { time: false, range: (_plot, _min, max) => [0, lastStep || max] } },
        // Learning rates are tiny: label the axis in exponent form when the values call for it.
        axes: [{ label: "step", size: 36 }, { size: 64, values: (_plot, ticks) => ticks.map((tick) => number(tick, 3)) }],
        series,
      },
      data,
      this.area,
    );
    probe.plots[this.name] = this.plot;
    new ResizeObserver(() => {
      const next = Math.max(280, this.area.clientWidth);
      if (this.plot && Math.abs(next - this.plot.width) > 4) this.plot.setSize({ width: next, height: 190 });
    }).observe(this.area);
  }

  destroy() {
    if (this.plot) this.plot.destroy();
  }
}

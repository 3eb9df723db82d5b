// A live line chart of one figure against step (uPlot), grown a point at a time; optionally with a
// reference line beside it (the validation chart's blind baseline), drawn dashed.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { h, number } from "./dom.js";

// When each chart last received a point and the frame that shows it began (performance.now()),
// for the console benchmark's latency: window.relayConsole.charts[name] = {points, received, drawn}.
const probe = (window.relayConsole ??= { charts: {} });

export class LiveChart {
  // reference: { title, color } of a second figure given with each point (add's referenceValue).
  constructor(name, title, color, reference = null) {
    this.name = name;
    this.steps = [];
    this.values = [];
    this.reference = reference;
    this.references = [];
    this.plot = null;
    this.color = color;
    this.title = title;
    this.empty = h("div.empty", {}, "No points yet");
    this.area = h("div");
    this.node = h("div.card.chart", { "data-chart": name, "data-points": "0" }, h("h3", {}, title), this.empty, this.area);
    probe.charts[name] = { points: 0, received: null, drawn: null };
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
    if (!this.node.isConnected) return;
    this.empty.remove();
    const width = Math.max(280, this.area.clientWidth || 340);
    const series = [{ label: "step" }, { label: this.title, stroke: this.color, width: 2, points: { size: 4 } }];
    if (this.reference) series.push({ label: this.reference.title, stroke: this.reference.color, width: 1.5, dash: [6, 4], points: { show: false } });
    if (this.reference) this.node.append(h("div.legend", {}, h("span", { style: `color: ${this.color}` }, `— ${this.title}`), h("span", { style: `color: ${this.reference.color}` }, `- - ${this.reference.title}`)));
    this.plot = new uPlot(
      {
        width,
        height: 190,
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: false } },
        // Learning rates are tiny: label the axis in exponent form when the values call for it.
        axes: [{ label: "step", size: 36 }, { size: 64, values: (_plot, ticks) => ticks.map((tick) => number(tick, 3)) }],
        series,
      },
      data,
      this.area,
    );
    new ResizeObserver(() => {
      const next = Math.max(280, this.area.clientWidth);
      if (this.plot && Math.abs(next - this.plot.width) > 4) this.plot.setSize({ width: next, height: 190 });
    }).observe(this.area);
  }

  destroy() {
    if (this.plot) this.plot.destroy();
  }
}

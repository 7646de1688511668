// A run's metrics: one uPlot chart per metric, step on x, hover shows step and value,
// drag to zoom (double-click resets), optional smoothing; NaN and infinite points drawn
// as red marks. While the run is running, new rows extend the charts (keeping a zoom)
// and a metric seen for the first time gets its chart.
import { getAll, seg } from "./api.js";
import { chartAxes } from "./axes.js";
import { clear, el, fmtNumber } from "./dom.js";

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

const SMOOTHING = [0, 0.6, 0.9, 0.99];

// {name: {steps, values, raw}} from history rows in step order; raw keeps the text of a
// value that was not finite. A row at a series' last step replaces that point (a later
// row of the same step), one before it is ignored (x must stay sorted for uPlot).
export function seriesOf(rows, series = {}) {
  for (const row of rows) {
    if (row.step === null) continue;
    for (const [name, raw] of Object.entries(row.metrics)) {
      let value = raw;
      if (typeof raw === "boolean") value = raw ? 1 : 0;
      else if (typeof raw === "string" && raw in NON_FINITE) value = NON_FINITE[raw];
      else if (typeof raw !== "number") continue;
      const s = (series[name] ||= { steps: [], values: [], raw: [] });
      const last = s.steps.length - 1;
      if (last >= 0 && row.step < s.steps[last]) continue;
      const at = last >= 0 && row.step === s.steps[last] ? last : s.steps.length;
      s.steps[at] = row.step;
      s.values[at] = Number.isFinite(value) ? value : null;
      s.raw[at] = Number.isFinite(value) ? null : raw;
    }
  }
  return series;
}

function smooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => {
    if (v === null) return null;
    last = last === null ? v : last * weight + (1 - weight) * v;
    return last;
  });
}

// Where to draw the mark of a non-finite point: at the last finite value before it (else the first after).
function markLevels(s) {
  const out = new Array(s.values.length).fill(null);
  let last = s.values.find((v) => v !== null) ?? 0;
  s.values.forEach((v, i) => {
    if (v !== null) last = v;
    else if (s.raw[i] !== null) out[i] = last;
  });
  return out;
}

function chartData(s, weight) {
  return [s.steps, smooth(s.values, weight), markLevels(s)];
}

// The chart of metric `name`, added to `grid` in name order and as wide as its cell there.
function metricChart(name, s, weight, grid) {
  const marks = () => String(s.raw.filter((r) => r !== null).length);
  const box = el("div", { class: "chart", dataset: { metric: name, points: String(s.steps.length), marks: marks() } });
  box.append(el("h3", { text: name }));
  grid.insertBefore(box, [...grid.children].find((other) => other.dataset.metric > name) || null);
  const axes = chartAxes(box);
  const opts = {
    width: Math.max(240, box.clientWidth - 12),
    height: 220,
    scales: axes.scales,
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    series: [
      { label: "step", value: (u, v) => (v === null || v === undefined ? "—" : String(v)) },
      { label: "value", stroke: "#2f6fdf", width: 1.5, spanGaps: false, value: (u, v) => fmtNumber(v) },
      {
        label: "not finite",
        stroke: "#c8372d",
        width: 0,
        paths: () => null,
        points: { show: true, size: 7, stroke: "#c8372d", fill: "#c8372d" },
        value: (u, v, si, i) => (i === null || i === undefined || v === null ? "—" : s.raw[i] ?? "—"),
      },
    ],
    axes: axes.axes,
    hooks: {
      // The visible step range, on the element too (zoom state a reader or a test can see).
      setScale: [
        (u, key) => {
          if (key !== "x") return;
          box.dataset.xMin = String(Math.round(u.scales.x.min));
          box.dataset.xMax = String(Math.round(u.scales.x.max));
        },
      ],
      draw: [axes.draw],
    },
  };
  const plot = new window.uPlot(opts, chartData(s, weight), box);
  // The grid's cells change with the window; the chart follows its cell.
  new ResizeObserver(() => {
    const width = Math.max(240, box.clientWidth - 12);
    if (width !== plot.width) plot.setSize({ width, height: plot.height });
  }).observe(box);
  // The steps the chart last showed in full: a narrower x scale is the reader's zoom.
  let extent = [s.steps[0], s.steps[s.steps.length - 1]];
  return {
    // Redraw from the series (new points, or another smoothing), keeping a zoom in place.
    update(weightNow) {
      const { min, max } = plot.scales.x;
      const zoomed = min > extent[0] || max < extent[1];
      plot.setData(chartData(s, weightNow), !zoomed);
      // Set again so that y fits the kept steps' new values.
      if (zoomed) plot.setScale("x", { min, max });
      extent = [s.steps[0], s.steps[s.steps.length - 1]];
      box.dataset.points = String(s.steps.length);
      box.dataset.marks = marks();
    },
  };
}

function lastStepOf(rows, from) {
  return rows.reduce((m, r) => (r.step !== null && r.step > m ? r.step : m), from);
}

// The metrics section of run `runId`; resolves to a refresh function that takes new rows.
export async function metricsSection(section, runId, ctx) {
  const path = `/runs/${seg(runId)}/metrics`;
  const rows = await getAll(path, { limit: 10000 }, "rows");
  if (!ctx.alive()) return null;
  const series = seriesOf(rows);
  let weight = 0;
  const smoothing = el("select", { name: "smoothing", "aria-label": "smoothing" });
  for (const w of SMOOTHING) smoothing.append(el("option", { value: w, text: w ? `smoothing ${w}` : "no smoothing" }));
  const hint = "drag to zoom, double-click to reset; red marks are NaN or infinite values";
  const toolbar = el("div", { class: "toolbar" }, smoothing, el("span", { class: "muted", text: hint }));
  const none = el("p", { class: "muted", text: "No metrics logged." });
  const grid = el("div", { class: "charts" });
  clear(section).append(el("h2", { text: "Metrics" }), toolbar, none, grid);
  const charts = new Map();
  const draw = () => {
    for (const name of Object.keys(series)) {
      if (charts.has(name)) charts.get(name).update(weight);
      else charts.set(name, metricChart(name, series[name], weight, grid));
    }
    toolbar.hidden = charts.size === 0;
    none.hidden = charts.size > 0;
  };
  draw();
  smoothing.addEventListener("change", () => {
    weight = Number(smoothing.value);
    draw();
  });
  let lastStep = lastStepOf(rows, -Infinity);
  // From the last step seen, inclusive: a row logged later at that same step may add to it.
  return async () => {
    const params = { limit: 10000, min_step: Number.isFinite(lastStep) ? lastStep : null };
    const more = await getAll(path, params, "rows");
    if (!more.length || !ctx.alive()) return;
    seriesOf(more, series);
    lastStep = lastStepOf(more, lastStep);
    draw();
  };
}

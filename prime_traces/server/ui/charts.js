// One uPlot chart per metric: step on x, hover shows step and value, drag to zoom
// (double-click resets), optional smoothing; NaN and infinite points drawn as red marks.
import { el, fmtNumber } from "./dom.js";

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

// {name: {steps, values, marks}} from history rows; marks are steps whose value was not finite.
export function seriesOf(rows, series = {}) {
  for (const row of rows) {
    if (row.step === null) continue;
    for (const [name, raw] of Object.entries(row.metrics)) {
      let value = raw;
      if (typeof raw === "boolean") value = raw ? 1 : 0;
      else if (typeof raw === "string" && raw in NON_FINITE) value = NON_FINITE[raw];
      else if (typeof raw !== "number") continue;
      const s = (series[name] ||= { steps: [], values: [], raw: [] });
      s.steps.push(row.step);
      s.values.push(Number.isFinite(value) ? value : null);
      s.raw.push(Number.isFinite(value) ? null : raw);
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

// The chart of metric `name`, added to `grid` and as wide as its cell there.
export function metricChart(name, s, weight, grid) {
  const marks = () => String(s.raw.filter((r) => r !== null).length);
  const box = el("div", { class: "chart", dataset: { metric: name, points: String(s.steps.length), marks: marks() } });
  box.append(el("h3", { text: name }));
  grid.append(box);
  const opts = {
    width: Math.max(240, box.clientWidth - 12),
    height: 220,
    scales: { x: { time: false } },
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
    axes: [{ label: "step" }, {}],
    hooks: {
      // The visible step range, on the element too (zoom state a reader or a test can see).
      setScale: [
        (u, key) => {
          if (key !== "x") return;
          box.dataset.xMin = String(Math.round(u.scales.x.min));
          box.dataset.xMax = String(Math.round(u.scales.x.max));
        },
      ],
    },
  };
  const plot = new window.uPlot(opts, chartData(s, weight), box);
  // The grid's cells change with the window; the chart follows its cell.
  new ResizeObserver(() => {
    const width = Math.max(240, box.clientWidth - 12);
    if (width !== plot.width) plot.setSize({ width, height: plot.height });
  }).observe(box);
  return {
    box,
    plot,
    update(weightNow, rescale) {
      plot.setData(chartData(s, weightNow), rescale);
      box.dataset.points = String(s.steps.length);
      box.dataset.marks = marks();
    },
  };
}

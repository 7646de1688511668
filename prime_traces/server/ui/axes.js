// The axes of a metric chart, as uPlot options.
// y: labels show the decimals their tick step needs, or an exponent where those would be long, and
// the axis is as wide as its widest label, so that no label is cut at the canvas's left edge.
// x: steps are whole numbers, so ticks fall on whole steps only, and a zoom widens to the whole
// steps it covers (a zoom inside one step would otherwise show no tick at all).
// uPlot draws the axes on its canvas, out of reach of a reader or a test, so what they last drew
// is also kept on the chart's element, as JSON in data-axes:
//   {x: {ticks, labels}, y: {ticks, labels, labelSpacePx, font}}
// where labelSpacePx is the width, in CSS pixels, from the canvas's left edge to the y labels' end.

const FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
// uPlot's own tick length and label gap, named here because the y axis's width depends on them.
const TICK_PX = 10;
const GAP_PX = 5;
// uPlot's default width: a chart whose labels are short looks as it always did.
const MIN_Y_AXIS_PX = 50;
// Room for antialiasing between the widest label's ink and the canvas's edge.
const EDGE_PX = 2;
// Past these, y labels switch to exponent form: 0.000002 and 1,000,000,000,000 read worse than 2e-6 and 1e+12.
const MAX_DECIMALS = 5;
const MAX_FIXED_CHARS = 14;
const MAX_MANTISSA_DIGITS = 15;
// Tick increments for steps, whole numbers only: 1, 2, 5, 10, 20, 50, ... up to 5e18 (a step is an int64).
const STEP_INCRS = Array.from({ length: 19 }, (_, exp) => [1, 2, 5].map((m) => m * 10 ** exp)).flat();

const stepFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
let measurer = null;

// How far a label right-aligned to a point reaches left of it (its advance or its ink, the larger), in CSS pixels.
function labelWidth(text) {
  if (!measurer) {
    measurer = document.createElement("canvas").getContext("2d");
    measurer.font = FONT;
    measurer.textAlign = "right";
  }
  const m = measurer.measureText(text);
  return Math.max(m.width, m.actualBoundingBoxLeft);
}

// The fraction digits that write `incr` exactly (uPlot's increments are 1, 2, 2.5 or 5 times a power of 10).
function decimalsOf(incr) {
  for (let d = 0; d < 20; d++) {
    const scaled = incr * 10 ** d;
    if (Math.abs(scaled - Math.round(scaled)) <= 1e-9 * scaled) return d;
  }
  return 20;
}

// `v` in exponent form, with as many mantissa digits as tell it from a neighbour `incr` away.
function exponentLabel(v, incr) {
  if (v === 0) return "0";
  const incrExp = Math.floor(Math.log10(incr));
  const digits = Math.floor(Math.log10(Math.abs(v))) - incrExp + decimalsOf(incr / 10 ** incrExp);
  const text = v.toExponential(Math.min(Math.max(digits, 0), MAX_MANTISSA_DIGITS));
  return text.replace(/\.?0+e/, "e");
}

// The labels of y ticks `splits`, `incr` apart: one notation for the whole axis.
function valueLabels(splits, incr) {
  const decimals = decimalsOf(incr);
  if (decimals <= MAX_DECIMALS) {
    const format = new Intl.NumberFormat(undefined, { maximumFractionDigits: decimals });
    const fixed = splits.map((v) => format.format(v));
    if (fixed.every((text) => text.length <= MAX_FIXED_CHARS)) return fixed;
  }
  return splits.map((v) => exponentLabel(v, incr));
}

// The y axis's width for `labels` (null before uPlot has any).
function yAxisSize(u, labels) {
  if (!labels) return MIN_Y_AXIS_PX;
  const widest = labels.reduce((w, text) => Math.max(w, labelWidth(text)), 0);
  return Math.max(MIN_Y_AXIS_PX, Math.ceil(widest) + TICK_PX + GAP_PX + EDGE_PX);
}

// The x range covering [min, max] in whole steps, at least one step wide.
function wholeSteps(u, min, max) {
  if (min === null || max === null) return [min, max];
  const first = Math.floor(min);
  return [first, Math.max(Math.ceil(max), first + 1)];
}

/** uPlot's `scales`, `axes` and a `draw` hook for the chart in `box`; the hook fills box.dataset.axes. */
export function chartAxes(box) {
  const drawn = { x: { ticks: [], labels: [] }, y: { ticks: [], labels: [] } };
  const keep = (axis, ticks, labels) => {
    drawn[axis] = { ticks, labels };
    return labels;
  };
  return {
    scales: { x: { time: false, range: wholeSteps } },
    axes: [
      {
        label: "step",
        font: FONT,
        incrs: STEP_INCRS,
        values: (u, splits) => keep("x", splits, splits.map((v) => stepFormat.format(v))),
      },
      {
        font: FONT,
        size: yAxisSize,
        gap: GAP_PX,
        ticks: { size: TICK_PX },
        values: (u, splits, axisIdx, space, incr) => keep("y", splits, valueLabels(splits, incr)),
      },
    ],
    draw: (u) => {
      // Labels end a tick and a gap left of the plot, whose left edge uPlot sets in CSS pixels.
      const labelSpacePx = parseFloat(u.over.style.left) - TICK_PX - GAP_PX;
      box.dataset.axes = JSON.stringify({ x: drawn.x, y: { ...drawn.y, labelSpacePx, font: FONT } });
    },
  };
}

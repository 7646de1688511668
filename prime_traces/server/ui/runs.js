// The runs table: newest first, filtered by status and kind, paged, refreshed while runs are running.
import { getJSON, seg } from "./api.js";
import { clear, el, fmtBytes, fmtDuration, fmtTime, pager, statusBadge } from "./dom.js";

const STATUSES = ["", "running", "completed", "failed", "cancelled", "crashed", "unknown"];
const KINDS = ["", "train", "eval", "unknown"];
const REFRESH_MS = 3000;
const PAGE_SIZE = 25;
const view = { status: "", kind: "", cursor: null, next: null, stack: [] };
let refreshTimer = null;

function select(name, values, current, onChange) {
  const node = el("select", { name, "aria-label": name });
  for (const value of values) node.append(el("option", { value, text: value || `any ${name}`, selected: value === current }));
  node.addEventListener("change", () => onChange(node.value));
  return node;
}

// A hand-drawn line of up to 64 values; nulls (NaN, non-numbers) break the line.
export function sparkline(values, width = 110, height = 24) {
  const canvas = el("canvas", { class: "spark", width: width * 2, height: height * 2 });
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const finite = values.filter((v) => v !== null && Number.isFinite(v));
  if (!finite.length) return canvas;
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  const ctx = canvas.getContext("2d");
  ctx.strokeStyle = "#2f6fdf";
  ctx.lineWidth = 2;
  ctx.beginPath();
  let drawing = false;
  values.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) {
      drawing = false;
      return;
    }
    const x = values.length > 1 ? (i / (values.length - 1)) * (canvas.width - 4) + 2 : canvas.width / 2;
    const y = hi === lo ? canvas.height / 2 : canvas.height - 2 - ((v - lo) / (hi - lo)) * (canvas.height - 4);
    if (drawing) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
    drawing = true;
  });
  ctx.stroke();
  return canvas;
}

function row(run) {
  const spark = run.sparkline;
  return el(
    "tr",
    { dataset: { runId: run.run_id } },
    el("td", { class: "name" }, el("a", { href: "#/run/" + seg(run.run_id), text: run.name || run.run_id })),
    el("td", { text: run.kind }),
    el("td", {}, statusBadge(run.status)),
    el("td", { text: fmtTime(run.started_at) }),
    el("td", { class: "num", text: run.status === "unknown" ? "—" : fmtDuration(run.started_at, run.finished_at) }),
    el("td", { class: "num", text: run.records.toLocaleString() }),
    el("td", { class: "num", text: fmtBytes(run.bytes) }),
    el("td", { class: "muted", title: "producer: a fingerprint of its credential", text: run.producer || "—" }),
    el("td", { title: spark ? spark.name : "" }, spark ? sparkline(spark.values) : ""),
  );
}

export async function runsPage(main, ctx) {
  const page = await getJSON("/_viewer/runs", {
    status: view.status,
    kind: view.kind,
    cursor: view.cursor,
    limit: PAGE_SIZE,
  });
  if (!ctx.alive()) return;
  view.next = page.next_cursor;
  const rerender = () => runsPage(main, ctx).catch(() => {});
  const refilter = (name) => (value) => {
    Object.assign(view, { [name]: value, cursor: null, next: null, stack: [] });
    rerender();
  };
  const head = el(
    "tr",
    {},
    ...["Run", "Kind", "Status", "Started", "Duration", "Records", "Bytes", "Producer", "First metric"].map((h) =>
      el("th", { class: ["Duration", "Records", "Bytes"].includes(h) ? "num" : null, text: h }),
    ),
  );
  const body = el("tbody", {}, ...page.items.map(row));
  const stale = el("span", { class: "error refresh-error", hidden: true });
  clear(main).append(
    el("h1", { text: "Runs" }),
    el(
      "div",
      { class: "toolbar" },
      select("status", STATUSES, view.status, refilter("status")),
      select("kind", KINDS, view.kind, refilter("kind")),
      stale,
    ),
    page.items.length
      ? el("table", { id: "runs" }, el("thead", {}, head), body)
      : el("p", { class: "muted", text: "No runs yet." }),
    pager(view, rerender),
  );
  // One pending refresh at a time, however often the filters change.
  clearTimeout(refreshTimer);
  if (page.items.some((run) => run.status === "running")) scheduleRefresh(main, ctx, stale);
}

// A refresh that fails (the service restarting, say) is said in `stale` and tried again.
function scheduleRefresh(main, ctx, stale) {
  refreshTimer = setTimeout(() => {
    if (!ctx.alive()) return;
    runsPage(main, ctx).catch((err) => {
      if (!ctx.alive()) return;
      stale.textContent = `refresh failed (${err.message}); trying again`;
      stale.hidden = false;
      scheduleRefresh(main, ctx, stale);
    });
  }, REFRESH_MS);
}

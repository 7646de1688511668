// A run: status, config and summary, one chart per metric, its episodes (sortable, paged).
import { getAll, getJSON, seg } from "./api.js";
import { metricChart, seriesOf } from "./charts.js";
import { clear, el, fmtBytes, fmtDuration, fmtNumber, fmtTime, pager, statusBadge } from "./dom.js";

const REFRESH_MS = 5000;
const EPISODES_PAGE = 20;
const SORTS = [
  ["newest", "Newest"],
  ["oldest", "Oldest"],
  ["reward_desc", "Reward ↓"],
  ["reward_asc", "Reward ↑"],
];

function facts(run) {
  const pairs = [
    ["Run id", run.run_id],
    ["Kind", run.kind || run.run_type],
    ["Started", fmtTime(run.created_at || run.first_trace_created_at)],
    ["Duration", run.status ? fmtDuration(run.created_at || run.first_trace_created_at, run.finished_at) : "—"],
    ["Records", run.trace_count.toLocaleString()],
    ["Episodes", run.episode_count.toLocaleString()],
    ["Mean reward", fmtNumber(run.avg_reward)],
    ["Producer", run.first_user_id || "—"],
  ];
  if (run.error) pairs.push(["Error", run.error]);
  const list = el("dl", { class: "facts" });
  for (const [k, v] of pairs) list.append(el("dt", { text: k }), el("dd", { text: v }));
  return list;
}

function jsonBlock(title, value) {
  const empty = !value || (typeof value === "object" && !Object.keys(value).length);
  return el(
    "details",
    { open: !empty },
    el("summary", { text: title }),
    el("pre", { text: empty ? "(none)" : JSON.stringify(value, null, 2) }),
  );
}

async function episodes(section, runId, ctx) {
  const state = { sort: "newest", cursor: null, next: null, stack: [] };
  async function load() {
    const page = await getJSON(`/_viewer/runs/${seg(runId)}/episodes`, {
      sort: state.sort,
      cursor: state.cursor,
      limit: EPISODES_PAGE,
    });
    if (!ctx.alive()) return;
    state.next = page.next_cursor;
    const sorts = el("div", { class: "toolbar" }, el("span", { class: "muted", text: "Sort:" }));
    for (const [value, label] of SORTS) {
      const button = el("button", { class: value === state.sort ? "active" : null, text: label, dataset: { sort: value } });
      button.addEventListener("click", () => {
        Object.assign(state, { sort: value, cursor: null, next: null, stack: [] });
        load();
      });
      sorts.append(button);
    }
    const head = el(
      "tr",
      {},
      ...["Episode", "Created", "Reward", "Traces", "Tokens", "Bytes", "Outcome", "Error"].map((h) =>
        el("th", { class: ["Reward", "Traces", "Tokens", "Bytes"].includes(h) ? "num" : null, text: h }),
      ),
    );
    const rows = page.items.map((e) =>
      el(
        "tr",
        { dataset: { episodeId: e.episode_id } },
        el("td", { class: "name" }, el("a", { href: "#/episode/" + seg(e.episode_id), text: e.episode_id })),
        el("td", { text: fmtTime(e.created_at) }),
        el("td", { class: "num reward", text: fmtNumber(e.reward) }),
        el("td", { class: "num", text: e.trace_count }),
        el("td", { class: "num", text: e.total_tokens.toLocaleString() }),
        el("td", { class: "num", text: fmtBytes(e.bytes) }),
        el("td", { text: e.outcome || "—" }),
        el("td", { class: e.has_error ? "error" : "muted", text: e.has_error ? "error" : "—" }),
      ),
    );
    clear(section).append(
      el("h2", { text: "Episodes" }),
      sorts,
      rows.length
        ? el("table", { id: "episodes" }, el("thead", {}, head), el("tbody", {}, ...rows))
        : el("p", { class: "muted", text: "No episodes." }),
      pager(state, load),
    );
  }
  await load();
}

async function charts(section, runId, ctx) {
  const rows = await getAll(`/runs/${seg(runId)}/metrics`, { limit: 10000 }, "rows");
  if (!ctx.alive()) return null;
  const series = seriesOf(rows);
  const names = Object.keys(series).sort();
  let weight = 0;
  const smoothing = el("select", { name: "smoothing", "aria-label": "smoothing" });
  for (const w of [0, 0.6, 0.9, 0.99]) smoothing.append(el("option", { value: w, text: w ? `smoothing ${w}` : "no smoothing" }));
  const grid = el("div", { class: "charts" });
  clear(section).append(
    el("h2", { text: "Metrics" }),
    names.length
      ? el("div", { class: "toolbar" }, smoothing, el("span", { class: "muted", text: "drag to zoom, double-click to reset; red marks are NaN or infinite values" }))
      : el("p", { class: "muted", text: "No metrics logged." }),
    grid,
  );
  const made = names.map((name) => metricChart(name, series[name], weight, grid));
  smoothing.addEventListener("change", () => {
    weight = Number(smoothing.value);
    made.forEach((c) => c.update(weight, false));
  });
  let lastStep = rows.reduce((m, r) => (r.step !== null && r.step > m ? r.step : m), -Infinity);
  // New rows while the run is running: appended to the charts that exist (a new metric needs a reload).
  return async () => {
    const params = { limit: 10000, min_step: Number.isFinite(lastStep) ? lastStep + 1 : null };
    const more = await getAll(`/runs/${seg(runId)}/metrics`, params, "rows");
    if (!more.length || !ctx.alive()) return;
    seriesOf(more, series);
    lastStep = more.reduce((m, r) => (r.step !== null && r.step > m ? r.step : m), lastStep);
    made.forEach((c) => c.update(weight, true));
  };
}

export async function runPage(main, runId, ctx) {
  const run = await getJSON(`/runs/${seg(runId)}`);
  if (!ctx.alive()) return;
  ctx.crumbs(el("a", { href: "#/", text: "Runs" }), " / ", run.name || run.run_id);
  const status = el("span", {}, statusBadge(run.status));
  const chartSection = el("section", { id: "metrics" });
  const episodeSection = el("section", { id: "run-episodes" });
  clear(main).append(
    el("h1", {}, run.name || run.run_id, " ", status),
    facts(run),
    el("div", { class: "blocks" }, jsonBlock("Config", run.config), jsonBlock("Summary", run.summary)),
    chartSection,
    episodeSection,
  );
  const [refresh] = await Promise.all([charts(chartSection, runId, ctx), episodes(episodeSection, runId, ctx)]);
  const poll = async () => {
    if (!ctx.alive()) return;
    const now = await getJSON(`/runs/${seg(runId)}`);
    if (!ctx.alive()) return;
    clear(status).append(statusBadge(now.status));
    if (refresh) await refresh();
    if (now.status === "running") setTimeout(() => poll().catch(() => {}), REFRESH_MS);
  };
  if (run.status === "running") setTimeout(() => poll().catch(() => {}), REFRESH_MS);
}

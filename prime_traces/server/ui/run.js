// A run: status, config, summary (and what the platform's routes were told), one chart per metric, its episodes (sortable, paged).
import { getJSON, seg } from "./api.js";
import { metricsSection } from "./charts.js";
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

export async function runPage(main, runId, ctx) {
  const run = await getJSON(`/runs/${seg(runId)}`);
  if (!ctx.alive()) return;
  ctx.crumbs(el("a", { href: "#/", text: "Runs" }), " / ", run.name || run.run_id);
  const status = el("span", {}, statusBadge(run.status));
  const stale = el("span", { class: "error refresh-error", hidden: true });
  const chartSection = el("section", { id: "metrics" });
  const episodeSection = el("section", { id: "run-episodes" });
  clear(main).append(
    el("h1", {}, run.name || run.run_id, " ", status, " ", stale),
    facts(run),
    el(
      "div",
      { class: "blocks" },
      jsonBlock("Config", run.config),
      jsonBlock("Summary", run.summary),
      // What the platform's run routes were told (environments, model, team): runs created through them only.
      ...(run.platform ? [jsonBlock("Platform", run.platform)] : []),
    ),
    chartSection,
    episodeSection,
  );
  const [refresh] = await Promise.all([metricsSection(chartSection, runId, ctx), episodes(episodeSection, runId, ctx)]);
  // While the run is running: its status, and new metric rows, every REFRESH_MS.
  const poll = async () => {
    if (!ctx.alive()) return;
    let running = true;
    try {
      const now = await getJSON(`/runs/${seg(runId)}`);
      if (!ctx.alive()) return;
      clear(status).append(statusBadge(now.status));
      running = now.status === "running";
      if (refresh) await refresh();
      stale.hidden = true;
    } catch (err) {
      // The service restarting, say: said on the page, and tried again at the next tick.
      stale.textContent = `refresh failed (${err.message}); trying again`;
      stale.hidden = false;
    }
    if (running && ctx.alive()) setTimeout(poll, REFRESH_MS);
  };
  if (run.status === "running") setTimeout(poll, REFRESH_MS);
}

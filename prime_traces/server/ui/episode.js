// An episode: its traces as a conversation, loaded and drawn lazily so that a
// many-megabyte episode opens at once. A trace's document is fetched when its
// section nears the viewport, and its messages are added in chunks as the
// reader scrolls; nothing is ever put on the page as HTML.
import { download, getAll, getJSON, request, seg } from "./api.js";
import { clear, el, fmtBytes, fmtNumber, fmtTime } from "./dom.js";

const CHUNK_MESSAGES = 25;
const LONG_TEXT_CHARS = 20000;
const RAW_CHUNK_CHARS = 200000;
const NEAR = "1200px 0px";
let firstMessageMarked = false;

function textOf(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => (part && typeof part.text === "string" ? part.text : `[${(part && part.type) || "part"}] ${JSON.stringify(part)}`))
      .join("\n");
  }
  return JSON.stringify(content, null, 2);
}

// Long text shows its start, and the rest on request: one huge text node would stall layout.
function longText(cls, text) {
  const node = el("div", { class: cls });
  if (text.length <= LONG_TEXT_CHARS) {
    node.textContent = text;
    return node;
  }
  node.textContent = text.slice(0, LONG_TEXT_CHARS);
  const more = el("button", { class: "link", text: `… show all ${text.length.toLocaleString()} characters` });
  more.addEventListener("click", () => {
    node.textContent = text;
  });
  return el("div", {}, node, more);
}

function prettyArguments(args) {
  if (typeof args !== "string") return JSON.stringify(args, null, 2);
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch (err) {
    return args;
  }
}

function toolCall(call) {
  const fn = (call && call.function) || call || {};
  const name = fn.name || call.name || "tool";
  return el(
    "details",
    { class: "tool-call" },
    el("summary", { text: `tool call: ${name}` + (call && call.id ? ` (${call.id})` : "") }),
    longText("content", prettyArguments(fn.arguments ?? call.arguments ?? call.input ?? call)),
  );
}

function message(node, index) {
  const msg = (node && node.message) || {};
  const role = typeof msg.role === "string" ? msg.role : "unknown";
  const box = el("div", { class: "msg role-" + role.replace(/[^a-z0-9_-]/gi, ""), dataset: { role, index: String(index) } });
  const label = role + (msg.name ? ` · ${msg.name}` : "") + (node && node.sampled ? " · sampled" : "");
  box.append(el("div", { class: "role", text: label }));
  const text = textOf(msg.content);
  if (role === "tool") {
    const what = msg.tool_name || msg.name || "tool";
    box.append(
      el(
        "details",
        { class: "tool-result" },
        el("summary", { text: `tool result: ${what}` + (msg.tool_call_id ? ` (${msg.tool_call_id})` : "") }),
        longText("content", text),
      ),
    );
    return box;
  }
  if (msg.reasoning_content) {
    box.append(el("details", { class: "reasoning" }, el("summary", { text: "reasoning" }), longText("content", textOf(msg.reasoning_content))));
  }
  if (text) box.append(longText("content", text));
  for (const call of Array.isArray(msg.tool_calls) ? msg.tool_calls : []) box.append(toolCall(call));
  return box;
}

// Appends a lazily drawn list: CHUNK_MESSAGES now, the next chunk when its sentinel nears the viewport.
function drawMessages(container, nodes) {
  let at = 0;
  const sentinel = el("div", { class: "sentinel" });
  const observer = new IntersectionObserver((entries) => entries.some((e) => e.isIntersecting) && next(), { rootMargin: NEAR });
  function next() {
    const end = Math.min(nodes.length, at + CHUNK_MESSAGES);
    const chunk = document.createDocumentFragment();
    for (; at < end; at += 1) chunk.append(message(nodes[at], at));
    container.insertBefore(chunk, sentinel);
    if (!firstMessageMarked && nodes.length) {
      firstMessageMarked = true;
      performance.mark("prime-traces:first-message");
    }
    if (at >= nodes.length) {
      observer.disconnect();
      sentinel.remove();
      container.dataset.complete = "true";
    }
  }
  container.append(sentinel);
  if (!nodes.length) container.append(el("p", { class: "muted", text: "No messages." }));
  next();
  if (sentinel.isConnected) observer.observe(sentinel);
}

function rawView(text) {
  const pre = el("pre", { class: "raw" });
  let at = 0;
  const more = el("button", { class: "link" });
  function next() {
    pre.append(document.createTextNode(text.slice(at, at + RAW_CHUNK_CHARS)));
    at += RAW_CHUNK_CHARS;
    more.hidden = at >= text.length;
    more.textContent = `show more (${(text.length - Math.min(at, text.length)).toLocaleString()} characters left)`;
  }
  more.addEventListener("click", next);
  next();
  return el("div", {}, pre, more);
}

function traceSection(summary, index, ctx) {
  const id = summary.trace_id;
  const messages = el("div", { class: "messages" }, el("p", { class: "muted", text: "Loading…" }));
  // Unloaded traces keep their room, so that only those near the viewport are fetched.
  messages.style.minHeight = "80vh";
  const raw = el("details", { class: "raw-json" }, el("summary", { text: "raw JSON" }));
  const save = el("button", { class: "link", text: "download" });
  save.addEventListener("click", () => download(`/traces/${seg(id)}`, { raw: true }, `${id}.json`));
  const head = el(
    "div",
    { class: "trace-head" },
    el("span", { class: "title", text: `Trace ${index + 1}: ${id}` }),
    el("span", { text: summary.agent_name ? `agent ${summary.agent_name}` : "" }),
    el("span", { text: summary.model.id ? `model ${summary.model.id}` : "" }),
    el("span", { class: "reward", text: `reward ${fmtNumber(summary.score.reward)}` }),
    el("span", { class: "tokens", text: `${summary.total_tokens.toLocaleString()} tokens` }),
    el("span", { class: "muted", text: `${(summary.duration_ms / 1000).toFixed(1)} s · ${fmtBytes(summary.size_bytes)}` }),
    save,
  );
  const section = el("section", { class: "trace", dataset: { traceId: id } }, head, raw, messages);
  let loaded = null;
  function load() {
    loaded ||= request(`/traces/${seg(id)}`, { raw: true })
      .then((resp) => resp.text())
      .then((text) => {
        if (!ctx.alive()) return;
        const doc = JSON.parse(text);
        clear(messages);
        messages.style.minHeight = "";
        drawMessages(messages, Array.isArray(doc.nodes) ? doc.nodes : []);
        const showRaw = () => raw.open && raw.childElementCount === 1 && raw.append(rawView(text));
        raw.addEventListener("toggle", showRaw);
        showRaw(); // opened while the document was still on its way
      })
      .catch((err) => ctx.alive() && clear(messages).append(el("p", { class: "error", text: "Could not load: " + err.message })));
    return loaded;
  }
  return { section, load };
}

export async function episodePage(main, episodeId, ctx) {
  const [detail, summaries] = await Promise.all([
    getJSON(`/episodes/${seg(episodeId)}`),
    getAll(`/episodes/${seg(episodeId)}/traces`, { limit: 100 }),
  ]);
  if (!ctx.alive()) return;
  firstMessageMarked = false;
  // The list is newest first; a conversation reads oldest first.
  summaries.reverse();
  const crumbs = [el("a", { href: "#/", text: "Runs" }), " / "];
  if (detail.run_id) crumbs.push(el("a", { href: "#/run/" + seg(detail.run_id), text: detail.run_id }), " / ");
  ctx.crumbs(...crumbs, episodeId);
  const agg = detail.traces;
  const facts = el("dl", { class: "facts" });
  for (const [k, v] of [
    ["Created", fmtTime(detail.created_at)],
    ["Environment", detail.environment_id || "—"],
    ["Outcome", detail.outcome || "—"],
    ["Traces", agg.trace_count],
    ["Tokens", agg.total_tokens.toLocaleString()],
    ["Error", detail.has_error ? `${detail.error.type || "error"}: ${detail.error.message || ""}` : "—"],
  ]) {
    facts.append(el("dt", { text: k }), el("dd", { text: v }));
  }
  const save = el("button", { text: "Download episode envelope" });
  save.addEventListener("click", () => download(`/episodes/${seg(episodeId)}`, { raw: true }, `${episodeId}.json`));
  const list = el("div", { id: "traces" });
  clear(main).append(el("h1", { text: `Episode ${episodeId}` }), facts, el("div", { class: "toolbar" }, save), list);
  const sections = summaries.map((s, i) => traceSection(s, i, ctx));
  const observer = new IntersectionObserver(
    (entries) => {
      for (const entry of entries) {
        if (!entry.isIntersecting) continue;
        observer.unobserve(entry.target);
        sections.find((s) => s.section === entry.target)?.load();
      }
    },
    { rootMargin: NEAR },
  );
  for (const s of sections) {
    list.append(s.section);
    observer.observe(s.section);
  }
  if (!sections.length) list.append(el("p", { class: "muted", text: "This episode has no traces." }));
  else await sections[0].load();
}

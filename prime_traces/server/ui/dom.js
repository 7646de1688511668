// DOM helpers. Record content only ever becomes text (textContent), never markup.

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export function fmtDuration(startIso, endIso) {
  if (!startIso) return "—";
  const end = endIso ? new Date(endIso) : new Date();
  let s = Math.max(0, Math.round((end - new Date(startIso)) / 1000));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  s %= 60;
  return h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
}

export function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

export function fmtNumber(v, digits = 4) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  return Number.isInteger(v) ? v.toLocaleString() : v.toPrecision(digits);
}

export function statusBadge(status) {
  return el("span", { class: "status status-" + (status || "unknown"), text: status || "unknown" });
}

// A pager over keyset cursors: the cursors of the pages before this one are a stack.
export function pager(state, onChange) {
  const prev = el("button", { text: "← Newer", disabled: state.stack.length === 0 });
  const next = el("button", { text: "Older →", disabled: !state.next });
  prev.addEventListener("click", () => {
    state.cursor = state.stack.pop() || null;
    onChange();
  });
  next.addEventListener("click", () => {
    state.stack.push(state.cursor);
    state.cursor = state.next;
    onChange();
  });
  return el("div", { class: "pager" }, prev, next);
}

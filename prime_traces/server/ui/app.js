// The viewer's router: #/ (runs), #/run/<id>, #/episode/<id>; and the key form.
import { Unauthorized, forgetKey, hasKey, setKey } from "./api.js";
import { clear, el } from "./dom.js";
import { episodePage } from "./episode.js";
import { runPage } from "./run.js";
import { runsPage } from "./runs.js";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const forget = document.getElementById("forget-key");
let generation = 0;

function keyForm(retry) {
  const input = el("input", { type: "password", name: "key", autocomplete: "off", "aria-label": "API key" });
  const form = el(
    "form",
    { class: "keyform" },
    el("h1", { text: "API key" }),
    el("p", { text: "This service was started with --api-key. The key stays in this tab and is sent only in the Authorization header." }),
    input,
    el("button", { type: "submit", text: "Open" }),
  );
  if (hasKey()) form.append(el("p", { class: "error", text: "That key was refused." }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!input.value) return;
    setKey(input.value);
    retry();
  });
  clear(main).append(form);
  input.focus();
}

async function route() {
  const mine = ++generation;
  const ctx = { alive: () => mine === generation, crumbs: (...parts) => clear(crumbs).append(...parts) };
  forget.hidden = !hasKey();
  const hash = location.hash.replace(/^#/, "") || "/";
  const [, page, ...rest] = hash.split("/");
  const id = rest.length ? decodeURIComponent(rest.join("/")) : null;
  clear(crumbs);
  try {
    if (page === "run" && id) await runPage(main, id, ctx);
    else if (page === "episode" && id) await episodePage(main, id, ctx);
    else await runsPage(main, ctx);
  } catch (err) {
    if (!ctx.alive()) return;
    if (err instanceof Unauthorized) keyForm(route);
    else clear(main).append(el("p", { class: "error", text: "Could not load: " + err.message }));
  }
}

forget.addEventListener("click", () => {
  forgetKey();
  route();
});
window.addEventListener("hashchange", route);
route();

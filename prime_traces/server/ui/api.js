// Requests to this service's read API. The key (when the service has one) lives in
// this tab's sessionStorage and travels only in the Authorization header.
const KEY_ITEM = "prime-traces-viewer-key";
// A service started without --api-key takes any bearer token; this one is a placeholder, not a secret.
const NO_KEY = "viewer";

export class Unauthorized extends Error {}

export function hasKey() {
  return sessionStorage.getItem(KEY_ITEM) !== null;
}

export function setKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

export function seg(id) {
  return encodeURIComponent(id).replace(/\./g, "%2E");
}

function apiUrl(path, params) {
  const url = new URL("/api/v1" + path, location.origin);
  for (const [name, value] of Object.entries(params || {})) {
    if (value === null || value === undefined || value === "") continue;
    for (const one of Array.isArray(value) ? value : [value]) url.searchParams.append(name, String(one));
  }
  return url;
}

export async function request(path, params) {
  const headers = { Authorization: "Bearer " + (sessionStorage.getItem(KEY_ITEM) || NO_KEY) };
  const resp = await fetch(apiUrl(path, params), { headers, cache: "no-store", credentials: "omit" });
  if (resp.status === 401) throw new Unauthorized("this service needs an API key");
  if (!resp.ok) {
    let message = "HTTP " + resp.status;
    try {
      message = (await resp.json()).error.message || message;
    } catch (err) {
      // not the error envelope: keep the status
    }
    throw new Error(message);
  }
  return resp;
}

export async function getJSON(path, params) {
  return (await request(path, params)).json();
}

// Every item of a paged list, following next_cursor.
export async function getAll(path, params, key = "items") {
  const items = [];
  let cursor = null;
  do {
    const page = await getJSON(path, { ...params, cursor });
    items.push(...page[key]);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

// Save what `path` answers as a file: fetched with the header, handed over as a blob URL.
export async function download(path, params, filename) {
  const blob = await (await request(path, params)).blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

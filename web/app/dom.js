// Building DOM nodes without HTML strings: every text a user or a plugin wrote goes in as
// text, never as markup.

/**
 * `h("button", {class: "x", onclick: f, "aria-label": "Send"}, "Send")`: an element with
 * attributes (`on…` functions become listeners, `false`/`null`/`undefined` are left out)
 * and children (strings become text nodes; arrays are flattened; null is skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === false || value === null || value === undefined) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}

/** "14:05", or "3 Dec 14:05" for another day. */
export function time(ms) {
  const d = new Date(ms);
  const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return d.toDateString() === new Date().toDateString()
    ? hm
    : `${d.toLocaleDateString([], { day: "numeric", month: "short" })} ${hm}`;
}

/** "1.2 MB" */
export function bytes(n) {
  if (!Number.isFinite(n)) return "";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i++;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/** A human sentence for an SDK or server error: its message, then its code. */
export function describe(err) {
  if (!err) return "unknown error";
  const code = err.code && err.code !== "http_error" ? ` (${err.code})` : "";
  return `${err.message ?? String(err)}${code}`;
}

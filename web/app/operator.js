// The operator page: the plugins of GET /admin/plugins, their switches and a reload. The
// admin token stays in this tab (sessionStorage) and goes only to this server.

import { $, fill, h } from "./dom.js";

const TOKEN_KEY = "courier.adminToken";

async function admin(method, path) {
  const token = sessionStorage.getItem(TOKEN_KEY) ?? "";
  const response = await fetch(path, { method, headers: { authorization: `Bearer ${token}` } });
  let body;
  try {
    body = await response.json();
  } catch {
    body = undefined;
  }
  if (!response.ok) {
    const error = new Error(body?.error?.message ?? `HTTP ${response.status}`);
    error.code = body?.error?.code;
    error.status = response.status;
    throw error;
  }
  return body;
}

function showError(err) {
  const code = err.code ? ` (${err.code})` : "";
  $("#op-error").textContent = `${err.message}${code}`;
  if (err.status === 401) $("#admin-token").focus();
}

async function refresh() {
  $("#op-error").textContent = "";
  try {
    const { plugins } = await admin("GET", "/admin/plugins");
    render(plugins);
    $("#plugins-section").hidden = false;
  } catch (err) {
    $("#plugins-section").hidden = true;
    showError(err);
  }
}

function render(plugins) {
  fill(
    $("#plugins"),
    plugins.map((p) =>
      h(
        "tr",
        { dataset: { plugin: p.name } },
        h("th", { scope: "row" }, p.name, h("div", { class: "muted small" }, `${p.version} · ${p.description}`)),
        h("td", { class: "num" }, String(p.contentType)),
        h("td", {}, p.delivery),
        h("td", {}, p.countsUnread ? "yes" : "no"),
        h("td", { class: p.enabled ? "state-on" : "state-off", "data-cell": "state" }, p.enabled ? "enabled" : "disabled"),
        h("td", { class: p.tripped ? "tripped" : "", "data-cell": "breaker" }, p.tripped ? `tripped: ${p.tripped}` : "closed"),
        h("td", { class: "num" }, String(p.stats.calls)),
        h("td", { class: "num" }, String(p.stats.accepted)),
        h("td", { class: "num" }, String(p.stats.rejected)),
        h("td", { class: "num", "data-cell": "failed" }, String(p.stats.failed)),
        h("td", { class: "small" }, p.source),
        h(
          "td",
          {},
          p.enabled
            ? h("button", { class: "secondary", onclick: () => toggle(p.name, false), "aria-label": `Disable ${p.name}` }, "Disable")
            : h("button", { onclick: () => toggle(p.name, true), "aria-label": `Enable ${p.name}` }, "Enable"),
        ),
      ),
    ),
  );
}

/** What an action did (a status), or why it failed (an alert, in `#op-error`). */
function result(text, bad = false) {
  $("#result").textContent = bad ? "" : text;
  $("#op-error").textContent = bad ? text : "";
}

async function toggle(name, on) {
  try {
    const { plugin } = await admin("POST", `/admin/plugins/${encodeURIComponent(name)}/${on ? "enable" : "disable"}`);
    result(`${plugin.name} is ${plugin.enabled ? "enabled" : "disabled"}`);
    await refresh();
  } catch (err) {
    result(`${on ? "Enable" : "Disable"} ${name} failed: ${err.message}${err.code ? ` (${err.code})` : ""}`, true);
  }
}

async function reload() {
  const button = $("#reload");
  button.disabled = true;
  result("Reloading…");
  try {
    const { plugins } = await admin("POST", "/admin/plugins/reload");
    result(`Reloaded: ${plugins.length} plugins loaded (${plugins.map((p) => p.name).join(", ")})`);
    render(plugins);
  } catch (err) {
    // The server's words, one problem per line.
    result(`Reload refused${err.code ? ` (${err.code})` : ""}:\n${err.message}`, true);
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const token = sessionStorage.getItem(TOKEN_KEY);
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#admin-token").value);
    $("#admin-token").value = "";
    void refresh();
  });
  $("#forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("#plugins-section").hidden = true;
    result("");
  });
  $("#refresh").addEventListener("click", () => void refresh());
  $("#reload").addEventListener("click", () => void reload());
  if (token) void refresh();
  else $("#admin-token").focus();
});

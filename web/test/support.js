// What every browser test shares: a real `courier serve` (SQLite in a temp dir, loopback,
// a port the server picks), Debian's Chromium driven by playwright-core, and helpers that
// act as a user would (fill the form, press the button) and wait for what the page shows.
// Waits are on observable conditions; their deadlines are only a safety net.

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync, copyFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, "../..");
export const ADMIN_TOKEN = "web-test-admin-token";
/** The longest any one condition may take on a busy 2-core machine. */
export const DEADLINE = 60_000;

export function courierBin() {
  return process.env.COURIER_BIN || path.join(REPO, "target/release/courier");
}

export function artifactsDir() {
  const dir = process.env.COURIER_ARTIFACTS_DIR || path.join(REPO, "target/web-screenshots");
  mkdirSync(dir, { recursive: true });
  return dir;
}

/**
 * Starts `courier serve` with a config of its own; `extra` is appended to it (whole
 * sections). Resolves once `/healthz` answers.
 */
export async function startServer({ extra = "", runtime = "" } = {}) {
  const bin = courierBin();
  if (!existsSync(bin)) throw new Error(`no server binary at ${bin}: build it or set COURIER_BIN`);
  const dir = mkdtempSync(path.join(tmpdir(), "courier-web-"));
  const configPath = path.join(dir, "courier.toml");
  const config = [
    "[server]",
    `listen = "127.0.0.1:0"`,
    `admin_token = "${ADMIN_TOKEN}"`,
    "[storage]",
    `url = "sqlite://${path.join(dir, "c.db")}"`,
    `sqlite_synchronous = "normal"`,
    "[runtime]",
    `cache_dir = ""`,
    runtime,
    "[auth]",
    "attempts_per_minute_per_address = 0",
    "failed_logins_per_hour_per_account = 0",
    "[gateway]",
    "send_rate_per_sec = 100000",
    "send_burst = 100000",
    extra,
    "",
  ].join("\n");
  writeFileSync(configPath, config);
  const env = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!(key.startsWith("COURIER_") && key.includes("__"))) env[key] = value;
  }
  const child = spawn(bin, ["serve", "-c", configPath], { env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const record = (chunk) => {
    output = (output + chunk.toString()).slice(-20_000);
  };
  child.stderr.on("data", record);
  const cleanUp = () => {
    child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  process.once("exit", cleanUp);
  const address = await new Promise((resolve, reject) => {
    let stdout = "";
    const timer = setTimeout(() => reject(new Error(`the server did not start in 120 s:\n${output}`)), 120_000);
    child.stdout.on("data", (chunk) => {
      record(chunk);
      stdout += chunk.toString();
      const match = /listening on (\S+)/.exec(stdout);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before listening:\n${output}`));
    });
  });
  const url = `http://${address}`;
  for (let attempt = 0; ; attempt++) {
    try {
      if ((await fetch(`${url}/healthz`)).ok) break;
    } catch {
      // not yet
    }
    if (attempt > 1200) throw new Error(`${url}/healthz never answered:\n${output}`);
    await new Promise((r) => setTimeout(r, 50)); // polling /healthz: the only way to know
  }
  return {
    url,
    configPath,
    config,
    /** Registers a user over HTTP (password `password-<id>`); its token. */
    async register(userId) {
      const r = await fetch(`${url}/v1/auth/register`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ userId, password: `password-${userId}` }),
      });
      const body = await r.json();
      if (r.status !== 201) throw new Error(`register ${userId}: ${r.status} ${JSON.stringify(body)}`);
      return body.token;
    },
    /** A request with a user's token; the JSON answer (throws on an error status). */
    async api(token, method, apiPath, body) {
      const r = await fetch(url + apiPath, {
        method,
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const json = await r.json();
      if (!r.ok) throw new Error(`${method} ${apiPath}: ${r.status} ${JSON.stringify(json)}`);
      return json;
    },
    async stop() {
      process.off("exit", cleanUp);
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
    log: () => output,
  };
}

export async function launchBrowser() {
  const executablePath = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
  const args = ["--disable-dev-shm-usage"];
  if (process.getuid?.() === 0) args.push("--no-sandbox");
  return chromium.launch({ executablePath, headless: true, args });
}

/** A browser context of its own (its own storage: one person's browser) and a page. */
export async function newPerson(browser, server, viewport = { width: 1100, height: 760 }) {
  const context = await browser.newContext({ viewport, baseURL: server.url });
  context.setDefaultTimeout(DEADLINE);
  // Nothing leaves the machine (image messages name https URLs): only the server answers.
  const origin = new URL(server.url).origin;
  await context.route(
    (url) => url.origin !== origin,
    (route) => route.abort(),
  );
  const page = await context.newPage();
  watchErrors(page);
  return { context, page };
}

/** A test file's server (started with `options`) and browser. */
export async function startSession(options = {}) {
  const server = await startServer(options);
  const browser = await launchBrowser();
  return { server, browser };
}

/** Stops what `startSession` started; the file fails on any script error its pages raised. */
export async function endSession({ server, browser }) {
  await browser?.close();
  await server?.stop();
  assert.deepEqual(pageErrors, [], "script errors in the pages");
}

/** Script errors of a page fail the test that caused them (collected, checked at the end). */
export const pageErrors = [];
export function watchErrors(page) {
  page.on("pageerror", (err) => pageErrors.push(`${page.url()}: ${err.stack ?? err}`));
}

/** Registers (or logs in) through the form and waits until the client is online. */
export async function signIn(page, userId, { register = true } = {}) {
  await page.goto("/");
  await page.getByLabel("User id", { exact: true }).fill(userId);
  await page.getByLabel("Password", { exact: true }).fill(`password-${userId}`);
  await page.getByRole("button", { name: register ? "Create account" : "Log in" }).click();
  await waitOnline(page);
}

export async function waitOnline(page) {
  await page.locator('#conn[data-state="online"]').waitFor();
}

/** Opens (or starts) the private chat with `peer` through the "Chat with" box. */
export async function chatWith(page, peer) {
  await page.getByLabel("Chat with").fill(peer);
  await page.getByRole("button", { name: "Open", exact: true }).click();
  await page.locator("#chat-title", { hasText: peer }).waitFor();
}

/** Opens a conversation of the list by its title. */
export async function openConversation(page, title) {
  await conversationItem(page, title).locator("button").click();
  await page.locator("#chat-title", { hasText: title }).waitFor();
}

export function conversationItem(page, title) {
  return page.locator("#conversations li").filter({ has: page.locator(".conversation-title", { hasText: title }) });
}

/** Types a message and sends it with Enter; waits until it is stored (no longer pending). */
export async function send(page, text) {
  const box = page.getByLabel("Message", { exact: true });
  await box.fill(text);
  await box.press("Enter");
  await sentMessage(page, text).waitFor();
}

/** My stored message with this text (it has a seq once acked). */
export function sentMessage(page, text) {
  return page.locator("#message-list li.msg.mine[data-seq]").filter({ has: page.locator(".bubble", { hasText: text }) });
}

/** The texts of the text messages on screen, in order. */
export async function texts(page) {
  return page.locator("#message-list li.msg .bubble .text").allTextContents();
}

/** Waits until `fn` (run in the page) is true; `arg` is passed to it. */
export async function until(page, fn, arg) {
  await page.waitForFunction(fn, arg, { timeout: DEADLINE, polling: 100 });
}

export async function screenshot(page, name, { fullPage = false } = {}) {
  const file = path.join(artifactsDir(), `${name}.png`);
  await page.screenshot({ path: file, fullPage });
  return file;
}

/**
 * The third-party kind: the `courier plugin new` template (content type 1000, preview
 * `[note] <title>`), built as its author would. `COURIER_TEST_KIND_WASM` names one built
 * already (tests/web_client.rs builds it); else it is made here.
 */
export function thirdPartyKind() {
  const dir = mkdtempSync(path.join(tmpdir(), "courier-web-kind-"));
  const wanted = process.env.COURIER_TEST_KIND_WASM;
  const pluginDir = path.join(dir, "plugins");
  mkdirSync(pluginDir);
  if (wanted) {
    copyFileSync(wanted, path.join(pluginDir, "note.wasm"));
    return pluginDir;
  }
  const kind = path.join(dir, "note");
  const made = spawnSync(courierBin(), ["plugin", "new", "note", "--lang", "rust", "--dir", kind], { encoding: "utf8" });
  if (made.status !== 0) throw new Error(`courier plugin new: ${made.error ?? ""}${made.stdout}${made.stderr}`);
  const env = { ...process.env, CARGO_TARGET_DIR: process.env.COURIER_KIND_TARGET || path.join(tmpdir(), "courier-web-kind-target") };
  const built = spawnSync("bash", [path.join(kind, "build.sh")], { cwd: kind, env, encoding: "utf8" });
  if (built.status !== 0) throw new Error(`build.sh: ${built.error ?? ""}${built.stdout}${built.stderr}`);
  copyFileSync(path.join(kind, "build/note.wasm"), path.join(pluginDir, "note.wasm"));
  return pluginDir;
}

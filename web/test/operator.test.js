// The operator page: the plugins with their state and counters; a kind switched off there
// makes the client show the server's refusal, and back on lets the same message through;
// a reload's outcome is shown as the server words it, refusal included.

import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import {
  ADMIN_TOKEN,
  chatWith,
  launchBrowser,
  newPerson,
  pageErrors,
  screenshot,
  sentMessage,
  signIn,
  startServer,
} from "./support.js";

let server;
let browser;

before(async () => {
  server = await startServer();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
  assert.deepEqual(pageErrors, [], "script errors in the pages");
});

test("an operator disables a kind, the client shows the refusal; reloads are reported", async () => {
  const op = await newPerson(browser, server, { width: 1280, height: 800 });
  const alice = await newPerson(browser, server);
  await server.register("bob");
  await signIn(alice.page, "alice");
  await chatWith(alice.page, "bob");

  // A wrong token is refused, in words.
  await op.page.goto("/operator");
  await op.page.getByLabel(/Admin token/).fill("not-the-token");
  await op.page.getByRole("button", { name: "Show plugins" }).click();
  await op.page.locator("#op-error", { hasText: "unauthorized" }).waitFor();

  await op.page.getByLabel(/Admin token/).fill(ADMIN_TOKEN);
  await op.page.getByRole("button", { name: "Show plugins" }).click();
  const text = op.page.locator('tr[data-plugin="text"]');
  await text.waitFor();
  const cells = await text.locator("td").allTextContents();
  assert.deepEqual(cells.slice(0, 5), ["1", "persistent", "yes", "enabled", "closed"]);
  await op.page.locator('tr[data-plugin="typing"] td', { hasText: "latest" }).waitFor();
  assert.equal(await op.page.locator("#plugins tr").count() >= 10, true);

  // Switched off: the client's send is refused with the server's code and message.
  await op.page.getByRole("button", { name: "Disable text" }).click();
  await text.locator('[data-cell="state"]', { hasText: "disabled" }).waitFor();
  await op.page.locator("#result", { hasText: "text is disabled" }).waitFor();
  await screenshot(op.page, "operator", { fullPage: true });

  const box = alice.page.getByLabel("Message", { exact: true });
  await box.fill("Is anyone there?");
  await box.press("Enter");
  const alert = alice.page.getByRole("alert").filter({ hasText: "content_type_disabled" });
  await alert.waitFor();
  assert.match(await alert.textContent(), /^Not sent: .*disabled.*\(content_type_disabled\)$/);
  await alice.page.locator("#message-list li.failed", { hasText: "Is anyone there?" }).waitFor();
  await screenshot(alice.page, "send-refused");

  // Back on: the same message goes through with Retry.
  await op.page.getByRole("button", { name: "Enable text" }).click();
  await text.locator('[data-cell="state"]', { hasText: "enabled" }).waitFor();
  await alice.page.getByRole("button", { name: "Retry" }).click();
  await sentMessage(alice.page, "Is anyone there?").waitFor();
  assert.equal(await alice.page.locator("#message-list li.failed").count(), 0);
  // The counters moved: one accepted call (the refused send never reached the plugin).
  await op.page.getByRole("button", { name: "Refresh" }).click();
  await text.locator("td.num").nth(2).filter({ hasText: /^1$/ }).waitFor();

  // A reload that works lists what it loaded; one the server refuses shows its words.
  await op.page.getByRole("button", { name: "Reload from config" }).click();
  await op.page.locator("#result", { hasText: /^Reloaded: \d+ plugins loaded/ }).waitFor();
  const config = readFileSync(server.configPath, "utf8");
  writeFileSync(server.configPath, config + "\n[nonsense]\nkey = 1\n");
  await op.page.getByRole("button", { name: "Reload from config" }).click();
  const refused = op.page.locator("#result", { hasText: "Reload refused (reload_refused)" });
  await refused.waitFor();
  assert.match(await refused.textContent(), /nonsense/);
  writeFileSync(server.configPath, config);
  await screenshot(op.page, "operator-reload-refused", { fullPage: true });

  await op.context.close();
  await alice.context.close();
});

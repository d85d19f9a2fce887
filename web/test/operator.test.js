// The operator page: the plugins with their state and counters; a kind switched off there
// makes the client show the server's refusal, and back on lets the same message through;
// a reload's outcome is shown as the server words it, refusal included.

import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import {
  ADMIN_TOKEN,
  chatWith,
  endSession,
  newPerson,
  screenshot,
  sentMessage,
  signIn,
  startSession,
} from "./support.js";

let server;
let browser;

// A plugin that traps (tests/fixtures/plugins/trap, built by tests/web_client.rs), so the
// page can show a tripped circuit breaker.
const trap = process.env.COURIER_TEST_TRAP_WASM;

before(async () => {
  ({ server, browser } = await startSession(
    trap ? { runtime: "breaker_failures = 3", extra: `[plugins.trap]\npath = "${trap}"\n` } : {},
  ));
});

after(() => endSession({ server, browser }));

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
  const refused = op.page.getByRole("alert").filter({ hasText: "Reload refused (reload_refused)" });
  await refused.waitFor();
  assert.match(await refused.textContent(), /nonsense/);
  writeFileSync(server.configPath, config);
  await screenshot(op.page, "operator-reload-refused", { fullPage: true });

  await op.context.close();
  await alice.context.close();
});

test("a plugin that keeps trapping shows its tripped breaker and reason; Enable resets it", async (t) => {
  if (!trap) {
    t.skip("COURIER_TEST_TRAP_WASM is not set (tests/web_client.rs builds the trap fixture)");
    return;
  }
  const token = await server.register("carol");
  await server.register("dave");
  for (let i = 0; i < 3; i++) {
    await server
      .api(token, "POST", "/v1/messages", {
        conversationType: 1,
        peerId: "dave",
        contentType: 9003,
        payload: { text: "boom" },
        clientMsgId: `trap-${i}`,
      })
      .then(
        () => assert.fail("a trapping plugin accepted a message"),
        (err) => assert.match(String(err), /plugin_failed/),
      );
  }
  const op = await newPerson(browser, server, { width: 1280, height: 800 });
  await op.page.goto("/operator");
  await op.page.getByLabel(/Admin token/).fill(ADMIN_TOKEN);
  await op.page.getByRole("button", { name: "Show plugins" }).click();
  const row = op.page.locator('tr[data-plugin="trap"]');
  await row.locator('[data-cell="state"]', { hasText: "disabled" }).waitFor();
  await row.locator('[data-cell="breaker"]', { hasText: /^tripped: 3 failures within 60 s, the last: trapped/ }).waitFor();
  await row.locator('[data-cell="failed"]', { hasText: /^3$/ }).waitFor();
  await screenshot(op.page, "operator-breaker", { fullPage: true });
  await op.page.getByRole("button", { name: "Enable trap" }).click();
  await row.locator('[data-cell="state"]', { hasText: "enabled" }).waitFor();
  await row.locator('[data-cell="breaker"]', { hasText: /^closed$/ }).waitFor();
  await op.context.close();
});

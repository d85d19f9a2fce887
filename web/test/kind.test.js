// A kind the client has never heard of — the template of `courier plugin new`, installed
// on the server as a third party would — shows through the preview its plugin gives: in
// the conversation list, when pushed into an open chat, and in history after a reload.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  conversationItem,
  endSession,
  newPerson,
  openConversation,
  signIn,
  startSession,
  thirdPartyKind,
  waitOnline,
} from "./support.js";

let server;
let browser;

before(async () => {
  const pluginDir = thirdPartyKind();
  ({ server, browser } = await startSession({ runtime: `dir = "${pluginDir}"` }));
});

after(() => endSession({ server, browser }));

test("a third-party kind renders through its preview, pushed and pulled", async () => {
  const { plugins } = await fetch(`${server.url}/v1/plugins`, {
    headers: { authorization: `Bearer ${await server.register("alice")}` },
  }).then((r) => r.json());
  const note = plugins.find((p) => p.name === "note");
  assert.ok(note, "the note kind is loaded");
  const alice = await (await fetch(`${server.url}/v1/auth/login`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ userId: "alice", password: "password-alice" }),
  })).json();

  // Alice's client (another app, say) sends a text, then a note.
  let sent = 0;
  const say = (contentType, payload) =>
    server.api(alice.token, "POST", "/v1/messages", {
      conversationType: 1,
      peerId: "bob",
      contentType,
      payload,
      clientMsgId: `kind-test-${++sent}`,
    });
  const bob = await newPerson(browser, server);
  await signIn(bob.page, "bob");
  await say(1, { text: "Plans for the weekend:" });
  await openConversation(bob.page, "alice");
  await bob.page.locator("#message-list .bubble", { hasText: "Plans for the weekend:" }).waitFor();

  // Pushed into the open chat: shown by the server's preview, with the kind's name.
  await say(note.contentType, { title: "  Picnic at noon ", note: "bring a blanket" });
  const pushed = bob.page.locator(`#message-list li[data-kind="${note.contentType}"]`);
  await pushed.locator(".bubble", { hasText: "[note] Picnic at noon" }).waitFor();
  await pushed.locator(".kind-label", { hasText: "note" }).waitFor();
  // And in the list's last-message preview.
  await conversationItem(bob.page, "alice").locator(".preview", { hasText: "[note] Picnic at noon" }).waitFor();

  // After a reload the history brings it with its preview too.
  await bob.page.reload();
  await waitOnline(bob.page);
  await openConversation(bob.page, "alice");
  const pulled = bob.page.locator(`#message-list li[data-kind="${note.contentType}"] .bubble`);
  await pulled.filter({ hasText: "[note] Picnic at noon" }).waitFor();
  assert.equal(await pulled.count(), 1);

  // The bundled kinds have views of their own.
  await say(2, {
    url: "https://cdn.example.com/summit.jpg",
    mime: "image/jpeg",
    width: 1600,
    height: 1200,
    size: 240000,
    thumbnail: { url: "https://cdn.example.com/summit-small.jpg", width: 200, height: 150 },
    caption: "The view from the top",
  });
  await say(3, { url: "https://files.example.com/route.gpx", name: "route.gpx", mime: "application/gpx+xml", size: 52311 });
  await say(10, { v: 1, type: "message", senderDeviceId: "phone-1", header: "AQ==", ciphertext: "AAAA" });
  const image = bob.page.locator('#message-list li[data-kind="2"]');
  // Another host's image loads only when the reader asks for it.
  await image.locator("figcaption", { hasText: "The view from the top" }).waitFor();
  assert.equal(await image.locator("img").count(), 0);
  await image.getByRole("button", { name: "Show image from cdn.example.com" }).click();
  await image.locator('img[alt="The view from the top"][src="https://cdn.example.com/summit-small.jpg"]').waitFor();
  const file = bob.page.locator('#message-list li[data-kind="3"] a.file');
  await file.filter({ hasText: "route.gpx" }).filter({ hasText: "52.3 KB" }).waitFor();
  assert.equal(await file.getAttribute("href"), "https://files.example.com/route.gpx");
  await bob.page.locator('#message-list li[data-kind="10"]', { hasText: "Encrypted message" }).waitFor();
  // Pushed bundled kinds need no preview: only the unknown one was asked for.
  assert.equal(await bob.page.locator("#message-list .other-kind").count(), 1);

  await bob.context.close();
});

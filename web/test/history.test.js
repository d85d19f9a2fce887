// History: a long conversation opens at its latest 50 messages; scrolling up brings the
// older ones, each once and in order; messages that come meanwhile land at the end; a chat
// that keeps growing holds 500 messages at most while the reader is at its bottom.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  conversationItem,
  endSession,
  newPerson,
  openConversation,
  signIn,
  startSession,
  texts,
  until,
} from "./support.js";

let server;
let browser;

before(async () => {
  ({ server, browser } = await startSession());
});

after(() => endSession({ server, browser }));

test("the latest 50 first, older ones on scrolling up, each once and in order", async () => {
  const alice = await server.register("alice");
  await server.register("bob");
  const all = [];
  for (let i = 1; i <= 120; i++) {
    const text = `Message number ${i}`;
    all.push(text);
    await server.api(alice, "POST", "/v1/messages", {
      conversationType: 1,
      peerId: "bob",
      contentType: 1,
      payload: { text },
      clientMsgId: `history-${i}`,
    });
  }
  // Bob logs in on a new device: online means caught up (all 120 pulled), and the chat
  // opens at the latest 50 of them.
  const bob = await newPerson(browser, server);
  await signIn(bob.page, "bob", { register: false });
  await conversationItem(bob.page, "alice").locator(".badge.unread", { hasText: "120" }).waitFor();
  await openConversation(bob.page, "alice");
  await bob.page.locator("#message-list .bubble", { hasText: "Message number 120" }).waitFor();
  await bob.page.getByRole("button", { name: "Load older messages" }).waitFor();
  assert.deepEqual(await texts(bob.page), all.slice(70));

  // Scrolling to the top loads the page before, and again, until the beginning.
  const messages = bob.page.getByRole("log", { name: "Messages" });
  for (const shown of [100, 120]) {
    await messages.evaluate((el) => el.scrollTo(0, 0));
    await until(bob.page, (n) => document.querySelectorAll("#message-list li.msg").length >= n, shown);
  }
  await bob.page.locator("#history-state", { hasText: "Beginning of the conversation" }).waitFor();
  assert.deepEqual(await texts(bob.page), all);

  // A new message lands at the end.
  await server.api(alice, "POST", "/v1/messages", {
    conversationType: 1,
    peerId: "bob",
    contentType: 1,
    payload: { text: "And one more" },
    clientMsgId: "history-121",
  });
  await bob.page.locator("#message-list .bubble", { hasText: "And one more" }).waitFor();
  assert.deepEqual(await texts(bob.page), [...all, "And one more"]);

  // After a reload this page holds nothing: the history comes from the server, page by page.
  const everything = [...all, "And one more"];
  await bob.page.reload();
  await openConversation(bob.page, "alice");
  await bob.page.locator("#message-list .bubble", { hasText: "And one more" }).waitFor();
  assert.deepEqual(await texts(bob.page), everything.slice(-50));
  for (const shown of [100, 121]) {
    await bob.page.getByRole("log", { name: "Messages" }).evaluate((el) => el.scrollTo(0, 0));
    await until(bob.page, (n) => document.querySelectorAll("#message-list li.msg").length >= n, shown);
  }
  await bob.page.locator("#history-state", { hasText: "Beginning of the conversation" }).waitFor();
  assert.deepEqual(await texts(bob.page), everything);

  // At the bottom of a chat that keeps growing, the page holds 500 messages at most: the
  // oldest leave it, and scrolling up pulls them again.
  await bob.page.getByRole("log", { name: "Messages" }).evaluate((el) => el.scrollTo(0, el.scrollHeight));
  for (let i = 1; i <= 400; i++) {
    const text = `Later message ${i}`;
    everything.push(text);
    await server.api(alice, "POST", "/v1/messages", {
      conversationType: 1,
      peerId: "bob",
      contentType: 1,
      payload: { text },
      clientMsgId: `history-later-${i}`,
    });
  }
  await bob.page.locator("#message-list .bubble", { hasText: "Later message 400" }).waitFor();
  assert.deepEqual(await texts(bob.page), everything.slice(-500));
  await bob.page.getByRole("button", { name: "Load older messages" }).waitFor();
  await bob.page.getByRole("log", { name: "Messages" }).evaluate((el) => el.scrollTo(0, 0));
  await until(bob.page, (n) => document.querySelectorAll("#message-list li.msg").length >= n, everything.length);
  await bob.page.locator("#history-state", { hasText: "Beginning of the conversation" }).waitFor();
  assert.deepEqual(await texts(bob.page), everything);

  await bob.context.close();
});

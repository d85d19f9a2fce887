// Two people in two browsers: they chat both ways with typing, delivered and read
// receipts and a recall; one closes the page while messages arrive, comes back and sees
// them once, in order, with the right unread badge; the views at desktop and phone width
// are saved as screenshots.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  chatWith,
  conversationItem,
  endSession,
  newPerson,
  openConversation,
  screenshot,
  send,
  sentMessage,
  signIn,
  startSession,
  texts,
  until,
  waitOnline,
} from "./support.js";

let server;
let browser;

before(async () => {
  ({ server, browser } = await startSession());
});

after(() => endSession({ server, browser }));

test("two people chat both ways, with typing, receipts and a recall; one comes back after being away", async () => {
  const alice = await newPerson(browser, server);
  const bob = await newPerson(browser, server);
  await signIn(alice.page, "alice");
  await signIn(bob.page, "bob");

  // Alice writes first: the chat does not exist until her first message is stored.
  await chatWith(alice.page, "bob");
  await send(alice.page, "Hi Bob, lunch today?");

  // Bob's list shows it live: the preview and one unread.
  const fromAlice = conversationItem(bob.page, "alice");
  await fromAlice.locator(".preview", { hasText: "Hi Bob, lunch today?" }).waitFor();
  await fromAlice.locator(".badge.unread", { hasText: "1" }).waitFor();
  // Told to screen readers, and counted in the tab's title.
  await bob.page.locator("#announce", { hasText: "New message from alice: Hi Bob, lunch today?" }).waitFor();
  await until(bob.page, () => document.title === "(1) Courier");
  // Bob's browser received it: Alice sees "Delivered" before Bob opens the chat.
  const first = sentMessage(alice.page, "Hi Bob, lunch today?");
  await first.locator(".status", { hasText: "Delivered" }).waitFor();
  await screenshot(bob.page, "conversation-list");

  // Bob opens it: the badge goes, Alice sees "Read".
  await openConversation(bob.page, "alice");
  await bob.page.locator("#message-list .bubble", { hasText: "Hi Bob, lunch today?" }).waitFor();
  await fromAlice.locator(".badge.unread").waitFor({ state: "detached" });
  await first.locator(".status", { hasText: "Read" }).waitFor();

  // Bob types: Alice sees it; then his answer arrives.
  await bob.page.getByLabel("Message", { exact: true }).pressSequentially("Sure");
  await alice.page.locator("#typing", { hasText: "bob is typing" }).waitFor();
  await bob.page.getByLabel("Message", { exact: true }).fill("Sure, 12:30 at the usual place");
  await bob.page.getByLabel("Message", { exact: true }).press("Enter");
  await alice.page.locator("#message-list li.theirs .bubble", { hasText: "Sure, 12:30 at the usual place" }).waitFor();
  await alice.page.waitForFunction(() => !document.querySelector("#typing").textContent);

  // Alice recalls a message of hers: both see it gone.
  await send(alice.page, "oops, wrong chat");
  await bob.page.locator("#message-list .bubble", { hasText: "oops, wrong chat" }).waitFor();
  await sentMessage(alice.page, "oops, wrong chat").getByRole("button", { name: /Recall/ }).click();
  await alice.page.locator("#message-list .tip", { hasText: "You recalled a message" }).waitFor();
  await bob.page.locator("#message-list .tip", { hasText: "alice recalled a message" }).waitFor();
  await bob.page.locator("#message-list .bubble", { hasText: "oops, wrong chat" }).waitFor({ state: "detached" });
  assert.equal(await alice.page.locator("#message-list .recalled").count(), 1);
  await send(alice.page, "See you there!");
  await screenshot(alice.page, "chat");

  // Bob goes away (his page is closed) once he read everything; three messages arrive meanwhile.
  await bob.page.locator("#message-list .bubble", { hasText: "See you there!" }).waitFor();
  await sentMessage(alice.page, "See you there!").locator(".status", { hasText: "Read" }).waitFor();
  await bob.page.close();
  for (const text of ["Away message one", "Away message two", "Away message three"]) await send(alice.page, text);

  // He comes back: logged in still, the list says 3 unread, and each shows once, in order.
  bob.page = await bob.context.newPage();
  await bob.page.goto("/");
  await waitOnline(bob.page);
  const back = conversationItem(bob.page, "alice");
  await back.locator(".badge.unread", { hasText: "3" }).waitFor();
  await back.locator(".preview", { hasText: "Away message three" }).waitFor();
  // From the keyboard: the conversation's button, Enter; the message box takes the focus.
  await back.getByRole("button").focus();
  await bob.page.keyboard.press("Enter");
  await bob.page.locator("#chat-title", { hasText: "alice" }).waitFor();
  await until(bob.page, () => document.activeElement?.id === "composer-text");
  await bob.page.locator("#message-list .bubble", { hasText: "Away message three" }).waitFor();
  // What the sync brought shows at once; the history comes with it while the log says it
  // is busy.
  await bob.page.locator('#messages[aria-busy="false"]').waitFor();
  const seen = await texts(bob.page);
  assert.deepEqual(seen, [
    "Hi Bob, lunch today?",
    "Sure, 12:30 at the usual place",
    "See you there!",
    "Away message one",
    "Away message two",
    "Away message three",
  ]);
  await back.locator(".badge.unread").waitFor({ state: "detached" });
  await sentMessage(alice.page, "Away message three").locator(".status", { hasText: "Read" }).waitFor();

  // Phone width: one pane at a time, with a way back.
  await bob.page.setViewportSize({ width: 390, height: 760 });
  await screenshot(bob.page, "phone-chat");
  await bob.page.getByRole("button", { name: "Back to conversations" }).click();
  await bob.page.locator("#conversations").waitFor();
  assert.equal(await bob.page.locator("#chat-view").isVisible(), false);
  await screenshot(bob.page, "phone-list");

  await alice.context.close();
  await bob.context.close();
});

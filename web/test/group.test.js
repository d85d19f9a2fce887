// A group of three: Alice creates it with Bob, adds Carol; everyone sees the tips and
// every message; Alice's messages say how many read them.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
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
} from "./support.js";

let server;
let browser;

before(async () => {
  ({ server, browser } = await startSession());
});

after(() => endSession({ server, browser }));

test("a group of three: created, a member added, tips shown, messages seen by all", async () => {
  const alice = await newPerson(browser, server);
  const bob = await newPerson(browser, server);
  const carol = await newPerson(browser, server);
  await signIn(alice.page, "alice");
  await signIn(bob.page, "bob");
  await signIn(carol.page, "carol");

  // Alice creates "Hiking" with Bob.
  await alice.page.locator("#group-panel summary").click();
  await alice.page.getByLabel("Group name").fill("Hiking");
  await alice.page.getByLabel(/^Members/).fill("bob");
  await alice.page.getByRole("button", { name: "Create group" }).click();
  await alice.page.locator("#chat-title", { hasText: "Hiking" }).waitFor();
  await alice.page.locator("#message-list .tip", { hasText: "You created the group with bob" }).waitFor();

  // Then adds Carol from the chat's header.
  await alice.page.getByLabel("Add member").fill("carol");
  await alice.page.getByRole("button", { name: "Add", exact: true }).click();
  await alice.page.locator("#message-list .tip", { hasText: "You added carol" }).waitFor();
  await alice.page.locator("#chat-sub", { hasText: "3 members" }).waitFor();

  // Bob and Carol see the group in their lists, with the tips they may see.
  await openConversation(bob.page, "Hiking");
  await bob.page.locator("#message-list .tip", { hasText: "alice created the group with you" }).waitFor();
  await bob.page.locator("#message-list .tip", { hasText: "alice added carol" }).waitFor();
  await openConversation(carol.page, "Hiking");
  await carol.page.locator("#message-list .tip", { hasText: "alice added you" }).waitFor();
  // Carol joined later: the group's creation is not hers to see.
  assert.equal(await carol.page.locator("#message-list .tip", { hasText: "created" }).count(), 0);

  await send(alice.page, "Saturday, 8:00 at the trailhead?");
  await send(bob.page, "I'm in");
  await send(carol.page, "Me too, I'll bring coffee");
  const all = ["Saturday, 8:00 at the trailhead?", "I'm in", "Me too, I'll bring coffee"];
  for (const person of [alice, bob, carol]) {
    await person.page.locator("#message-list .bubble", { hasText: all[2] }).waitFor();
    assert.deepEqual(await texts(person.page), all);
  }
  // Group messages name their sender.
  await alice.page.locator("#message-list li.theirs .sender", { hasText: "bob" }).waitFor();
  // Both others have read Alice's message (sending reads up to one's own message).
  await sentMessage(alice.page, all[0]).locator(".status", { hasText: "Read by 2 of 2" }).waitFor();
  // Nobody has anything unread in the open group.
  for (const person of [alice, bob, carol]) {
    await conversationItem(person.page, "Hiking").locator(".badge.unread").waitFor({ state: "detached" });
  }
  await screenshot(alice.page, "group");

  // Carol quits (from another of her devices): her open chat says so at once, the composer
  // is off, and the list marks the group left.
  const carolToken = await carol.page.evaluate(() => JSON.parse(localStorage.getItem("courier.session")).token);
  const id = await conversationItem(carol.page, "Hiking").getAttribute("data-conversation-id");
  await server.api(carolToken, "POST", `/v1/groups/${id}/quit`);
  await carol.page.locator("#chat-sub", { hasText: "You are no longer a member" }).waitFor();
  assert.equal(await carol.page.locator("#composer-text").isDisabled(), true);
  await conversationItem(carol.page, "Hiking").locator(".preview", { hasText: "(left)" }).waitFor();

  for (const person of [alice, bob, carol]) await person.context.close();
});

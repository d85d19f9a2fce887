// Friends through the page: a request with a message, its badge, accepting it, and a chat
// opened from the friends list.

import { after, before, test } from "node:test";
import {
  endSession,
  newPerson,
  send,
  signIn,
  startSession,
} from "./support.js";

let server;
let browser;

before(async () => {
  ({ server, browser } = await startSession());
});

after(() => endSession({ server, browser }));

test("a friend request sent, seen, accepted, and a chat opened from the friends list", async () => {
  const alice = await newPerson(browser, server);
  const bob = await newPerson(browser, server);
  await signIn(alice.page, "alice");
  await signIn(bob.page, "bob");

  await alice.page.locator("#friends-panel summary").click();
  await alice.page.getByLabel("Add a friend (user id)").fill("bob");
  await alice.page.getByLabel("Message (optional)").fill("Hi, it's Alice from the climbing gym");
  await alice.page.getByRole("button", { name: "Send friend request" }).click();
  await alice.page.locator("#friend-status", { hasText: "Friend request sent to bob" }).waitFor();
  await alice.page.locator("#requests-out li", { hasText: "bob" }).waitFor();

  // Bob's page shows it live, with a badge on the closed panel.
  await bob.page.getByLabel("1 friend request").waitFor();
  await bob.page.locator("#friends-panel summary").click();
  const request = bob.page.locator("#requests-in li", { hasText: "alice" });
  await request.filter({ hasText: "Hi, it's Alice from the climbing gym" }).waitFor();
  await request.getByRole("button", { name: "Accept alice" }).click();
  await bob.page.locator("#friend-status", { hasText: "You and alice are now friends" }).waitFor();
  await bob.page.locator("#requests-badge").waitFor({ state: "hidden" });

  // Both lists say so; Alice's sent request is gone.
  await bob.page.getByRole("button", { name: "Chat with alice" }).waitFor();
  await alice.page.getByRole("button", { name: "Chat with bob" }).waitFor();
  await alice.page.locator("#requests-out li", { hasText: "None" }).waitFor();

  // A chat from the friends list.
  await bob.page.getByRole("button", { name: "Chat with alice" }).click();
  await bob.page.locator("#chat-title", { hasText: "alice" }).waitFor();
  await bob.page.locator("#chat-sub", { hasText: "Friend" }).waitFor();
  await send(bob.page, "Nice to meet you!");
  await alice.page.locator("#conversations .preview", { hasText: "Nice to meet you!" }).waitFor();

  await alice.context.close();
  await bob.context.close();
});

// Two users on two clients exchange messages both ways: each sees every message of the
// conversation once, in seq order, the same list the server holds.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type { Message, StoredAck } from "../src/index.js";
import { client, eventually, online, range, text, type Recorded } from "./support/clients.js";
import { startServer, type TestServer } from "./support/server.js";

let server: TestServer;
let alice: Recorded;
let bob: Recorded;

before(async () => {
  server = await startServer();
  alice = client(server, { token: await server.register("alice"), deviceId: "alice-phone" });
  bob = client(server, { token: await server.register("bob"), deviceId: "bob-laptop" });
});

after(async () => {
  alice?.client.close();
  bob?.client.close();
  await server?.stop();
});

test("two clients exchange messages both ways, each seen once and in order", async () => {
  alice.client.connect();
  bob.client.connect();
  await online([alice, bob]);

  // The first message creates the private conversation.
  const first = (await alice.client.send({ conversationType: 1, peerId: "bob", ...text("a0") })) as StoredAck;
  assert.equal(first.seq, 1);
  assert.equal(first.duplicate, false);
  const conversationId = first.conversationId;

  // Then both write at once, ten each, without waiting for each other.
  const sends: Promise<unknown>[] = [];
  for (let i = 1; i <= 10; i++) {
    sends.push(alice.client.send({ conversationType: 1, conversationId, ...text(`a${i}`) }));
    sends.push(bob.client.send({ conversationType: 1, conversationId, ...text(`b${i}`) }));
  }
  const acks = (await Promise.all(sends)) as StoredAck[];
  assert.deepEqual(
    acks.map((a) => a.seq).sort((x, y) => x - y),
    range(2, 21),
    "each send got its own seq",
  );

  await eventually(
    [alice, bob],
    () => alice.seqs(conversationId).length >= 21 && bob.seqs(conversationId).length >= 21,
    "21 messages on both clients",
  );

  // What the server holds, pulled independently.
  const page = await bob.client.api.messagesAfter(conversationId, 0, 500);
  assert.equal(page.hasMore, false);
  const held = page.messages.map((m: Message) => [m.seq, m.senderId, (m.payload as { text: string }).text]);
  assert.equal(held.length, 21);

  for (const [name, recorded] of [["alice", alice], ["bob", bob]] as const) {
    const seen = recorded.messages
      .filter((m) => m.conversationId === conversationId)
      .map((m) => [m.seq, m.senderId, (m.payload as { text: string }).text]);
    assert.deepEqual(seen, held, `${name} saw the conversation as the server holds it, once, in seq order`);
  }

  // Each side's own messages come in the order it sent them.
  const aliceTexts = alice.texts(conversationId).filter((t) => t.startsWith("a"));
  assert.deepEqual(aliceTexts, range(0, 10).map((i) => `a${i}`));
  const bobTexts = bob.texts(conversationId).filter((t) => t.startsWith("b"));
  assert.deepEqual(bobTexts, range(1, 10).map((i) => `b${i}`));

  // The overview follows: both see the conversation at its last seq.
  await eventually(
    [alice, bob],
    () => [alice, bob].every((c) => c.client.conversations.find((x) => x.conversationId === conversationId)?.lastSeq === 21),
    "the overview at seq 21 on both clients",
  );
  assert.equal(alice.client.seq(conversationId), 21);
  assert.equal(bob.client.seq(conversationId), 21);
  assert.deepEqual(alice.errors, []);
  assert.deepEqual(bob.errors, []);
});

test("a recall, typing, a delivered and a read receipt reach the peer as events", async () => {
  const sent = (await alice.client.send({ conversationType: 1, peerId: "bob", ...text("oops") })) as StoredAck;
  const { conversationId } = sent;
  const recalls: unknown[] = [];
  const typing: unknown[] = [];
  const reads: unknown[] = [];
  bob.client.on("recall", (r) => recalls.push(r));
  bob.client.on("typing", (t) => typing.push(t));
  alice.client.on("read", (r) => reads.push(r));

  const recall = (await alice.client.send({ conversationType: 1, conversationId, contentType: 4, payload: { seq: sent.seq } })) as StoredAck;
  await eventually([bob], () => recalls.length >= 1, "the recall event");
  assert.deepEqual(recalls, [{ conversationId, conversationType: 1, seq: recall.seq, targetSeq: sent.seq, senderId: "alice" }]);
  assert.equal(bob.messages.at(-1)?.seq, recall.seq, "the recall is itself a message, in its place");
  const page = await bob.client.api.messagesAfter(conversationId, sent.seq - 1);
  assert.equal(page.messages[0]!.payload, null, "a pull shows the original hidden");
  assert.equal(page.messages[0]!.recalledBy, recall.seq);

  const ack = await alice.client.typing({ conversationType: 1, conversationId }, "typing");
  assert.ok("live" in ack && ack.delivered >= 1);
  await eventually([bob], () => typing.length >= 1, "the typing event");
  assert.deepEqual(typing, [{ conversationId, conversationType: 1, userId: "alice", state: "typing" }]);

  const delivered: unknown[] = [];
  alice.client.on("delivered", (d) => delivered.push(d));
  const received = await bob.client.markReceived(conversationId, sent.seq);
  assert.deepEqual(received, { conversationId, deliveredSeq: sent.seq, moved: true });
  await eventually([alice], () => delivered.length >= 1, "bob's delivered receipt at alice");
  assert.deepEqual(delivered[0], { conversationId, userId: "bob", seq: sent.seq });

  const position = await bob.client.markRead(conversationId, recall.seq);
  assert.equal(position.readSeq, recall.seq);
  assert.equal(position.unread, 0);
  await eventually([alice], () => reads.length >= 1, "bob's read receipt at alice");
  assert.deepEqual(reads, [{ conversationId, userId: "bob", readSeq: recall.seq }]);
  assert.equal(bob.client.conversations.find((c) => c.conversationId === conversationId)?.readSeq, recall.seq);
});

// A send whose ack is lost is resent with the same clientMsgId, and the conversation holds
// the message once.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { CourierError, type Message, type StoredAck } from "../src/index.js";
import { client, eventually, online, poll, text, type Recorded } from "./support/clients.js";
import { Link, type ClientFrameVerdict, type SeenFrame } from "./support/link.js";
import { startServer, type TestServer } from "./support/server.js";

let server: TestServer;
let link: Link;
let alice: Recorded;
let bob: Recorded;
let conversationId: number;

before(async () => {
  server = await startServer();
  link = await Link.start(server);
  alice = client(server, { token: await server.register("alice"), deviceId: "alice-phone", wsUrl: link.wsUrl });
  bob = client(server, { token: await server.register("bob"), deviceId: "bob-phone" });
  alice.client.connect();
  bob.client.connect();
  await online([alice, bob]);
  const first = (await alice.client.send({ conversationType: 1, peerId: "bob", ...text("hello") })) as StoredAck;
  conversationId = first.conversationId;
});

after(async () => {
  alice?.client.close();
  bob?.client.close();
  await link?.close();
  await server?.stop();
});

/**
 * The send frames with this clientMsgId that go through the link from now on; `decide` may
 * cut the connection right after one went out.
 */
function watchSends(clientMsgId: string, decide: (seen: SeenFrame[]) => ClientFrameVerdict | void = () => {}): SeenFrame[] {
  const seen: SeenFrame[] = [];
  link.onClientFrame = (frame) => {
    if (frame.json?.type !== "send" || frame.json.clientMsgId !== clientMsgId) return;
    seen.push(frame);
    return decide(seen);
  };
  return seen;
}

async function stored(body: string): Promise<Message[]> {
  const page = await bob.client.api.messagesAfter(conversationId, 0, 500);
  return page.messages.filter((m) => (m.payload as { text?: string } | null)?.text === body);
}

test("the connection dies after the send left and before its ack: one message, acked on the new connection", async () => {
  const clientMsgId = "lost-ack-1";
  const frames = watchSends(clientMsgId, (seen) => {
    if (seen.length > 1) return;
    link.hold(); // the reconnection waits until the test saw the message stored
    return "cut"; // the frame went out; its ack will not come back
  });

  const sent = alice.client.send({ conversationType: 1, conversationId, clientMsgId, ...text("once") });
  // The server stored the first attempt; its ack was lost with the connection.
  await poll("the first attempt is stored", () => stored("once"), (found) => found.length === 1);
  assert.equal(alice.client.pending.length, 1, "the send is still waiting in the outbox");
  link.release();

  const ack = (await sent) as StoredAck;
  assert.equal(ack.duplicate, true, "the resend was recognised as the message already stored");
  assert.equal(frames.length, 2, "sent twice");
  assert.notEqual(frames[0]!.connection, frames[1]!.connection, "the second time on the new connection");
  const found = await stored("once");
  assert.equal(found.length, 1, "the conversation holds the message once");
  assert.equal(found[0]!.seq, ack.seq);
  assert.equal(found[0]!.msgId, ack.msgId);

  await eventually([alice, bob], () => bob.seqs(conversationId).includes(ack.seq) && alice.seqs(conversationId).includes(ack.seq), "the message on both clients");
  for (const c of [alice, bob]) {
    assert.equal(c.texts(conversationId).filter((t) => t === "once").length, 1, "emitted once");
  }
  assert.equal(alice.client.pending.length, 0);
});

test("an ack lost on a live connection: the same frame again after 1 s, one message", async () => {
  const clientMsgId = "lost-ack-2";
  const frames = watchSends(clientMsgId);
  let dropped = 0;
  link.onServerFrame = ({ json }) => {
    const answersFirst = json?.type === "ack" && frames.length === 1 && json.id === frames[0]!.json!.id;
    if (answersFirst && dropped === 0) {
      dropped += 1;
      return "drop";
    }
  };
  const accepted = link.accepted;

  const ack = (await alice.client.send({ conversationType: 1, conversationId, clientMsgId, ...text("twice sent") })) as StoredAck;
  link.onServerFrame = () => {};
  assert.equal(dropped, 1);
  assert.equal(ack.duplicate, true);
  assert.equal(frames.length, 2);
  assert.deepEqual(frames[1]!.json, frames[0]!.json, "the very same frame");
  assert.equal(link.accepted, accepted, "on the same connection");
  assert.equal((await stored("twice sent")).length, 1);
});

test("a send never answered fails after its last resend, with the message stored once", async () => {
  const clientMsgId = "never-acked";
  const frames = watchSends(clientMsgId);
  link.onServerFrame = ({ json }) => (json?.type === "ack" && frames.some((f) => f.json!.id === json.id) ? "drop" : undefined);
  // A client of its own with short ack timeouts (the default is 1 s, 2 s, 4 s, 8 s).
  const hasty = client(server, {
    token: await server.register("hasty"),
    deviceId: "hasty-phone",
    wsUrl: link.wsUrl,
    ackTimeoutsMs: [50, 50, 50],
  });
  try {
    hasty.client.connect();
    await online([hasty]);
    const sent = hasty.client.send({ conversationType: 1, peerId: "bob", clientMsgId, ...text("unanswered") });
    await assert.rejects(sent, (err: unknown) => err instanceof CourierError && err.code === "timeout");
    assert.equal(frames.length, 3, "three attempts");
    assert.equal(hasty.client.pending.length, 0);
    // The server may still be answering the last attempt: wait until it holds the message.
    const [conversation] = await poll(
      "the conversation exists",
      async () => (await hasty.client.api.conversations()).conversations,
      (list) => list.length === 1 && list[0]!.lastSeq >= 1,
    );
    const page = await hasty.client.api.messagesAfter(conversation!.conversationId, 0);
    assert.deepEqual(
      page.messages.map((m) => (m.payload as { text: string }).text),
      ["unanswered"],
      "stored once, whatever the client concluded",
    );
  } finally {
    hasty.client.close();
    link.onServerFrame = () => {};
  }
});

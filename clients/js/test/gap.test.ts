// A push that arrives after a gap is preceded by a pull of the gap, so what the client emits
// has no hole and no duplicate; a client that starts from an older cursor emits only what
// came after it.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { MemoryCursorStore, type FetchLike, type StoredAck } from "../src/index.js";
import { client, eventually, online, range, text, type Recorded } from "./support/clients.js";
import { Link } from "./support/link.js";
import { startServer, type TestServer } from "./support/server.js";

let server: TestServer;
let link: Link;
const opened: Recorded[] = [];

before(async () => {
  server = await startServer();
  link = await Link.start(server);
});

after(async () => {
  for (const c of opened) c.client.close();
  await link?.close();
  await server?.stop();
});

/** A `fetch` that notes each pull of messages (`pull <afterSeq>`) in `log`. */
function loggingFetch(log: string[]): FetchLike {
  return (url, init) => {
    const pull = /\/v1\/conversations\/\d+\/messages\?afterSeq=(\d+)/.exec(url);
    if (pull) log.push(`pull ${pull[1]}`);
    return fetch(url, init);
  };
}

test("pushes lost on the way: the next push pulls the gap before it is emitted", async () => {
  const log: string[] = [];
  const alice = client(server, { token: await server.register("alice"), deviceId: "alice-phone" });
  const bob = client(server, {
    token: await server.register("bob"),
    deviceId: "bob-phone",
    wsUrl: link.wsUrl,
    fetch: loggingFetch(log),
  });
  opened.push(alice, bob);
  bob.client.on("message", (m) => log.push(`emit ${m.seq}`));
  // The pushes of seqs 3, 4 and 5 never reach bob (a push lost on the way, as a cluster's
  // bus may lose one); his connection stays up.
  link.onServerFrame = ({ json }) => {
    if (json?.type !== "notify" || typeof json.seq !== "number") return;
    if (json.seq >= 3 && json.seq <= 5) {
      log.push(`lost ${json.seq}`);
      return "drop";
    }
    log.push(`push ${json.seq}`);
  };

  alice.client.connect();
  bob.client.connect();
  await online([alice, bob]);
  log.length = 0;

  const first = (await alice.client.send({ conversationType: 1, peerId: "bob", ...text("m1") })) as StoredAck;
  const conversationId = first.conversationId;
  for (let i = 2; i <= 6; i++) {
    await alice.client.send({ conversationType: 1, conversationId, ...text(`m${i}`) });
  }
  await eventually([bob], () => bob.seqs(conversationId).length >= 6, "6 messages on bob's client");

  assert.deepEqual(bob.seqs(conversationId), range(1, 6), "no hole, no duplicate");
  assert.deepEqual(bob.texts(conversationId), range(1, 6).map((i) => `m${i}`));
  assert.deepEqual(
    log.filter((l) => l.startsWith("pull")),
    ["pull 2"],
    "one pull, of what came after the last seq bob had",
  );
  const at = (entry: string) => log.indexOf(entry);
  assert.ok(at("push 6") >= 0 && at("push 6") < at("pull 2"), `the push of 6 came, then the pull: ${log}`);
  assert.ok(at("pull 2") < at("emit 3"), `the gap was pulled before anything after it was emitted: ${log}`);
  assert.equal(link.accepted, 1, "bob's connection stayed up throughout");
});

test("a client starting from an older cursor emits only what came after it, then follows pushes", async () => {
  const log: string[] = [];
  const carol = client(server, { token: await server.register("carol"), deviceId: "carol-phone" });
  opened.push(carol);
  carol.client.connect();
  await online([carol]);
  const daveToken = await server.register("dave");

  const first = (await carol.client.send({ conversationType: 1, peerId: "dave", ...text("c1") })) as StoredAck;
  const conversationId = first.conversationId;
  for (let i = 2; i <= 5; i++) await carol.client.send({ conversationType: 1, conversationId, ...text(`c${i}`) });

  // Dave's device saw up to seq 3 in an earlier session.
  const store = new MemoryCursorStore({ conversations: { [conversationId]: 3 } });
  const dave = client(server, { token: daveToken, deviceId: "dave-phone", store, fetch: loggingFetch(log) });
  opened.push(dave);
  dave.client.connect();
  await online([dave]);
  assert.deepEqual(dave.seqs(conversationId), [4, 5], "only the messages after the stored cursor");
  assert.deepEqual(log, ["pull 3"]);
  assert.equal(await store.getSeq(conversationId), 5, "the cursor moved with what was emitted");

  await carol.client.send({ conversationType: 1, conversationId, ...text("c6") });
  await eventually([dave], () => dave.seqs(conversationId).length >= 3, "the pushed 6th message");
  assert.deepEqual(dave.seqs(conversationId), [4, 5, 6]);
  assert.deepEqual(dave.texts(conversationId), ["c4", "c5", "c6"]);
  assert.deepEqual(log, ["pull 3"], "a push in order needs no pull");
});

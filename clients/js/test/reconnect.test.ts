// A client loses its connection in the middle of a burst of 200 messages: it reconnects by
// itself, catches up, and ends with every message once, in order.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type { StoredAck } from "../src/index.js";
import { client, eventually, online, range, text, type Recorded } from "./support/clients.js";
import { Link } from "./support/link.js";
import { startServer, type TestServer } from "./support/server.js";

const BURST = 200;
const CUT_AT = 50;

let server: TestServer;
let link: Link;
let alice: Recorded;
let bob: Recorded;

before(async () => {
  server = await startServer();
  link = await Link.start(server);
  alice = client(server, { token: await server.register("alice"), deviceId: "alice-phone" });
  bob = client(server, { token: await server.register("bob"), deviceId: "bob-phone", wsUrl: link.wsUrl });
});

after(async () => {
  alice?.client.close();
  bob?.client.close();
  await link?.close();
  await server?.stop();
});

test("a connection lost mid-burst comes back by itself and ends with every message once, in order", async () => {
  alice.client.connect();
  bob.client.connect();
  await online([alice, bob]);

  // Bob's network dies right after the 50th push reached him.
  let pushed = 0;
  let deliveredBeforeCut = -1;
  link.onServerFrame = ({ json }) => {
    if (json?.type !== "notify" || deliveredBeforeCut >= 0) return;
    pushed += 1;
    if (pushed === CUT_AT) {
      deliveredBeforeCut = pushed;
      return "cutAfter";
    }
  };

  const first = (await alice.client.send({ conversationType: 1, peerId: "bob", ...text("m1") })) as StoredAck;
  const conversationId = first.conversationId;
  const rest: Promise<unknown>[] = [];
  for (let i = 2; i <= BURST; i++) rest.push(alice.client.send({ conversationType: 1, conversationId, ...text(`m${i}`) }));
  const acks = [first, ...((await Promise.all(rest)) as StoredAck[])];
  assert.deepEqual(
    acks.map((a) => a.seq),
    range(1, BURST),
    "alice's pipelined sends were stored in the order she sent them",
  );

  await eventually([bob], () => bob.seqs(conversationId).length >= BURST, `${BURST} messages on bob's client`);

  assert.equal(deliveredBeforeCut, CUT_AT, "the connection was cut in the middle of the burst");
  assert.ok(link.accepted >= 2, "bob's client opened a new connection by itself");
  const names = bob.stateNames();
  const waiting = bob.states.find((s) => s.state === "waiting");
  assert.ok(waiting && waiting.state === "waiting" && waiting.code === 1006, `bob waited after a lost link: ${names}`);
  assert.ok(names.lastIndexOf("syncing") > names.indexOf("waiting"), `bob caught up on the new session: ${names}`);

  assert.deepEqual(bob.seqs(conversationId), range(1, BURST), "every seq once, in order");
  assert.deepEqual(
    bob.texts(conversationId),
    range(1, BURST).map((i) => `m${i}`),
    "every message once, in the order alice sent them",
  );
  await eventually([bob], () => bob.client.state.state === "online", "bob online again");
  assert.equal(bob.client.seq(conversationId), BURST);
});

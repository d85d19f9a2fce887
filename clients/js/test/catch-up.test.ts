// Catching up from the overview: a client that was away pages through every conversation
// and pulls each; a group joined late starts at the seq of the join, with nothing to wait
// for before it.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Api, type FetchLike } from "../src/index.js";
import { client, eventually, online, range, text, type Recorded } from "./support/clients.js";
import { startServer, type TestServer } from "./support/server.js";

let server: TestServer;
const opened: Recorded[] = [];

before(async () => {
  server = await startServer();
});

after(async () => {
  for (const c of opened) c.client.close();
  await server?.stop();
});

async function user(userId: string): Promise<{ token: string; api: Api }> {
  const token = await server.register(userId);
  return { token, api: new Api({ url: server.url, token: () => token }) };
}

test("a client that was away pages through the overview and pulls every conversation", async () => {
  const erin = await user("erin");
  const peers = ["fred", "gina", "hugo"];
  for (const peer of peers) {
    const { api } = await user(peer);
    for (let i = 1; i <= 3; i++) {
      await api.send({ clientMsgId: `${peer}-${i}`, conversationType: 1, peerId: "erin", ...text(`${peer} ${i}`) });
    }
  }

  const requests: string[] = [];
  const logging: FetchLike = (url, init) => {
    requests.push(url.slice(server.url.length));
    return fetch(url, init);
  };
  const erinClient = client(server, { token: erin.token, deviceId: "erin-phone", overviewPageSize: 1, fetch: logging });
  opened.push(erinClient);
  erinClient.client.connect();
  await online([erinClient]);

  const overview = requests.filter((r) => r.startsWith("/v1/conversations?"));
  assert.equal(overview.length, 3, `three pages of one, the last without a cursor: ${overview}`);
  const conversations = erinClient.client.conversations;
  assert.deepEqual(conversations.map((c) => c.peerId).sort(), peers);
  for (const conversation of conversations) {
    assert.equal(conversation.lastSeq, 3);
    assert.equal(conversation.unread, 3);
    assert.deepEqual(erinClient.seqs(conversation.conversationId), range(1, 3));
    assert.deepEqual(erinClient.texts(conversation.conversationId), range(1, 3).map((i) => `${conversation.peerId} ${i}`));
  }
  assert.equal(requests.filter((r) => /\/messages\?afterSeq=0/.test(r)).length, 3, "one pull per conversation");
});

test("a group joined late: its first message for the new member is the join, and no hole is waited for", async () => {
  const owner = await user("olga");
  await user("pete");
  const late = await user("lena");
  const lena = client(server, { token: late.token, deviceId: "lena-phone" });
  opened.push(lena);
  lena.client.connect();
  await online([lena]);

  const group = await owner.api.request<{ conversationId: number }>("POST", "/v1/groups", { body: { name: "Hiking", members: ["pete"] } });
  const id = group.conversationId;
  for (let i = 1; i <= 3; i++) {
    await owner.api.send({ clientMsgId: `before-${i}`, conversationType: 2, conversationId: id, ...text(`before ${i}`) });
  }
  await owner.api.request("POST", `/v1/groups/${id}/members`, { body: { userIds: ["lena"] } });
  const afterJoin = await owner.api.send({ clientMsgId: "after-1", conversationType: 2, conversationId: id, ...text("welcome") });
  assert.ok(!("live" in afterJoin));

  await eventually([lena], () => lena.seqs(id).includes(afterJoin.seq), "the message after the join");
  const seqs = lena.seqs(id);
  assert.equal(seqs.length, 2, `the join tip and the welcome: ${seqs}`);
  assert.ok(seqs[0]! > 4, "nothing from before the join");
  assert.deepEqual(seqs, [afterJoin.seq - 1, afterJoin.seq]);
  assert.equal(lena.messages.find((m) => m.seq === seqs[0])?.contentType, 9, "the join is a group-update tip");
  assert.ok(lena.userEvents.some((e) => e.event === "group.joined" && e.data.conversationId === id));
  assert.deepEqual(lena.errors, []);
});

// The user stream across resets (`POST /admin/users/{userId}/stream/reset`): a client that
// pulls with the old epoch gets `resync_required`, one that is pushed an event of a new
// epoch sees it; both reload the snapshots and go on in the new epoch.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Api } from "../src/index.js";
import { client, eventually, online, type Recorded } from "./support/clients.js";
import { Link } from "./support/link.js";
import { startServer, type TestServer } from "./support/server.js";

let server: TestServer;
let link: Link;
let alice: Recorded;
let bob: Api;

before(async () => {
  server = await startServer();
  link = await Link.start(server);
  const aliceToken = await server.register("alice");
  const bobToken = await server.register("bob");
  alice = client(server, { token: aliceToken, deviceId: "alice-phone", wsUrl: link.wsUrl });
  bob = new Api({ url: server.url, token: () => bobToken });
});

after(async () => {
  alice?.client.close();
  await link?.close();
  await server?.stop();
});

test("the user stream: first sync, a reset seen as resync_required, a reset seen on a push", async () => {
  alice.client.connect();
  await online([alice]);
  assert.deepEqual(
    alice.snapshots.map((s) => [s.reason, s.epoch]),
    [["first_sync", 1]],
    "a first sync loads the snapshots once",
  );

  // Bob asks to be friends: alice's stream gets friend.request, pushed.
  const request = await bob.request<{ requestId: string }>("POST", "/v1/friends/requests", { body: { userId: "alice" } });
  await eventually([alice], () => alice.userEvents.length >= 1, "the friend request event");
  assert.deepEqual(
    alice.userEvents.map((e) => [e.epoch, e.seq, e.event, e.data.action]),
    [[1, 1, "friend.request", "requested"]],
  );

  // Alice is offline while her stream is reset: her next pull carries the old epoch.
  link.hold();
  link.cutAll();
  await eventually([alice], () => alice.client.state.state === "waiting", "alice offline");
  const reset = (await server.admin("POST", "/admin/users/alice/stream/reset")) as { epoch: number };
  assert.equal(reset.epoch, 2);
  link.release();

  await eventually([alice], () => alice.snapshots.length >= 2, "the snapshots reloaded");
  const resync = alice.snapshots[1]!;
  assert.equal(resync.reason, "resync_required");
  assert.equal(resync.epoch, 2);
  assert.deepEqual(
    resync.friendRequestsIn.map((r) => [r.requestId, r.fromUserId, r.state]),
    [[request.requestId, "bob", "pending"]],
    "the snapshot holds what the reset stream no longer tells",
  );
  assert.deepEqual(resync.friends, []);
  await eventually([alice], () => alice.client.state.state === "online", "alice online again");
  assert.deepEqual(alice.client.userStreamCursor, { epoch: 2, seq: 0 });

  // The stream goes on in epoch 2: alice accepts, both events arrive from seq 1.
  await alice.client.api.request("POST", `/v1/friends/requests/${request.requestId}/accept`);
  await eventually([alice], () => alice.userEvents.some((e) => e.event === "friend.added"), "friend.added");
  const epoch2 = alice.userEvents.filter((e) => e.epoch === 2);
  assert.deepEqual(
    epoch2.map((e) => e.seq),
    epoch2.map((_, i) => i + 1),
    "epoch 2 from seq 1, no hole, no duplicate",
  );
  assert.ok(epoch2.some((e) => e.event === "friend.request" && e.data.action === "accepted"));
  const position = await alice.client.api.userStream({ epoch: 2, afterSeq: 0, limit: 0 });
  assert.deepEqual(alice.client.userStreamCursor, { epoch: 2, seq: position.lastSeq });

  // A reset while alice is online: nothing is pushed by the reset itself; the next event
  // comes in epoch 3, and alice rebuilds from it.
  const second = (await server.admin("POST", "/admin/users/alice/stream/reset")) as { epoch: number };
  assert.equal(second.epoch, 3);
  await bob.request("DELETE", "/v1/friends/alice");
  await eventually([alice], () => alice.userEvents.some((e) => e.epoch === 3), "an event of epoch 3");
  const pushed = alice.snapshots[2]!;
  assert.equal(pushed.reason, "epoch_changed");
  assert.equal(pushed.epoch, 3);
  assert.deepEqual(pushed.friends, [], "bob is no longer a friend in the reloaded snapshot");
  assert.deepEqual(
    alice.userEvents.filter((e) => e.epoch === 3).map((e) => [e.seq, e.event, e.data.userId]),
    [[1, "friend.removed", "bob"]],
  );
  assert.deepEqual(alice.client.userStreamCursor, { epoch: 3, seq: 1 });
  assert.equal(alice.snapshots.length, 3);
  assert.deepEqual(alice.errors, []);
});

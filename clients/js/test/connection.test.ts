// The connection's life: the heartbeat keeps a quiet client connected, the close codes that
// say "do not reconnect" stop it, a refused token is told apart from a network failure, and
// a server restart is ridden out with the unacked sends kept.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { CourierError, type StoredAck } from "../src/index.js";
import { client, eventually, online, text, type Recorded } from "./support/clients.js";
import { Link } from "./support/link.js";
import { startServer, type TestServer } from "./support/server.js";

const HEARTBEAT_SECS = 3;

let server: TestServer;
const opened: Recorded[] = [];

function open(token: string, deviceId: string): Recorded {
  const c = client(server, { token, deviceId });
  opened.push(c);
  return c;
}

before(async () => {
  // A device silent for 3 s is dropped, so a few seconds of quiet prove the heartbeat.
  server = await startServer({ heartbeatSecs: HEARTBEAT_SECS });
});

after(async () => {
  for (const c of opened) c.client.close();
  await server?.stop();
});

test("a silent socket is dropped with 4000; the client's pings keep its own session", async () => {
  const token = await server.register("quiet");
  // Without pings: the server closes the connection with 4000 (heartbeat_timeout).
  const raw = new WebSocket(`${server.url.replace("http", "ws")}/v1/ws?deviceId=raw&token=${token}`);
  const closed = new Promise<number>((resolve) => raw.addEventListener("close", (e) => resolve(e.code)));

  // The SDK pings after two thirds of the server's heartbeatSecs (2 s of 3) without sending.
  const quiet = open(token, "quiet-phone");
  quiet.client.connect();
  await online([quiet]);
  assert.equal(await closed, 4000);
  await eventually([quiet], () => quiet.pongs.length >= 3, "three pongs, 6 s: twice the heartbeat");
  assert.deepEqual(quiet.stateNames(), ["connecting", "syncing", "online"], "one session throughout");
});

test("replaced (4001): the older client stops for good, the newer stays", async () => {
  const token = await server.register("twin");
  const first = open(token, "same-device");
  first.client.connect();
  await online([first]);
  const second = open(token, "same-device");
  second.client.connect();
  await online([second]);
  await eventually([first], () => first.client.state.state === "closed", "the first client closed");
  assert.deepEqual(first.client.state, { state: "closed", reason: "replaced", code: 4001, error: undefined });
  assert.ok(!first.stateNames().includes("waiting"), "no reconnection was even scheduled");
  await assert.rejects(
    first.client.send({ conversationType: 1, peerId: "twin", ...text("x") }),
    (err: unknown) => err instanceof CourierError && err.code === "closed" && err.reason === "replaced",
  );
  // The newer one still works.
  const ack = (await second.client.send({ conversationType: 1, peerId: "quiet", ...text("still here") })) as StoredAck;
  assert.equal(ack.seq, 1);
  assert.equal(second.client.state.state, "online");
});

test("a kicked frame alone stops the client, even when the close code never arrives", async () => {
  const token = await server.register("kicked");
  const link = await Link.start(server);
  try {
    // The link delivers the kicked frame, then the connection dies without a close frame.
    link.onServerFrame = ({ json }) => (json?.type === "kicked" ? "cutAfter" : undefined);
    const first = client(server, { token, deviceId: "kicked-phone", wsUrl: link.wsUrl });
    opened.push(first);
    first.client.connect();
    await online([first]);
    const second = open(token, "kicked-phone");
    second.client.connect();
    await eventually([first], () => first.client.state.state === "closed", "the first client closed");
    assert.deepEqual(first.client.state, { state: "closed", reason: "replaced", code: 1006, error: undefined });
    assert.ok(!first.stateNames().includes("waiting"));
    assert.equal(link.accepted, 1, "no new connection was tried");
  } finally {
    await link.close();
  }
});

test("token_revoked (4003) and account_deleted (4004) stop the client", async () => {
  const revokedToken = await server.register("leaver");
  const revoked = open(revokedToken, "leaver-phone");
  revoked.client.connect();
  await online([revoked]);
  await revoked.client.api.request("POST", "/v1/auth/logout");
  await eventually([revoked], () => revoked.client.state.state === "closed", "closed after logout");
  assert.equal(revoked.client.state.state === "closed" && revoked.client.state.reason, "token_revoked");
  assert.equal(revoked.client.state.state === "closed" && revoked.client.state.code, 4003);

  const deletedToken = await server.register("goner");
  const deleted = open(deletedToken, "goner-phone");
  deleted.client.connect();
  await online([deleted]);
  await deleted.client.api.request("DELETE", "/v1/account", { body: { password: "password-goner" } });
  await eventually([deleted], () => deleted.client.state.state === "closed", "closed after deletion");
  assert.equal(deleted.client.state.state === "closed" && deleted.client.state.reason, "account_deleted");
  assert.equal(deleted.client.state.state === "closed" && deleted.client.state.code, 4004);
  assert.ok(!revoked.stateNames().includes("waiting") && !deleted.stateNames().includes("waiting"));
});

test("device_removed (4009) stops the client, from the close code alone too", async () => {
  const token = await server.register("owner");
  const link = await Link.start(server);
  try {
    // The kicked frame is dropped: only the close code says why.
    link.onServerFrame = ({ json }) => (json?.type === "kicked" ? "drop" : undefined);
    const phone = client(server, { token, deviceId: "old-phone", wsUrl: link.wsUrl });
    opened.push(phone);
    phone.client.connect();
    await online([phone]);
    const other = open(token, "new-phone");
    await other.client.api.request("DELETE", "/v1/devices/old-phone");
    await eventually([phone], () => phone.client.state.state === "closed", "closed after removal");
    assert.deepEqual(phone.client.state, { state: "closed", reason: "device_removed", code: 4009, error: undefined });
    assert.ok(!phone.stateNames().includes("waiting"), "no reconnection was even scheduled");
    assert.equal(link.accepted, 1, "no new connection was tried");
  } finally {
    await link.close();
  }
});

test("a device removed while its client was away ends the client at the next attempt", async () => {
  const token = await server.register("traveller");
  const link = await Link.start(server);
  try {
    const phone = client(server, { token, deviceId: "away-phone", wsUrl: link.wsUrl });
    opened.push(phone);
    phone.client.connect();
    await online([phone]);
    link.hold();
    link.cutAll();
    await eventually([phone], () => phone.client.state.state === "waiting", "offline");
    await open(token, "home-phone").client.api.request("DELETE", "/v1/devices/away-phone");
    link.release();
    await eventually([phone], () => phone.client.state.state === "closed", "closed at the next attempt");
    const state = phone.client.state;
    assert.ok(state.state === "closed");
    assert.equal(state.reason, "device_removed");
    assert.equal(state.error?.status, 403);
  } finally {
    await link.close();
  }
});

test("a token the server refuses ends the client instead of retrying forever", async () => {
  const refused = open("not-a-token", "nobody-phone");
  refused.client.connect();
  await eventually([refused], () => refused.client.state.state === "closed", "closed");
  const state = refused.client.state;
  assert.ok(state.state === "closed");
  assert.equal(state.reason, "unauthorized");
  assert.equal(state.error?.status, 401);
  assert.ok(!refused.stateNames().includes("online"));
});

test("a server restart (1001): the client comes back by itself and sends what waited", async () => {
  const sender = open(await server.register("patient"), "patient-phone");
  const reader = open(await server.register("reader"), "reader-phone");
  sender.client.connect();
  reader.client.connect();
  await online([sender, reader]);
  const first = (await sender.client.send({ conversationType: 1, peerId: "reader", ...text("before") })) as StoredAck;

  const restarted = server.restart();
  await eventually([sender], () => sender.client.state.state === "waiting", "the sender offline");
  const waiting = sender.states.find((s) => s.state === "waiting");
  assert.equal(waiting?.state === "waiting" && waiting.code, 1001, "the server said it is shutting down");
  // Sent while the server is away: kept in the outbox, sent on the next session.
  const during = sender.client.send({ conversationType: 1, conversationId: first.conversationId, ...text("during") });
  assert.equal(sender.client.pending.length, 1);
  await restarted;

  const ack = (await during) as StoredAck;
  assert.equal(ack.seq, 2);
  assert.equal(ack.duplicate, false);
  await eventually([reader], () => reader.seqs(first.conversationId).length >= 2, "both messages at the reader");
  assert.deepEqual(reader.texts(first.conversationId), ["before", "during"]);
  await online([sender, reader]);
});

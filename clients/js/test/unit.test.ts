// The SDK's pieces without a server: backoff bounds, the per-conversation ordering and
// de-duplication, the user stream's rebuilds, the outbox's resends.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  backoffDelay,
  ConversationSync,
  CourierClient,
  CourierError,
  MemoryCursorStore,
  UserStreamSync,
  type Message,
  type MessagePage,
  type UserStreamPage,
} from "../src/index.js";
import { Outbox } from "../src/outbox.js";

describe("backoff", () => {
  test("the first retry waits 0.25–0.5 s, each later ceiling doubles up to 30 s", () => {
    const options = { initialMs: 500, maxMs: 30_000 };
    const bounds = (attempt: number) => [backoffDelay(attempt, options, () => 0), backoffDelay(attempt, options, () => 1)];
    assert.deepEqual(bounds(0), [250, 500]);
    assert.deepEqual(bounds(1), [500, 1000]);
    assert.deepEqual(bounds(5), [8000, 16_000]);
    assert.deepEqual(bounds(6), [15_000, 30_000]);
    assert.deepEqual(bounds(1000), [15_000, 30_000]);
    for (let attempt = 0; attempt < 50; attempt++) {
      const delay = backoffDelay(attempt, options);
      const [low, high] = bounds(attempt);
      assert.ok(delay >= low! && delay <= high!, `attempt ${attempt}: ${delay}`);
    }
  });
});

function message(conversationId: number, seq: number): Message {
  return { conversationType: 1, conversationId, seq, msgId: `m${seq}`, senderId: "a", contentType: 1, payload: { text: `${seq}` }, serverTime: seq };
}

/** A conversation the "server" holds: seqs 1..last, less the invisible ones. */
function fakeServer(last: () => number, invisible: Set<number> = new Set()) {
  const pulls: number[] = [];
  const pull = async (conversationId: number, afterSeq: number): Promise<MessagePage> => {
    pulls.push(afterSeq);
    const messages: Message[] = [];
    for (let seq = afterSeq + 1; seq <= last() && messages.length < 3; seq++) {
      if (!invisible.has(seq)) messages.push(message(conversationId, seq));
    }
    const through = messages.at(-1)?.seq ?? last();
    return { conversationId, conversationType: 1, lastSeq: last(), hasMore: through < last(), messages };
  };
  return { pull, pulls };
}

describe("conversation sync", () => {
  test("duplicates are dropped, a gap is pulled first, everything comes once and in order", async () => {
    let last = 1;
    const server = fakeServer(() => last);
    const emitted: number[] = [];
    const store = new MemoryCursorStore();
    const sync = new ConversationSync({ store, pull: server.pull, emit: (m) => emitted.push(m.seq) });

    await sync.push(message(7, 1));
    await sync.push(message(7, 1)); // a resend's original pushed again
    assert.deepEqual(emitted, [1]);
    assert.deepEqual(server.pulls, [], "in order: no pull");

    last = 8;
    // Pushes 2..7 were lost; 8 arrives, then a late 5, then 8 again.
    await Promise.all([sync.push(message(7, 8)), sync.push(message(7, 5)), sync.push(message(7, 8))]);
    assert.deepEqual(emitted, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert.deepEqual(server.pulls, [1, 4, 7], "the gap pulled page by page from the cursor");
    assert.equal(await store.getSeq(7), 8);
    assert.equal(sync.seq(7), 8);
  });

  test("seqs never visible (a group before joining) leave no hole to wait for", async () => {
    const server = fakeServer(() => 10, new Set([1, 2, 3, 4, 5, 6]));
    const emitted: number[] = [];
    const sync = new ConversationSync({ store: new MemoryCursorStore(), pull: server.pull, emit: (m) => emitted.push(m.seq) });
    await sync.push(message(3, 8));
    assert.deepEqual(emitted, [7, 8, 9, 10], "the pull went on until the server had no more");
    assert.deepEqual(server.pulls, [0, 9]);
    await sync.push(message(3, 10));
    assert.deepEqual(emitted, [7, 8, 9, 10]);
    assert.deepEqual(server.pulls, [0, 9], "nothing to pull for a seq already emitted");
  });

  test("catch-up starts from the stored cursor, and a failed pull emits nothing past the gap", async () => {
    let failing = true;
    const server = fakeServer(() => 6);
    const emitted: number[] = [];
    const store = new MemoryCursorStore({ conversations: { 4: 3 } });
    const sync = new ConversationSync({
      store,
      pull: (id, after) => (failing ? Promise.reject(new CourierError("network", "down")) : server.pull(id, after)),
      emit: (m) => emitted.push(m.seq),
    });
    await assert.rejects(sync.push(message(4, 6)));
    assert.deepEqual(emitted, [], "6 is not emitted before 4 and 5");
    failing = false;
    await sync.catchUp(4, 6);
    assert.deepEqual(emitted, [4, 5, 6]);
    assert.deepEqual(server.pulls, [3]);
  });
});

describe("user stream sync", () => {
  test("resync_required reloads the snapshots and goes on from seq 0 of the new epoch", async () => {
    let epoch = 1;
    const events = new Map<number, number[]>([
      [1, [1, 2, 3]],
      [2, [1]],
    ]);
    const queries: string[] = [];
    const pull = async (query: { epoch?: number; afterSeq?: number; limit?: number }): Promise<UserStreamPage> => {
      queries.push(JSON.stringify(query));
      if (query.epoch !== undefined && query.epoch !== epoch) throw new CourierError("resync_required", "epoch", { status: 409 });
      const all = events.get(epoch)!;
      const after = query.afterSeq ?? 0;
      const page = query.limit === 0 ? [] : all.filter((s) => s > after);
      return {
        epoch,
        lastSeq: all.at(-1) ?? 0,
        hasMore: false,
        events: page.map((seq) => ({ seq, event: "friend.added", serverTime: seq, data: { userId: `u${seq}` } })),
      };
    };
    const seen: string[] = [];
    const store = new MemoryCursorStore({ userStream: { epoch: 1, seq: 1 } });
    const sync = new UserStreamSync({
      store,
      pull,
      loadSnapshot: async () => ({ friends: [], friendRequestsIn: [], friendRequestsOut: [], blocks: [], groups: [] }),
      emitSnapshot: (s) => seen.push(`snapshot ${s.reason} ${s.epoch}`),
      emitEvent: (e) => seen.push(`event ${e.epoch}.${e.seq}`),
    });
    await sync.catchUp();
    assert.deepEqual(seen, ["event 1.2", "event 1.3"]);
    await sync.push({ epoch: 1, seq: 3, event: "friend.added", serverTime: 3, data: {} });
    assert.deepEqual(seen, ["event 1.2", "event 1.3"], "an event already applied is ignored");

    epoch = 2;
    await sync.catchUp();
    assert.deepEqual(seen.slice(2), ["snapshot resync_required 2", "event 2.1"]);
    assert.deepEqual(await store.getUserStream(), { epoch: 2, seq: 1 });
    const asked = queries.length;
    await sync.push({ epoch: 1, seq: 4, event: "friend.added", serverTime: 4, data: {} });
    assert.equal(queries.length, asked, "a late push of the old epoch is ignored: no rebuild");
    assert.equal(seen.length, 4);
    assert.deepEqual(queries, [
      JSON.stringify({ epoch: 1, afterSeq: 1 }),
      JSON.stringify({ epoch: 1, afterSeq: 3 }),
      JSON.stringify({ limit: 0 }),
      JSON.stringify({ epoch: 2, afterSeq: 0 }),
    ]);
  });
});

describe("outbox", () => {
  test("resends the same frame on each timeout, then fails; a new session resends at once", async () => {
    const sent: string[] = [];
    let open = true;
    const outbox = new Outbox({ send: (t) => (open ? (sent.push(t), true) : false), maxFrameBytes: () => 1000 }, [20, 20, 20]);
    const input = { conversationType: 1 as const, peerId: "b", contentType: 1, payload: { text: "x" }, clientMsgId: "c1" };
    await assert.rejects(outbox.submit(input), (e: unknown) => e instanceof CourierError && e.code === "timeout");
    assert.equal(sent.length, 3);
    assert.equal(new Set(sent).size, 1, "the very same frame each time");

    sent.length = 0;
    open = false;
    const waiting = outbox.submit({ ...input, clientMsgId: "c2" });
    assert.equal(sent.length, 0, "no session: it waits");
    open = true;
    outbox.resendAll();
    assert.equal(sent.length, 1);
    const id = JSON.parse(sent[0]!).id as string;
    outbox.acked(id, { msgId: "1", conversationId: 1, conversationType: 1, seq: 1, serverTime: 1, duplicate: false });
    assert.equal((await waiting as { seq: number }).seq, 1);
    assert.equal(outbox.pending.length, 0);
  });

  test("a retryable refusal waits for the next resend; another code fails at once; too large never goes", async () => {
    const sent: string[] = [];
    const outbox = new Outbox({ send: (t) => (sent.push(t), true), maxFrameBytes: () => 200 }, [20, 20]);
    const input = { conversationType: 1 as const, peerId: "b", contentType: 1, payload: { text: "x" }, clientMsgId: "r1" };
    const limited = outbox.submit(input);
    const id = JSON.parse(sent[0]!).id as string;
    outbox.refused({ type: "error", id, code: "rate_limited", message: "slow down" });
    assert.equal(outbox.pending.length, 1);
    await assert.rejects(limited, (e: unknown) => e instanceof CourierError && e.code === "rate_limited");
    assert.equal(sent.length, 2, "resent once before giving up with the last refusal");

    const invalid = outbox.submit({ ...input, clientMsgId: "r2" });
    outbox.refused({ type: "error", id: JSON.parse(sent.at(-1)!).id, code: "payload_invalid", reason: "empty", message: "text must not be empty" });
    await assert.rejects(invalid, (e: unknown) => e instanceof CourierError && e.code === "payload_invalid" && e.reason === "empty");

    const count = sent.length;
    await assert.rejects(
      outbox.submit({ ...input, clientMsgId: "r3", payload: { text: "x".repeat(300) } }),
      (e: unknown) => e instanceof CourierError && e.code === "frame_too_large",
    );
    assert.equal(sent.length, count);
  });
});

describe("client", () => {
  test("a send before connect() waits in the outbox; close() fails it with closed", async () => {
    const client = new CourierClient({ url: "http://127.0.0.1:9", token: "t", deviceId: "d" });
    const sent = client.send({ conversationType: 1, peerId: "b", contentType: 1, payload: { text: "x" } });
    assert.equal(client.pending.length, 1);
    assert.match(client.pending[0]!.clientMsgId, /^[0-9a-f]{32}$/, "a fresh random clientMsgId");
    client.close();
    await assert.rejects(sent, (e: unknown) => e instanceof CourierError && e.code === "closed");
    assert.deepEqual(client.state, { state: "closed", reason: "closed_by_client", code: undefined, error: undefined });
    await assert.rejects(
      client.send({ conversationType: 1, peerId: "b", contentType: 1, payload: { text: "y" } }),
      (e: unknown) => e instanceof CourierError && e.code === "closed",
    );
  });
});

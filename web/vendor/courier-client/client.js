import { backoffDelay, DEFAULT_BACKOFF } from "./backoff.js";
import { Connection } from "./connection.js";
import { Emitter } from "./emitter.js";
import { CourierError } from "./errors.js";
import { Api } from "./http.js";
import { DEFAULT_ACK_TIMEOUTS_MS, Outbox } from "./outbox.js";
import { Overview } from "./overview.js";
import { MemoryCursorStore } from "./store.js";
import { ConversationSync, UserStreamSync } from "./sync.js";
import { ContentType, } from "./types.js";
const PULL_CONCURRENCY = 4;
const MAX_SYNC_RETRIES = 20;
/**
 * A Courier client for one user on one device: the WebSocket kept up, sends acked and
 * retried, and every message emitted once, in seq order, by the catch-up algorithm of
 * docs/protocol.md.
 */
export class CourierClient extends Emitter {
    /** The HTTP API with this client's token, for the endpoints the client does not wrap. */
    api;
    #options;
    #store;
    #connection;
    #outbox;
    #conversations;
    #users;
    #overview;
    /** Retries waiting to run; cleared on a final close. */
    #timers = new Set();
    #backoff;
    #random;
    #token;
    #state = { state: "idle" };
    #userId;
    /** Grows with every session and every close: work of an older one stops emitting states. */
    #session = 0;
    constructor(options) {
        super();
        this.#options = options;
        this.#token = options.token;
        this.#store = options.store ?? new MemoryCursorStore();
        this.#backoff = { ...DEFAULT_BACKOFF, ...options.backoff };
        this.#random = options.random ?? Math.random;
        this.api = new Api({
            url: options.url,
            token: () => this.#token,
            fetch: options.fetch,
            timeoutMs: options.requestTimeoutMs,
        });
        const WebSocketImpl = options.WebSocket ?? globalThis.WebSocket;
        if (!WebSocketImpl)
            throw new Error("no global WebSocket: pass the `WebSocket` option");
        this.#connection = new Connection({
            url: () => this.#socketUrl(),
            WebSocket: WebSocketImpl,
            pingAfterMs: options.pingAfterMs ?? 60_000,
            pongTimeoutMs: options.pongTimeoutMs ?? 30_000,
            handshakeTimeoutMs: options.handshakeTimeoutMs ?? 15_000,
            backoff: this.#backoff,
            random: this.#random,
            checkAuth: () => this.#checkAuth(),
        });
        this.#outbox = new Outbox({
            send: (text) => this.#connection.send(text),
            maxFrameBytes: () => this.#connection.hello?.maxFrameBytes,
        }, options.ackTimeoutsMs ?? DEFAULT_ACK_TIMEOUTS_MS);
        const pullPageSize = options.pullPageSize ?? 100;
        this.#conversations = new ConversationSync({
            store: this.#store,
            pull: (id, afterSeq) => this.api.messagesAfter(id, afterSeq, pullPageSize),
            emit: (message) => this.#deliver(message),
        });
        this.#overview = new Overview({
            load: (id) => this.api.conversation(id),
            emit: (conversation) => this.emit("conversation", conversation),
            failed: (err) => this.emit("syncError", asCourierError(err)),
            active: () => this.#state.state !== "closed",
        });
        this.#users = new UserStreamSync({
            store: this.#store,
            pull: (query) => this.api.userStream({ ...query, limit: query.limit ?? pullPageSize }),
            loadSnapshot: () => this.#loadSnapshot(),
            emitSnapshot: (snapshot) => this.emit("snapshot", snapshot),
            emitEvent: (event) => this.emit("userEvent", event),
        });
        this.#wireConnection();
    }
    get state() {
        return this.#state;
    }
    /** The user of the open session (known from the first `hello` on). */
    get userId() {
        return this.#userId;
    }
    /** The overview as last told by the server, most recently active first. */
    get conversations() {
        return this.#overview.list();
    }
    /** The sends waiting for their ack, oldest first. */
    get pending() {
        return this.#outbox.pending;
    }
    /** The user stream's cursor, once loaded. */
    get userStreamCursor() {
        return this.#users.cursor;
    }
    /** The highest seq emitted for a conversation in this session (all below it emitted). */
    seq(conversationId) {
        return this.#conversations.seq(conversationId);
    }
    /** Opens the WebSocket and keeps it up; after a final close, starts again. */
    connect() {
        this.#connection.start();
    }
    /** Closes the WebSocket and stops reconnecting; pending sends fail with `closed`. */
    close() {
        this.#connection.stop();
    }
    /** A new token (after a login): used by the next request and the next connection. */
    setToken(token) {
        this.#token = token;
    }
    /**
     * Sends a message; resolves with its ack once the server committed it (a live kind: once
     * it was queued to the online devices). Without an ack it is resent with the same
     * `clientMsgId` after 1 s, 2 s and 4 s, and on every new connection, and fails with
     * `timeout` 8 s after the last attempt; any other refusal fails it with the server's code.
     * The message is also emitted as a `message` event at its seq, in order with the others.
     * Sends made before `connect()` or while reconnecting wait for the session; after a final
     * close they fail at once with `closed`.
     */
    send(input) {
        if (this.#state.state === "closed")
            return Promise.reject(this.#closedError(this.#state.reason));
        const outgoing = { ...input, clientMsgId: input.clientMsgId ?? newClientMsgId() };
        const sent = this.#outbox.submit(outgoing);
        void sent.then((ack) => {
            if (!("live" in ack))
                this.#ownMessage(outgoing, ack);
        }, () => { });
        return sent;
    }
    /** Sends a typing state (a live kind): once, now, never resent. */
    typing(target, state) {
        if (this.#state.state === "closed")
            return Promise.reject(this.#closedError(this.#state.reason));
        const input = { ...target, contentType: ContentType.typing, payload: { state }, clientMsgId: newClientMsgId() };
        return this.#outbox.submit(input, { once: true });
    }
    /** Moves your read position (forward only) and updates the overview entry. */
    async markRead(conversationId, seq) {
        const position = await this.api.markRead(conversationId, seq);
        this.#overview.read(conversationId, position.readSeq, position.unread);
        return position;
    }
    /**
     * Tells the server this device received the conversation up to `seq` (send it for the
     * highest seq shown, once per burst): the peer of a private conversation gets a
     * `delivered` receipt, and group receipts count it.
     */
    markReceived(conversationId, seq) {
        return this.api.received(conversationId, seq);
    }
    #wireConnection() {
        const connection = this.#connection;
        connection.on("connecting", ({ attempt }) => this.#setState({ state: "connecting", attempt }));
        connection.on("open", (hello) => {
            const session = ++this.#session;
            this.#userId = hello.userId;
            this.#setState({ state: "syncing", hello });
            this.#outbox.resendAll();
            void this.#catchUp(session, hello);
        });
        let lastDown = { code: 1006, reason: "" };
        connection.on("down", (down) => {
            this.#session++;
            lastDown = down;
            this.#outbox.pause();
        });
        connection.on("waiting", ({ attempt, delayMs }) => this.#setState({ state: "waiting", attempt, delayMs, code: lastDown.code, reason: lastDown.reason }));
        connection.on("closed", ({ reason, code, error }) => {
            this.#session++;
            for (const timer of this.#timers)
                clearTimeout(timer);
            this.#timers.clear();
            this.#outbox.failAll(this.#closedError(reason));
            this.#setState({ state: "closed", reason, code, error });
        });
        connection.on("pong", (pong) => this.emit("pong", pong));
        connection.on("frame", (frame) => this.#onFrame(frame));
    }
    #onFrame(frame) {
        switch (frame.type) {
            case "ack":
                if ("seq" in frame || "live" in frame)
                    this.#outbox.acked(frame.id ?? "", frame);
                return;
            case "error":
                if (this.#outbox.has(frame.id))
                    this.#outbox.refused(frame);
                else
                    this.emit("syncError", new CourierError(frame.code, frame.message, { reason: frame.reason }));
                return;
            case "notify":
                if (frame.conversationType === 0) {
                    const { type: _type, ...event } = frame;
                    this.#pushUserEvent(event);
                }
                else if ("seq" in frame && typeof frame.seq === "number") {
                    this.#pushMessage(frame);
                }
                else if (frame.contentType === ContentType.typing) {
                    const state = frame.payload?.state ?? "";
                    const { conversationId, conversationType, senderId } = frame;
                    this.emit("typing", { conversationId, conversationType, userId: senderId, state });
                }
                else {
                    this.emit("live", frame);
                }
                return;
            case "read": {
                const { conversationId, userId, readSeq, unread } = frame;
                if (userId === this.#userId && unread !== undefined)
                    this.#overview.read(conversationId, readSeq, unread);
                this.emit("read", unread === undefined ? { conversationId, userId, readSeq } : { conversationId, userId, readSeq, unread });
                return;
            }
            case "delivered": {
                const { conversationId, userId, seq } = frame;
                this.emit("delivered", { conversationId, userId, seq });
                return;
            }
            case "presence": {
                const { userId, online, serverTime } = frame;
                this.emit("presence", { userId, online, serverTime });
                return;
            }
            default:
                return; // hello, pong and kicked are the connection's
        }
    }
    /** A pushed message: applied in order; a failed gap pull is tried again with backoff. */
    #pushMessage(frame, retry = 0) {
        const { type: _type, ...message } = frame;
        this.#conversations.push(message).catch((err) => {
            this.emit("syncError", asCourierError(err));
            if (retry >= MAX_SYNC_RETRIES || this.#state.state === "closed")
                return;
            this.#later(backoffDelay(retry, this.#backoff, this.#random), () => this.#pushMessage(message, retry + 1));
        });
    }
    /** A pushed user-stream event; after a failure the stream is pulled again with backoff. */
    #pushUserEvent(event) {
        const retry = (attempt) => (err) => {
            this.emit("syncError", asCourierError(err));
            if (attempt >= MAX_SYNC_RETRIES || this.#state.state === "closed")
                return;
            this.#later(backoffDelay(attempt, this.#backoff, this.#random), () => {
                this.#users.catchUp().catch(retry(attempt + 1));
            });
        };
        this.#users.push(event).catch(retry(0));
    }
    #ownMessage(input, ack) {
        const message = {
            conversationType: ack.conversationType,
            conversationId: ack.conversationId,
            seq: ack.seq,
            msgId: ack.msgId,
            senderId: this.#userId ?? "",
            contentType: input.contentType,
            payload: input.payload === undefined ? null : JSON.parse(JSON.stringify(input.payload)),
            serverTime: ack.serverTime,
        };
        this.#pushMessage(message);
    }
    /** Steps 2–5 of "Catching up" for a session that just opened; retried while it lasts. */
    async #catchUp(session, hello) {
        for (let retry = 0; retry <= MAX_SYNC_RETRIES; retry++) {
            try {
                await Promise.all([this.#users.catchUp(), this.#catchUpConversations()]);
                if (session !== this.#session)
                    return;
                this.#connection.resetBackoff();
                this.#setState({ state: "online", hello });
                return;
            }
            catch (err) {
                if (session !== this.#session)
                    return;
                this.emit("syncError", asCourierError(err));
                const delay = backoffDelay(retry, this.#backoff, this.#random);
                await new Promise((resolve) => this.#later(delay, resolve));
                if (session !== this.#session)
                    return;
            }
        }
    }
    /** The overview, page by page; each conversation behind it is pulled (a few at a time). */
    async #catchUpConversations() {
        const pageSize = this.#options.overviewPageSize ?? 50;
        const pulls = [];
        const limit = limiter(PULL_CONCURRENCY);
        let cursor = null;
        try {
            for (let page = 0; page < 100_000; page++) {
                const result = await this.api.conversations(pageSize, cursor);
                for (const conversation of result.conversations) {
                    this.#overview.set(conversation);
                    const { conversationId, lastSeq } = conversation;
                    pulls.push(limit(() => this.#conversations.catchUp(conversationId, lastSeq)));
                }
                if (!result.nextCursor)
                    break;
                cursor = result.nextCursor;
            }
        }
        finally {
            // Wait for the pulls started so far even when a page failed, so none outlives the retry.
            const outcomes = await Promise.allSettled(pulls);
            const failed = outcomes.find((o) => o.status === "rejected");
            if (failed)
                throw failed.reason;
        }
    }
    #deliver(message) {
        this.emit("message", message);
        if (message.contentType === ContentType.recall) {
            const targetSeq = message.payload?.seq;
            if (typeof targetSeq === "number") {
                const { conversationId, conversationType, seq, senderId } = message;
                this.emit("recall", { conversationId, conversationType, seq, targetSeq, senderId });
            }
        }
        this.#overview.message(message);
    }
    async #loadSnapshot() {
        const [friends, friendRequestsIn, friendRequestsOut, blocks, groups] = await Promise.all([
            this.api.friends(),
            this.api.friendRequests("in"),
            this.api.friendRequests("out"),
            this.api.blocks(),
            this.api.groups(),
        ]);
        return { friends, friendRequestsIn, friendRequestsOut, blocks, groups };
    }
    /**
     * Asked after a connection attempt failed before its `hello`: is the token refused? And,
     * for a device that had a session before (so the server registered it), was it removed
     * since? A removed device is not listed, and may not connect until registered again.
     */
    async #checkAuth() {
        try {
            await this.api.userStream({ limit: 0 });
            if (this.#userId === undefined)
                return undefined;
            const { devices } = await this.api.request("GET", "/v1/devices");
            if (devices.some((d) => d.deviceId === this.#options.deviceId))
                return undefined;
            return new CourierError("device_removed", "this device was removed by its user: register it again (POST /v1/devices) to connect", { status: 403 });
        }
        catch (err) {
            return err instanceof CourierError && err.status === 401 ? err : undefined;
        }
    }
    #socketUrl() {
        const base = (this.#options.wsUrl ?? this.#options.url.replace(/^http/, "ws")).replace(/\/+$/, "");
        const query = `deviceId=${encodeURIComponent(this.#options.deviceId)}&token=${encodeURIComponent(this.#token)}`;
        return `${base}/v1/ws?${query}${this.#options.presence ? "&presence=true" : ""}`;
    }
    #closedError(reason) {
        return new CourierError("closed", `the client is closed (${reason})`, { reason });
    }
    /** Runs `task` after `ms`, unless the client closes first. */
    #later(ms, task) {
        const timer = setTimeout(() => {
            this.#timers.delete(timer);
            task();
        }, ms);
        this.#timers.add(timer);
    }
    #setState(state) {
        this.#state = state;
        this.emit("state", state);
    }
}
/** A fresh random `clientMsgId`: 32 hex digits. */
export function newClientMsgId() {
    const bytes = new Uint8Array(16);
    globalThis.crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
function asCourierError(err) {
    return err instanceof CourierError ? err : new CourierError("internal", String(err), { cause: err });
}
/** Runs at most `n` of the tasks given to it at once. */
function limiter(n) {
    let running = 0;
    const waiting = [];
    return async (task) => {
        if (running >= n)
            await new Promise((resolve) => waiting.push(resolve));
        else
            running++;
        try {
            return await task();
        }
        finally {
            const next = waiting.shift();
            if (next)
                next(); // the slot passes on
            else
                running--;
        }
    };
}

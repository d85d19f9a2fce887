import { CourierError, RETRYABLE_SEND_CODES } from "./errors.js";
/** Waits for an ack: attempt i (0-based) waits `ACK_TIMEOUTS_MS[i]` before the next. */
export const DEFAULT_ACK_TIMEOUTS_MS = [1000, 2000, 4000, 8000];
/**
 * The sends not yet acked, oldest first. Each goes out as soon as a session is open; without
 * an answer it is resent, the same frame with the same `clientMsgId`, after each of
 * `timeoutsMs` (1 s, 2 s, 4 s), and fails after the last (8 s more). A lost connection
 * keeps every entry: the next session resends them all, each counting as one more attempt.
 * The server stores a `clientMsgId` once, so a resend never makes a second message.
 */
export class Outbox {
    #entries = new Map();
    #transport;
    #timeoutsMs;
    #ids = 0;
    constructor(transport, timeoutsMs = DEFAULT_ACK_TIMEOUTS_MS) {
        if (timeoutsMs.length === 0)
            throw new Error("ackTimeoutsMs needs at least one entry");
        this.#transport = transport;
        this.#timeoutsMs = timeoutsMs;
    }
    /** The sends waiting for their ack, oldest first. */
    get pending() {
        return [...this.#entries.values()].map((e) => e.input);
    }
    /**
     * Queues a send. With `once`, it is sent now or never: it fails with `offline` when no
     * session is open or the session goes before its ack, and with `timeout` after the first
     * wait.
     */
    submit(input, options = {}) {
        return new Promise((resolve, reject) => {
            const id = `s${++this.#ids}`;
            const text = JSON.stringify({ type: "send", id, ...input });
            const once = options.once ?? false;
            const entry = { id, input, text, attempts: 0, once, resolve, reject };
            this.#entries.set(id, entry);
            this.#attempt(entry);
        });
    }
    /** A session opened: every unacked send goes out on it, oldest first. */
    resendAll() {
        for (const entry of [...this.#entries.values()])
            this.#attempt(entry);
    }
    /** The session is gone: nothing is in flight; the entries wait for the next one. */
    pause() {
        for (const entry of [...this.#entries.values()]) {
            clearTimeout(entry.timer);
            entry.timer = undefined;
            if (entry.once)
                this.#settle(entry, () => entry.reject(offline()));
        }
    }
    /** The entry an answer with this `id` belongs to, if any. */
    has(id) {
        return id !== undefined && this.#entries.has(id);
    }
    acked(id, ack) {
        const entry = this.#entries.get(id);
        if (entry)
            this.#settle(entry, () => entry.resolve(ack));
    }
    /** An `error` answer: a retryable code waits for the next resend, any other fails. */
    refused(frame) {
        const entry = frame.id === undefined ? undefined : this.#entries.get(frame.id);
        if (!entry)
            return;
        const error = new CourierError(frame.code, frame.message, { reason: frame.reason });
        if (RETRYABLE_SEND_CODES.has(frame.code)) {
            entry.lastError = error;
            return;
        }
        this.#settle(entry, () => entry.reject(error));
    }
    /** Fails every entry (the client closed, or the server ended the session for good). */
    failAll(error) {
        for (const entry of [...this.#entries.values()])
            this.#settle(entry, () => entry.reject(error));
    }
    #attempt(entry) {
        clearTimeout(entry.timer);
        entry.timer = undefined;
        const max = this.#transport.maxFrameBytes();
        if (max !== undefined && new TextEncoder().encode(entry.text).length > max) {
            const error = new CourierError("frame_too_large", `the send frame is over the server's ${max} bytes`);
            this.#settle(entry, () => entry.reject(error));
            return;
        }
        if (!this.#transport.send(entry.text)) {
            if (entry.once)
                this.#settle(entry, () => entry.reject(offline()));
            return; // waits for the next session
        }
        const wait = this.#timeoutsMs[Math.min(entry.attempts, this.#timeoutsMs.length - 1)];
        entry.attempts += 1;
        entry.timer = setTimeout(() => this.#expired(entry), wait);
    }
    #expired(entry) {
        entry.timer = undefined;
        if (!entry.once && entry.attempts < this.#timeoutsMs.length) {
            this.#attempt(entry);
            return;
        }
        const error = entry.lastError ??
            new CourierError("timeout", `no ack for ${entry.input.clientMsgId} after ${entry.attempts} attempts`);
        this.#settle(entry, () => entry.reject(error));
    }
    #settle(entry, settle) {
        clearTimeout(entry.timer);
        this.#entries.delete(entry.id);
        settle();
    }
}
function offline() {
    return new CourierError("offline", "no open session to send on");
}

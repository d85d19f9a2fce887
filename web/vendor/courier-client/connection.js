import { backoffDelay } from "./backoff.js";
import { Emitter } from "./emitter.js";
/** Close codes after which the SDK does not reconnect by itself, with their reason. */
export const FINAL_CLOSE_CODES = {
    4001: "replaced",
    4003: "token_revoked",
    4004: "account_deleted",
    4009: "device_removed",
};
/** How long a close event may follow an error event before the link is given up. */
const ERROR_CLOSE_GRACE_MS = 1000;
/**
 * One device's WebSocket, kept up: it opens the socket, waits for `hello`, pings after
 * silence, gives up on a link that stopped answering, and reconnects with jittered
 * exponential backoff — except after the close codes that say not to (`replaced`,
 * `token_revoked`, `account_deleted`, `device_removed`, or a `kicked` frame with one of
 * them).
 */
export class Connection extends Emitter {
    #options;
    #state = "idle";
    #link;
    #attempt = 0;
    #retryTimer;
    #kicked;
    #pings = 0;
    constructor(options) {
        super();
        this.#options = options;
    }
    get state() {
        return this.#state;
    }
    /** The `hello` of the open session, if one is open. */
    get hello() {
        return this.#state === "open" ? this.#link?.hello : undefined;
    }
    /** Starts connecting (again, after a final close); does nothing while running. */
    start() {
        if (this.#state !== "idle" && this.#state !== "closed")
            return;
        this.#kicked = undefined;
        this.#attempt = 0;
        this.#open();
    }
    /** Closes the socket (1000) and stops reconnecting. */
    stop(reason = "closed_by_client") {
        if (this.#state === "closed")
            return;
        clearTimeout(this.#retryTimer);
        const link = this.#link;
        this.#link = undefined;
        if (link)
            this.#dispose(link, 1000);
        this.#finish(reason);
    }
    /** The session stayed up long enough: the next failure starts the backoff afresh. */
    resetBackoff() {
        this.#attempt = 0;
    }
    /** Sends one text frame on the open session; false when there is none. */
    send(text) {
        const link = this.#link;
        if (this.#state !== "open" || !link)
            return false;
        try {
            link.ws.send(text);
        }
        catch {
            return false;
        }
        this.#schedulePing(link);
        return true;
    }
    #open() {
        this.#state = "connecting";
        this.emit("connecting", { attempt: this.#attempt });
        let ws;
        try {
            ws = new this.#options.WebSocket(this.#options.url());
        }
        catch (err) {
            void this.#lost(undefined, { code: 1006, reason: String(err), hadSession: false });
            return;
        }
        const link = { ws };
        this.#link = link;
        ws.onmessage = (event) => this.#onMessage(link, event.data);
        ws.onclose = (event) => {
            if (link !== this.#link)
                return;
            this.#dispose(link);
            void this.#lost(link, { code: event.code ?? 1006, reason: event.reason ?? "", hadSession: !!link.hello });
        };
        // Browsers follow an error with a close; Node 20's WebSocket may not (a refused upgrade
        // or connection fires only the error). Before the hello the attempt has failed; after
        // it, the close is waited for a moment, to keep its code.
        ws.onerror = () => {
            if (link !== this.#link)
                return;
            if (!link.hello)
                this.#abandon(link, "connect_failed");
            else
                link.errorTimer ??= setTimeout(() => this.#abandon(link, "socket_error"), ERROR_CLOSE_GRACE_MS);
        };
        link.handshakeTimer = setTimeout(() => this.#abandon(link, "handshake_timeout"), this.#options.handshakeTimeoutMs);
    }
    #onMessage(link, data) {
        if (link !== this.#link)
            return;
        clearTimeout(link.pongTimer);
        link.pongTimer = undefined;
        if (typeof data !== "string")
            return; // the server sends text frames only
        let frame;
        try {
            frame = JSON.parse(data);
        }
        catch {
            return;
        }
        switch (frame.type) {
            case "hello":
                clearTimeout(link.handshakeTimer);
                link.hello = frame;
                this.#state = "open";
                this.#schedulePing(link);
                this.emit("open", frame);
                return;
            case "kicked":
                this.#kicked = frame.reason;
                break;
            case "pong":
                if (link.pingSentAt !== undefined)
                    this.emit("pong", { rttMs: Date.now() - link.pingSentAt });
                break;
        }
        this.emit("frame", frame);
    }
    #schedulePing(link) {
        clearTimeout(link.pingTimer);
        const heartbeatMs = (link.hello?.heartbeatSecs ?? 90) * 1000;
        const after = Math.min(this.#options.pingAfterMs, Math.floor((heartbeatMs * 2) / 3));
        link.pingTimer = setTimeout(() => this.#ping(link), after);
    }
    #ping(link) {
        if (link !== this.#link)
            return;
        link.pingSentAt = Date.now();
        if (!this.send(JSON.stringify({ type: "ping", id: `p${++this.#pings}` })))
            return;
        link.pongTimer ??= setTimeout(() => this.#abandon(link, "no_pong"), this.#options.pongTimeoutMs);
    }
    /** A link that stopped answering: drop it without waiting for its close. */
    #abandon(link, reason) {
        if (link !== this.#link)
            return;
        this.#dispose(link, 1000);
        void this.#lost(link, { code: 1006, reason, hadSession: !!link.hello });
    }
    #dispose(link, closeCode) {
        clearTimeout(link.handshakeTimer);
        clearTimeout(link.pingTimer);
        clearTimeout(link.pongTimer);
        clearTimeout(link.errorTimer);
        link.ws.onmessage = link.ws.onclose = link.ws.onerror = link.ws.onopen = null;
        if (closeCode !== undefined) {
            try {
                link.ws.close(closeCode);
            }
            catch {
                // already closing
            }
        }
    }
    async #lost(link, down) {
        if (link && link !== this.#link)
            return;
        this.#link = undefined;
        this.#state = "waiting";
        this.emit("down", down);
        const final = this.#kicked ?? FINAL_CLOSE_CODES[down.code];
        if (final) {
            this.#finish(final, down.code);
            return;
        }
        if (!down.hadSession && this.#options.checkAuth) {
            const refused = await this.#options.checkAuth();
            if (this.#state !== "waiting" || this.#link)
                return; // stopped meanwhile
            if (refused) {
                this.#finish(refused.code, undefined, refused);
                return;
            }
        }
        const attempt = this.#attempt++;
        const delayMs = backoffDelay(attempt, this.#options.backoff, this.#options.random);
        this.emit("waiting", { attempt, delayMs });
        this.#retryTimer = setTimeout(() => this.#open(), delayMs);
    }
    #finish(reason, code, error) {
        clearTimeout(this.#retryTimer);
        this.#state = "closed";
        this.emit("closed", { reason, code, error });
    }
}

import { CourierError } from "./errors.js";
/**
 * The HTTP half of the protocol: JSON in, JSON out, every error as a `CourierError` with the
 * server's stable code. Typed methods for the sync and snapshot endpoints; `request` for any
 * other endpoint of docs/protocol.md.
 */
export class Api {
    url;
    #token;
    #fetch;
    #timeoutMs;
    constructor(options) {
        this.url = options.url.replace(/\/+$/, "");
        this.#token = options.token;
        this.#fetch = options.fetch ?? defaultFetch();
        this.#timeoutMs = options.timeoutMs ?? 30_000;
    }
    async request(method, path, options = {}) {
        let url = this.url + path;
        const params = Object.entries(options.query ?? {}).filter(([, v]) => v !== undefined);
        if (params.length > 0) {
            url += "?" + params.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`).join("&");
        }
        const headers = {};
        const token = this.#token?.();
        if (token)
            headers["authorization"] = `Bearer ${token}`;
        let body;
        if (options.body !== undefined) {
            headers["content-type"] = "application/json";
            body = JSON.stringify(options.body);
        }
        const abort = new AbortController();
        const timer = setTimeout(() => abort.abort(), this.#timeoutMs);
        let status;
        let text;
        let requestId;
        try {
            const response = await this.#fetch(url, { method, headers, body, signal: abort.signal });
            status = response.status;
            requestId = response.headers.get("x-request-id") ?? undefined;
            text = await response.text();
        }
        catch (cause) {
            throw new CourierError("network", `${method} ${path}: no answer (${String(cause)})`, { cause });
        }
        finally {
            clearTimeout(timer);
        }
        let json;
        try {
            json = text === "" ? undefined : JSON.parse(text);
        }
        catch {
            json = undefined;
        }
        if (status >= 200 && status < 300)
            return json;
        const error = json?.error;
        throw new CourierError(error?.code ?? "http_error", error?.message ?? `${method} ${path}: HTTP ${status}`, {
            status,
            reason: error?.reason,
            requestId,
        });
    }
    /** One page of the overview, most recently active first (`limit` 1–200). */
    conversations(limit, cursor) {
        return this.request("GET", "/v1/conversations", { query: { limit, cursor: cursor ?? undefined } });
    }
    conversation(conversationId) {
        return this.request("GET", `/v1/conversations/${conversationId}`);
    }
    /** The messages after `afterSeq`, ascending (`limit` 1–500). */
    messagesAfter(conversationId, afterSeq, limit) {
        return this.request("GET", `/v1/conversations/${conversationId}/messages`, { query: { afterSeq, limit } });
    }
    /** The newest messages before `beforeSeq` (history scrolling), ascending. */
    messagesBefore(conversationId, beforeSeq, limit) {
        return this.request("GET", `/v1/conversations/${conversationId}/messages`, { query: { beforeSeq, limit } });
    }
    markRead(conversationId, seq) {
        return this.request("POST", `/v1/conversations/${conversationId}/read`, { body: { seq } });
    }
    /** Your devices received the conversation up to `seq` (your delivered position). */
    received(conversationId, seq) {
        return this.request("POST", `/v1/conversations/${conversationId}/received`, { body: { seq } });
    }
    /** The HTTP send (for integrations; the client's `send` uses the WebSocket). */
    send(input) {
        return this.request("POST", "/v1/messages", { body: input });
    }
    /** User-stream events after `afterSeq`; leave `epoch` out only without a cursor. */
    userStream(query) {
        return this.request("GET", "/v1/user-stream", { query });
    }
    async friends() {
        return (await this.request("GET", "/v1/friends")).friends;
    }
    async friendRequests(direction) {
        return (await this.request("GET", "/v1/friends/requests", { query: { direction } }))
            .requests;
    }
    async blocks() {
        return (await this.request("GET", "/v1/blocks")).blocks;
    }
    async groups() {
        return (await this.request("GET", "/v1/groups")).groups;
    }
}
/** `POST /v1/auth/register`: a new account and its first token. */
export function register(url, userId, password, fetch) {
    return new Api({ url, fetch }).request("POST", "/v1/auth/register", { body: { userId, password } });
}
/** `POST /v1/auth/login`: a new token. */
export function login(url, userId, password, fetch) {
    return new Api({ url, fetch }).request("POST", "/v1/auth/login", { body: { userId, password } });
}
function defaultFetch() {
    const global = globalThis.fetch;
    if (!global)
        throw new Error("no global fetch: pass the `fetch` option");
    return (url, init) => global(url, init);
}

import { CourierError } from "./errors.js";
import type {
  Block,
  Conversation,
  ConversationPage,
  Credentials,
  Friend,
  FriendRequest,
  Group,
  MessagePage,
  ReadPosition,
  ReceivedPosition,
  SendAck,
  SendInput,
  UserStreamPage,
} from "./types.js";

/** The part of the Fetch API's response the SDK reads. */
export interface FetchResponseLike {
  readonly status: number;
  readonly ok: boolean;
  readonly headers: { get(name: string): string | null };
  text(): Promise<string>;
}

/** The part of `fetch` the SDK calls; the global `fetch` of browsers and Node 20 fits. */
export type FetchLike = (
  url: string,
  init: { method: string; headers: Record<string, string>; body?: string; signal?: AbortSignal },
) => Promise<FetchResponseLike>;

export interface ApiOptions {
  /** The server's HTTP base, e.g. `https://chat.example.com` (no trailing path). */
  url: string;
  /** The user's token; read before every request, so a new one applies at once. */
  token?: () => string;
  fetch?: FetchLike;
  /** An answer must come within this many ms (default 30 000), else `network`. */
  timeoutMs?: number;
}

type Query = Record<string, string | number | undefined>;

/**
 * The HTTP half of the protocol: JSON in, JSON out, every error as a `CourierError` with the
 * server's stable code. Typed methods for the sync and snapshot endpoints; `request` for any
 * other endpoint of docs/protocol.md.
 */
export class Api {
  readonly url: string;
  readonly #token: (() => string) | undefined;
  readonly #fetch: FetchLike;
  readonly #timeoutMs: number;

  constructor(options: ApiOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.#token = options.token;
    this.#fetch = options.fetch ?? defaultFetch();
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  async request<T>(method: string, path: string, options: { query?: Query; body?: unknown } = {}): Promise<T> {
    let url = this.url + path;
    const params = Object.entries(options.query ?? {}).filter(([, v]) => v !== undefined);
    if (params.length > 0) {
      url += "?" + params.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`).join("&");
    }
    const headers: Record<string, string> = {};
    const token = this.#token?.();
    if (token) headers["authorization"] = `Bearer ${token}`;
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.#timeoutMs);
    let status: number;
    let text: string;
    let requestId: string | undefined;
    try {
      const response = await this.#fetch(url, { method, headers, body, signal: abort.signal });
      status = response.status;
      requestId = response.headers.get("x-request-id") ?? undefined;
      text = await response.text();
    } catch (cause) {
      throw new CourierError("network", `${method} ${path}: no answer (${String(cause)})`, { cause });
    } finally {
      clearTimeout(timer);
    }
    let json: unknown;
    try {
      json = text === "" ? undefined : JSON.parse(text);
    } catch {
      json = undefined;
    }
    if (status >= 200 && status < 300) return json as T;
    const error = (json as { error?: { code?: string; message?: string; reason?: string } } | undefined)?.error;
    throw new CourierError(error?.code ?? "http_error", error?.message ?? `${method} ${path}: HTTP ${status}`, {
      status,
      reason: error?.reason,
      requestId,
    });
  }

  /** One page of the overview, most recently active first (`limit` 1–200). */
  conversations(limit?: number, cursor?: string | null): Promise<ConversationPage> {
    return this.request("GET", "/v1/conversations", { query: { limit, cursor: cursor ?? undefined } });
  }

  conversation(conversationId: number): Promise<Conversation> {
    return this.request("GET", `/v1/conversations/${conversationId}`);
  }

  /** The messages after `afterSeq`, ascending (`limit` 1–500). */
  messagesAfter(conversationId: number, afterSeq: number, limit?: number): Promise<MessagePage> {
    return this.request("GET", `/v1/conversations/${conversationId}/messages`, { query: { afterSeq, limit } });
  }

  /** The newest messages before `beforeSeq` (history scrolling), ascending. */
  messagesBefore(conversationId: number, beforeSeq: number, limit?: number): Promise<MessagePage> {
    return this.request("GET", `/v1/conversations/${conversationId}/messages`, { query: { beforeSeq, limit } });
  }

  markRead(conversationId: number, seq: number): Promise<ReadPosition> {
    return this.request("POST", `/v1/conversations/${conversationId}/read`, { body: { seq } });
  }

  /** Your devices received the conversation up to `seq` (your delivered position). */
  received(conversationId: number, seq: number): Promise<ReceivedPosition> {
    return this.request("POST", `/v1/conversations/${conversationId}/received`, { body: { seq } });
  }

  /** The HTTP send (for integrations; the client's `send` uses the WebSocket). */
  send(input: SendInput & { clientMsgId: string }): Promise<SendAck> {
    return this.request("POST", "/v1/messages", { body: input });
  }

  /** User-stream events after `afterSeq`; leave `epoch` out only without a cursor. */
  userStream(query: { epoch?: number; afterSeq?: number; limit?: number }): Promise<UserStreamPage> {
    return this.request("GET", "/v1/user-stream", { query });
  }

  async friends(): Promise<Friend[]> {
    return (await this.request<{ friends: Friend[] }>("GET", "/v1/friends")).friends;
  }

  async friendRequests(direction: "in" | "out"): Promise<FriendRequest[]> {
    return (await this.request<{ requests: FriendRequest[] }>("GET", "/v1/friends/requests", { query: { direction } }))
      .requests;
  }

  async blocks(): Promise<Block[]> {
    return (await this.request<{ blocks: Block[] }>("GET", "/v1/blocks")).blocks;
  }

  async groups(): Promise<Group[]> {
    return (await this.request<{ groups: Group[] }>("GET", "/v1/groups")).groups;
  }
}

/** `POST /v1/auth/register`: a new account and its first token. */
export function register(url: string, userId: string, password: string, fetch?: FetchLike): Promise<Credentials> {
  return new Api({ url, fetch }).request("POST", "/v1/auth/register", { body: { userId, password } });
}

/** `POST /v1/auth/login`: a new token. */
export function login(url: string, userId: string, password: string, fetch?: FetchLike): Promise<Credentials> {
  return new Api({ url, fetch }).request("POST", "/v1/auth/login", { body: { userId, password } });
}

function defaultFetch(): FetchLike {
  const global = (globalThis as { fetch?: FetchLike }).fetch;
  if (!global) throw new Error("no global fetch: pass the `fetch` option");
  return (url, init) => global(url, init);
}

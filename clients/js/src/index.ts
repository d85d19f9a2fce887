export { CourierClient, newClientMsgId } from "./client.js";
export type { ClientOptions } from "./client.js";
export type {
  ClientEvents,
  ClientState,
  DeliveredEvent,
  PresenceEvent,
  ReadEvent,
  RecallEvent,
  SnapshotEvent,
  TypingEvent,
  UserEvent,
} from "./events.js";
export { Api, login, register } from "./http.js";
export type { ApiOptions, FetchLike, FetchResponseLike } from "./http.js";
export { backoffDelay, DEFAULT_BACKOFF } from "./backoff.js";
export type { BackoffOptions } from "./backoff.js";
export { FINAL_CLOSE_CODES } from "./connection.js";
export type { WebSocketConstructor, WebSocketLike } from "./connection.js";
export { Emitter } from "./emitter.js";
export type { Listener } from "./emitter.js";
export { CourierError } from "./errors.js";
export type { CourierErrorDetails } from "./errors.js";
export { DEFAULT_ACK_TIMEOUTS_MS } from "./outbox.js";
export type { OutgoingSend } from "./outbox.js";
export { MemoryCursorStore } from "./store.js";
export type { CursorStore, UserStreamCursor } from "./store.js";
export { ConversationSync, UserStreamSync } from "./sync.js";
export type { Snapshot, SnapshotReason } from "./sync.js";
export { ContentType } from "./types.js";
export type * from "./types.js";

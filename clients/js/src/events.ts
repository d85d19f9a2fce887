import type { CourierError } from "./errors.js";
import type { Snapshot, SnapshotReason } from "./sync.js";
import type { Conversation, HelloFrame, LiveFrame, Message, UserStreamEvent } from "./types.js";

// What a UI binds to: the client's events and the values they carry.

/** Where the client is; every change is a `state` event. */
export type ClientState =
  | { state: "idle" }
  | { state: "connecting"; attempt: number }
  /** The session is open (`hello` received); catching up. Pushes are applied meanwhile. */
  | { state: "syncing"; hello: HelloFrame }
  /** Caught up: every message the server had when the session opened was emitted. */
  | { state: "online"; hello: HelloFrame }
  /** The connection was lost (`code`, `reason`); the next attempt is in `delayMs`. */
  | { state: "waiting"; attempt: number; delayMs: number; code: number; reason: string }
  /** For good: closed by `close()` (`closed_by_client`), or `replaced`, `token_revoked`,
   * `account_deleted`, `device_removed`, `unauthorized`. `connect()` starts again. */
  | { state: "closed"; reason: string; code?: number; error?: CourierError };

export interface RecallEvent {
  conversationId: number;
  conversationType: 1 | 2 | 3;
  /** The recall's own seq. */
  seq: number;
  /** The seq of the message to hide. */
  targetSeq: number;
  senderId: string;
}

export interface ReadEvent {
  conversationId: number;
  userId: string;
  readSeq: number;
  /** Present when the user is you (another of your devices read). */
  unread?: number;
}

export interface DeliveredEvent {
  conversationId: number;
  /** The peer whose devices received the conversation up to `seq`. */
  userId: string;
  seq: number;
}

export interface TypingEvent {
  conversationId: number;
  conversationType: 1 | 2 | 3;
  userId: string;
  state: string;
}

export interface PresenceEvent {
  userId: string;
  online: boolean;
  serverTime: number;
}

export type UserEvent = UserStreamEvent & { epoch: number };
export type SnapshotEvent = Snapshot & { reason: SnapshotReason; epoch: number };

export interface ClientEvents {
  state: ClientState;
  /** Every stored message (recalls and tips included), once, in seq order per conversation. */
  message: Message;
  /** After the `message` of a recall: hide message `targetSeq`. */
  recall: RecallEvent;
  /** A read position moved (yours on another device, or a peer's receipt). */
  read: ReadEvent;
  /** In a private conversation, the peer's devices received it up to `seq`. */
  delivered: DeliveredEvent;
  typing: TypingEvent;
  /** Any other live kind (call signals): never stored, never pulled. */
  live: LiveFrame;
  presence: PresenceEvent;
  /** An overview entry, as the server has it now. */
  conversation: Conversation;
  /** A user-stream event, in seq order within its epoch. */
  userEvent: UserEvent;
  /** Load this state in whole: it replaces what the user-stream events built. */
  snapshot: SnapshotEvent;
  pong: { rttMs: number };
  /** A sync step failed; the SDK retries by itself. For logs. */
  syncError: CourierError;
}

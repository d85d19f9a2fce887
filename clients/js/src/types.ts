// The wire shapes of docs/protocol.md: HTTP bodies and WebSocket frames, as the server
// sends them (camelCase JSON). Fields the docs mark optional are optional here.

/** 0 the user's own state stream, 1 private, 2 group, 3 channel. */
export type ConversationType = 0 | 1 | 2 | 3;

/** The content types of the bundled kinds that the SDK itself looks at. */
export const ContentType = {
  text: 1,
  image: 2,
  file: 3,
  recall: 4,
  typing: 5,
  rtcCall: 6,
  friendRequest: 7,
  groupKick: 8,
  groupUpdate: 9,
  encrypted: 10,
} as const;

/** A stored message, as pushed (`notify`) and as pulled. */
export interface Message {
  conversationType: 1 | 2 | 3;
  conversationId: number;
  seq: number;
  /** A 64-bit number in decimal: keep it as a string. */
  msgId: string;
  senderId: string;
  contentType: number;
  /** The normalized payload; `null` once the message was recalled (pulls only). */
  payload: unknown;
  serverTime: number;
  /** The seq of the recall that hid this message (pulls only). */
  recalledBy?: number;
}

/** One entry of the conversation overview. */
export interface Conversation {
  conversationId: number;
  conversationType: 1 | 2 | 3;
  peerId: string | null;
  lastSeq: number;
  readSeq: number;
  unread: number;
  lastTime: number;
  member: boolean;
  lastMessage: (Message & { preview?: string }) | null;
}

export interface ConversationPage {
  conversations: Conversation[];
  nextCursor: string | null;
}

export interface MessagePage {
  conversationId: number;
  conversationType: 1 | 2 | 3;
  lastSeq: number;
  hasMore: boolean;
  messages: Message[];
}

export interface UserStreamEvent {
  seq: number;
  event: string;
  contentType?: number;
  serverTime: number;
  data: Record<string, unknown>;
}

export interface UserStreamPage {
  epoch: number;
  lastSeq: number;
  hasMore: boolean;
  events: UserStreamEvent[];
}

/** What `send` takes: the `send` frame without `type` and `id`. */
export interface SendInput {
  conversationType: 1 | 2 | 3;
  /** Exactly one of `conversationId` and `peerId` (private conversations only). */
  conversationId?: number;
  peerId?: string;
  contentType: number;
  payload: unknown;
  /** 1–64 bytes, no control characters; a fresh random one when left out. */
  clientMsgId?: string;
}

/** The ack of a stored kind: the message is committed at `seq`. */
export interface StoredAck {
  msgId: string;
  conversationId: number;
  conversationType: 1 | 2 | 3;
  seq: number;
  serverTime: number;
  duplicate: boolean;
}

/** The ack of a live kind (typing, call signals): nothing stored. */
export interface LiveAck {
  live: true;
  conversationId: number;
  conversationType: 1 | 2 | 3;
  delivered: number;
}

export type SendAck = StoredAck | LiveAck;

export interface ReadPosition {
  conversationId: number;
  readSeq: number;
  moved: boolean;
  unread: number;
}

export interface Credentials {
  userId: string;
  token: string;
  /** Seconds since the Unix epoch. */
  expiresAt: number;
}

// Snapshots of the user's state, reloaded when the user stream must be rebuilt.

export interface Friend {
  userId: string;
  since: number;
}

export interface FriendRequest {
  requestId: string;
  fromUserId: string;
  toUserId: string;
  message: string;
  state: string;
  createdAt: number;
  updatedAt: number;
}

export interface Block {
  userId: string;
  since: number;
}

/** A group or channel of `GET /v1/groups`, with the caller's own membership. */
export interface Group {
  conversationId: number;
  conversationType: 2 | 3;
  name: string;
  notice: string;
  avatar: string;
  ownerId: string;
  joinPolicy: string;
  muteAll: boolean;
  state: string;
  memberCount: number;
  version: number;
  createdAt: number;
  updatedAt: number;
  memberState: string;
  role: string;
  mutedUntil: number;
}

// WebSocket frames, server to client.

export interface HelloFrame {
  type: "hello";
  userId: string;
  deviceId: string;
  sessionId: string;
  heartbeatSecs: number;
  maxFrameBytes: number;
}

export type StoredAckFrame = { type: "ack"; id?: string } & StoredAck;
export type LiveAckFrame = { type: "ack"; id?: string } & LiveAck;
export type ReadAckFrame = { type: "ack"; id?: string } & ReadPosition;

export interface PongFrame {
  type: "pong";
  id?: string;
  serverTime: number;
}

export interface ErrorFrame {
  type: "error";
  id?: string;
  code: string;
  message: string;
  reason?: string;
}

/** A stored message pushed as it commits. */
export type MessageFrame = { type: "notify" } & Message;

/** A live kind (typing, call signals): no `seq`, `msgId` or `serverTime`. */
export interface LiveFrame {
  type: "notify";
  conversationType: 1 | 2 | 3;
  conversationId: number;
  senderId: string;
  contentType: number;
  payload: unknown;
}

/** A user-stream event pushed as it commits. */
export type UserStreamFrame = {
  type: "notify";
  conversationType: 0;
  epoch: number;
} & UserStreamEvent;

export interface ReadFrame {
  type: "read";
  conversationId: number;
  userId: string;
  readSeq: number;
  /** Present on the user's own other devices, absent on a peer's read receipt. */
  unread?: number;
}

/** A peer's devices received a private conversation up to `seq` (a delivered receipt). */
export interface DeliveredFrame {
  type: "delivered";
  conversationId: number;
  userId: string;
  seq: number;
}

/** The answer to `received`: your delivered position in the conversation. */
export interface ReceivedPosition {
  conversationId: number;
  deliveredSeq: number;
  moved: boolean;
}

export interface PresenceFrame {
  type: "presence";
  userId: string;
  online: boolean;
  serverTime: number;
}

export interface KickedFrame {
  type: "kicked";
  reason: string;
  message: string;
}

export type ServerFrame =
  | HelloFrame
  | StoredAckFrame
  | LiveAckFrame
  | ReadAckFrame
  | PongFrame
  | ErrorFrame
  | MessageFrame
  | LiveFrame
  | UserStreamFrame
  | ReadFrame
  | DeliveredFrame
  | PresenceFrame
  | KickedFrame;

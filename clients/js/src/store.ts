/** The position in the user's state stream: its epoch and the last seq applied. */
export interface UserStreamCursor {
  epoch: number;
  seq: number;
}

/**
 * Where the SDK keeps its cursors between sessions: per conversation the highest seq it
 * has emitted (every lower one emitted too), and the user stream's `(epoch, seq)`.
 * One store per user and device: cursors of two users must not share one.
 *
 * The SDK writes a cursor after the listeners of the messages up to it have run, and
 * only ever moves it forward.
 */
export interface CursorStore {
  getSeq(conversationId: number): Promise<number | undefined>;
  setSeq(conversationId: number, seq: number): Promise<void>;
  getUserStream(): Promise<UserStreamCursor | undefined>;
  setUserStream(cursor: UserStreamCursor): Promise<void>;
}

/** The default store: cursors live as long as the page or process. */
export class MemoryCursorStore implements CursorStore {
  readonly #seqs = new Map<number, number>();
  #userStream: UserStreamCursor | undefined;

  /** Optionally starts from cursors of an earlier session. */
  constructor(initial: { conversations?: Record<number, number>; userStream?: UserStreamCursor } = {}) {
    for (const [id, seq] of Object.entries(initial.conversations ?? {})) {
      this.#seqs.set(Number(id), seq);
    }
    this.#userStream = initial.userStream && { ...initial.userStream };
  }

  async getSeq(conversationId: number): Promise<number | undefined> {
    return this.#seqs.get(conversationId);
  }

  async setSeq(conversationId: number, seq: number): Promise<void> {
    this.#seqs.set(conversationId, seq);
  }

  async getUserStream(): Promise<UserStreamCursor | undefined> {
    return this.#userStream && { ...this.#userStream };
  }

  async setUserStream(cursor: UserStreamCursor): Promise<void> {
    this.#userStream = { ...cursor };
  }
}

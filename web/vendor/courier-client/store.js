/** The default store: cursors live as long as the page or process. */
export class MemoryCursorStore {
    #seqs = new Map();
    #userStream;
    /** Optionally starts from cursors of an earlier session. */
    constructor(initial = {}) {
        for (const [id, seq] of Object.entries(initial.conversations ?? {})) {
            this.#seqs.set(Number(id), seq);
        }
        this.#userStream = initial.userStream && { ...initial.userStream };
    }
    async getSeq(conversationId) {
        return this.#seqs.get(conversationId);
    }
    async setSeq(conversationId, seq) {
        this.#seqs.set(conversationId, seq);
    }
    async getUserStream() {
        return this.#userStream && { ...this.#userStream };
    }
    async setUserStream(cursor) {
        this.#userStream = { ...cursor };
    }
}

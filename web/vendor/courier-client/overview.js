/** A bound on the reloads of one entry in a row (each one is asked for by a change). */
const MAX_RELOADS_IN_A_ROW = 100;
/**
 * The conversation overview as the server last told it: the entries of the catch-up's
 * pages, reloaded one at a time when a message or a read moves them. Entries only move
 * forward (by `lastSeq`, then `readSeq`), so answers that overtook each other never show an
 * older state.
 */
export class Overview {
    #deps;
    #entries = new Map();
    #reloading = new Map();
    constructor(deps) {
        this.#deps = deps;
    }
    /** Most recently active first. */
    list() {
        return [...this.#entries.values()].sort((a, b) => b.lastTime - a.lastTime);
    }
    get(conversationId) {
        return this.#entries.get(conversationId);
    }
    set(conversation) {
        const known = this.#entries.get(conversation.conversationId);
        const older = known &&
            (conversation.lastSeq < known.lastSeq ||
                (conversation.lastSeq === known.lastSeq && conversation.readSeq < known.readSeq));
        if (older)
            return;
        this.#entries.set(conversation.conversationId, conversation);
        this.#deps.emit(conversation);
    }
    /** Your read position moved (forward only). */
    read(conversationId, readSeq, unread) {
        const known = this.#entries.get(conversationId);
        if (!known)
            return this.reload(conversationId);
        if (readSeq < known.readSeq)
            return;
        this.set({ ...known, readSeq, unread });
    }
    /** A message was emitted: an entry it moves (or a new conversation) is reloaded. */
    message(message) {
        const known = this.#entries.get(message.conversationId);
        if (!known || message.seq > known.lastSeq)
            this.reload(message.conversationId);
    }
    /** Reloads one entry; calls while one is running make it run once more after. */
    reload(conversationId) {
        const running = this.#reloading.get(conversationId);
        if (running) {
            running.again = true;
            return;
        }
        const state = { again: false };
        this.#reloading.set(conversationId, state);
        void (async () => {
            try {
                for (let round = 0; round < MAX_RELOADS_IN_A_ROW; round++) {
                    state.again = false;
                    const conversation = await this.#deps.load(conversationId);
                    if (!this.#deps.active())
                        return;
                    this.set(conversation);
                    if (!state.again)
                        return;
                }
            }
            catch (err) {
                this.#deps.failed(err);
            }
            finally {
                this.#reloading.delete(conversationId);
            }
        })();
    }
}

import { CourierError } from "./errors.js";
/** A safety bound on the pages of one pull; a pull that still has more goes on next time. */
const MAX_PAGES_PER_PULL = 10_000;
/**
 * The per-conversation half of "Catching up" (docs/protocol.md): a `seq` cursor per
 * conversation and one queue of work per conversation, so pushes, acks of our own sends and
 * pulls of the same conversation apply one after the other.
 *
 * - a message with `seq <= cursor` is already emitted: ignored;
 * - `seq == cursor + 1`: emitted;
 * - `seq > cursor + 1`: the gap is pulled (`afterSeq=cursor` until `hasMore` is false) and
 *   emitted first, then the message if the pull did not already bring it.
 *
 * So every message is emitted once, in seq order, with no hole the server could fill. (In a
 * group, seqs sent while the user was not a member are never visible: after the pull says
 * there is nothing more, the pushed message follows such a hole.)
 */
export class ConversationSync {
    #deps;
    #tracks = new Map();
    constructor(deps) {
        this.#deps = deps;
    }
    /** The highest seq emitted for the conversation in this session, if loaded. */
    seq(conversationId) {
        const seq = this.#tracks.get(conversationId)?.seq;
        return seq === undefined || seq < 0 ? undefined : seq;
    }
    /** A stored message that arrived outside a pull: a push, or our own send's ack. */
    push(message) {
        const id = message.conversationId;
        return this.#run(id, async (track) => {
            if (message.seq <= track.seq)
                return;
            if (message.seq > track.seq + 1)
                await this.#pull(id, track);
            if (message.seq > track.seq) {
                this.#apply(track, message);
                await this.#deps.store.setSeq(id, track.seq);
            }
        });
    }
    /** The overview says the conversation reaches `lastSeq`: pull what is missing. */
    catchUp(conversationId, lastSeq) {
        return this.#run(conversationId, async (track) => {
            if (track.seq < lastSeq)
                await this.#pull(conversationId, track);
        });
    }
    #run(conversationId, task) {
        let track = this.#tracks.get(conversationId);
        if (!track) {
            track = { seq: -1, tail: Promise.resolve() };
            this.#tracks.set(conversationId, track);
        }
        const t = track;
        const run = t.tail.then(async () => {
            if (t.seq < 0)
                t.seq = (await this.#deps.store.getSeq(conversationId)) ?? 0;
            await task(t);
        });
        t.tail = run.catch(() => { });
        return run;
    }
    async #pull(conversationId, track) {
        for (let page = 0; page < MAX_PAGES_PER_PULL; page++) {
            const result = await this.#deps.pull(conversationId, track.seq);
            const before = track.seq;
            for (const message of result.messages) {
                if (message.seq > track.seq)
                    this.#apply(track, message);
            }
            if (track.seq !== before)
                await this.#deps.store.setSeq(conversationId, track.seq);
            if (!result.hasMore || track.seq === before)
                return;
        }
    }
    #apply(track, message) {
        track.seq = message.seq;
        this.#deps.emit(message);
    }
}
/** Rebuilds in a row before the SDK gives up until the next trigger (a stream reset twice
 * during one rebuild is already unusual). */
const MAX_REBUILDS = 5;
/**
 * The user stream of "Your user stream" and step 5 of "Catching up": a cursor
 * `(epoch, seq)`, events applied by seq like messages, and a rebuild from the snapshots when
 * there is no cursor yet, when a pull answers `resync_required`, or when a pushed event
 * carries another epoch.
 */
export class UserStreamSync {
    #deps;
    #cursor;
    #loaded = false;
    #tail = Promise.resolve();
    constructor(deps) {
        this.#deps = deps;
    }
    get cursor() {
        return this.#cursor && { ...this.#cursor };
    }
    /** Pulls from the cursor until the stream has no more (rebuilding when needed). */
    catchUp() {
        return this.#run(() => this.#sync());
    }
    /** A pushed event (`conversationType: 0`). */
    push(event) {
        return this.#run(async () => {
            const cursor = this.#cursor;
            if (!cursor)
                return this.#sync();
            if (event.epoch < cursor.epoch)
                return; // from before a reset this client already followed
            if (event.epoch > cursor.epoch)
                return this.#sync("epoch_changed");
            if (event.seq <= cursor.seq)
                return;
            if (event.seq > cursor.seq + 1)
                return this.#sync();
            this.#apply(cursor.epoch, event);
            await this.#save();
        });
    }
    #run(task) {
        const run = this.#tail.then(async () => {
            if (!this.#loaded) {
                this.#cursor = await this.#deps.store.getUserStream();
                this.#loaded = true;
            }
            await task();
        });
        this.#tail = run.catch(() => { });
        return run;
    }
    async #sync(reason) {
        let rebuild = reason ?? (this.#cursor ? undefined : "first_sync");
        for (let round = 0; round < MAX_REBUILDS; round++) {
            if (rebuild)
                await this.#rebuild(rebuild);
            if (await this.#pull())
                return;
            rebuild = "resync_required";
        }
        throw new CourierError("resync_loop", `the user stream was reset ${MAX_REBUILDS} times during one rebuild`);
    }
    /**
     * The stream's epoch, then the snapshots, then the cursor: on a first sync at the
     * stream's `lastSeq` (the snapshots already hold what came before), after a reset at 0 of
     * the new epoch, as docs/protocol.md says (events state the resulting state, so
     * applying one the snapshots already hold is harmless).
     */
    async #rebuild(reason) {
        const position = await this.#deps.pull({ limit: 0 });
        const snapshot = await this.#deps.loadSnapshot();
        this.#cursor = { epoch: position.epoch, seq: reason === "first_sync" ? position.lastSeq : 0 };
        this.#deps.emitSnapshot({ ...snapshot, reason, epoch: position.epoch });
        await this.#save();
    }
    /** Pulls until `hasMore` is false; false when the server answered `resync_required`. */
    async #pull() {
        for (let page = 0; page < MAX_PAGES_PER_PULL; page++) {
            const cursor = this.#cursor;
            let result;
            try {
                result = await this.#deps.pull({ epoch: cursor.epoch, afterSeq: cursor.seq });
            }
            catch (err) {
                if (err instanceof CourierError && err.code === "resync_required")
                    return false;
                throw err;
            }
            if (result.epoch !== cursor.epoch)
                return false;
            const before = cursor.seq;
            for (const event of result.events) {
                if (event.seq > cursor.seq)
                    this.#apply(cursor.epoch, event);
            }
            if (cursor.seq !== before)
                await this.#save();
            if (!result.hasMore || cursor.seq === before)
                return true;
        }
        return true;
    }
    #apply(epoch, event) {
        this.#cursor.seq = event.seq;
        const { seq, event: name, serverTime, data } = event;
        const applied = { epoch, seq, event: name, serverTime, data };
        if (event.contentType !== undefined)
            applied.contentType = event.contentType;
        this.#deps.emitEvent(applied);
    }
    async #save() {
        await this.#deps.store.setUserStream({ ...this.#cursor });
    }
}

const OBJECT_STORE = "cursors";
const USER_STREAM_KEY = "user-stream";
/**
 * Cursors in the browser's IndexedDB, so a reloaded page goes on where it stopped. One
 * database per user and device: name it after them (`courier-alice-laptop`). Each write is
 * its own transaction and keeps the larger of the stored and the new cursor, so two tabs
 * never move a cursor back.
 *
 * ```ts
 * import { IndexedDbCursorStore } from "@courier/client/indexeddb";
 * const store = new IndexedDbCursorStore(`courier-${userId}-${deviceId}`);
 * ```
 */
export class IndexedDbCursorStore {
    #db;
    constructor(name, factory = globalThis.indexedDB) {
        this.#db = new Promise((resolve, reject) => {
            const request = factory.open(name, 1);
            request.onupgradeneeded = () => {
                request.result.createObjectStore(OBJECT_STORE);
            };
            request.onsuccess = () => {
                const db = request.result;
                db.onversionchange = () => db.close(); // let a newer version of the page upgrade
                resolve(db);
            };
            request.onerror = () => reject(request.error);
        });
    }
    getSeq(conversationId) {
        return this.#get(`conversation:${conversationId}`);
    }
    setSeq(conversationId, seq) {
        return this.#putIfNewer(`conversation:${conversationId}`, seq, (stored) => seq > stored);
    }
    getUserStream() {
        return this.#get(USER_STREAM_KEY);
    }
    setUserStream(cursor) {
        const value = { epoch: cursor.epoch, seq: cursor.seq };
        return this.#putIfNewer(USER_STREAM_KEY, value, (stored) => value.epoch > stored.epoch || (value.epoch === stored.epoch && value.seq > stored.seq));
    }
    /** Closes the database (the store is unusable afterwards). */
    async close() {
        (await this.#db).close();
    }
    async #get(key) {
        const db = await this.#db;
        return new Promise((resolve, reject) => {
            const request = db.transaction(OBJECT_STORE, "readonly").objectStore(OBJECT_STORE).get(key);
            request.onsuccess = () => resolve(request.result);
            request.onerror = () => reject(request.error);
        });
    }
    async #putIfNewer(key, value, newer) {
        const db = await this.#db;
        return new Promise((resolve, reject) => {
            const transaction = db.transaction(OBJECT_STORE, "readwrite");
            const store = transaction.objectStore(OBJECT_STORE);
            const read = store.get(key);
            read.onsuccess = () => {
                const stored = read.result;
                if (stored === undefined || newer(stored))
                    store.put(value, key);
            };
            transaction.oncomplete = () => resolve();
            transaction.onerror = () => reject(transaction.error);
            transaction.onabort = () => reject(transaction.error ?? new Error("the IndexedDB transaction was aborted"));
        });
    }
}

import type { CursorStore, UserStreamCursor } from "./store.js";

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
export class IndexedDbCursorStore implements CursorStore {
  readonly #db: Promise<IDBDatabase>;

  constructor(name: string, factory: IDBFactory = globalThis.indexedDB) {
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

  getSeq(conversationId: number): Promise<number | undefined> {
    return this.#get<number>(`conversation:${conversationId}`);
  }

  setSeq(conversationId: number, seq: number): Promise<void> {
    return this.#putIfNewer<number>(`conversation:${conversationId}`, seq, (stored) => seq > stored);
  }

  getUserStream(): Promise<UserStreamCursor | undefined> {
    return this.#get<UserStreamCursor>(USER_STREAM_KEY);
  }

  setUserStream(cursor: UserStreamCursor): Promise<void> {
    const value = { epoch: cursor.epoch, seq: cursor.seq };
    return this.#putIfNewer<UserStreamCursor>(
      USER_STREAM_KEY,
      value,
      (stored) => value.epoch > stored.epoch || (value.epoch === stored.epoch && value.seq > stored.seq),
    );
  }

  /** Closes the database (the store is unusable afterwards). */
  async close(): Promise<void> {
    (await this.#db).close();
  }

  async #get<T>(key: string): Promise<T | undefined> {
    const db = await this.#db;
    return new Promise((resolve, reject) => {
      const request = db.transaction(OBJECT_STORE, "readonly").objectStore(OBJECT_STORE).get(key);
      request.onsuccess = () => resolve(request.result as T | undefined);
      request.onerror = () => reject(request.error);
    });
  }

  async #putIfNewer<T>(key: string, value: T, newer: (stored: T) => boolean): Promise<void> {
    const db = await this.#db;
    return new Promise((resolve, reject) => {
      const transaction = db.transaction(OBJECT_STORE, "readwrite");
      const store = transaction.objectStore(OBJECT_STORE);
      const read = store.get(key);
      read.onsuccess = () => {
        const stored = read.result as T | undefined;
        if (stored === undefined || newer(stored)) store.put(value, key);
      };
      transaction.oncomplete = () => resolve();
      transaction.onerror = () => reject(transaction.error);
      transaction.onabort = () => reject(transaction.error ?? new Error("the IndexedDB transaction was aborted"));
    });
  }
}

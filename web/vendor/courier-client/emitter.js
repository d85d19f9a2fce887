/**
 * A tiny typed event emitter: `Events` maps each event name to the value its listeners get.
 * A listener that throws does not stop the others or the SDK: its error is rethrown on a
 * fresh task, where the platform reports it (the console, `window.onerror`, Node's
 * `uncaughtException`).
 */
export class Emitter {
    #listeners = new Map();
    /** Adds a listener; returns the function that removes it. */
    on(event, listener) {
        let set = this.#listeners.get(event);
        if (!set) {
            set = new Set();
            this.#listeners.set(event, set);
        }
        set.add(listener);
        return () => this.off(event, listener);
    }
    off(event, listener) {
        this.#listeners.get(event)?.delete(listener);
    }
    /** The next value of `event` that satisfies `match`, as a promise. */
    once(event, match = () => true) {
        return new Promise((resolve) => {
            const off = this.on(event, (value) => {
                if (match(value)) {
                    off();
                    resolve(value);
                }
            });
        });
    }
    emit(event, value) {
        const set = this.#listeners.get(event);
        if (!set)
            return;
        for (const listener of [...set]) {
            try {
                listener(value);
            }
            catch (err) {
                setTimeout(() => {
                    throw err;
                }, 0);
            }
        }
    }
}

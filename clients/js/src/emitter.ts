/** A listener of one event. */
export type Listener<T> = (value: T) => void;

/**
 * A tiny typed event emitter: `Events` maps each event name to the value its listeners get.
 * A listener that throws does not stop the others or the SDK: its error is rethrown on a
 * fresh task, where the platform reports it (the console, `window.onerror`, Node's
 * `uncaughtException`).
 */
export class Emitter<Events extends object> {
  #listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Adds a listener; returns the function that removes it. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.#listeners.get(event);
    if (!set) {
      set = new Set();
      this.#listeners.set(event, set);
    }
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  off<K extends keyof Events>(event: K, listener: Listener<Events[K]>): void {
    this.#listeners.get(event)?.delete(listener as Listener<never>);
  }

  /** The next value of `event` that satisfies `match`, as a promise. */
  once<K extends keyof Events>(
    event: K,
    match: (value: Events[K]) => boolean = () => true,
  ): Promise<Events[K]> {
    return new Promise((resolve) => {
      const off = this.on(event, (value) => {
        if (match(value)) {
          off();
          resolve(value);
        }
      });
    });
  }

  protected emit<K extends keyof Events>(event: K, value: Events[K]): void {
    const set = this.#listeners.get(event);
    if (!set) return;
    for (const listener of [...set] as Listener<Events[K]>[]) {
      try {
        listener(value);
      } catch (err) {
        setTimeout(() => {
          throw err;
        }, 0);
      }
    }
  }
}

// Clients for the tests, with a record of everything each one emitted, and waiting on what
// a user would see (no fixed sleeps: a condition re-checked on every event, with a generous
// deadline as the safety net).

import {
  CourierClient,
  type ClientEvents,
  type ClientOptions,
  type ClientState,
  type Message,
  type SnapshotEvent,
  type UserEvent,
} from "../../src/index.js";
import type { TestServer } from "./server.js";

/** Safety net of every wait: far beyond what a busy 2-core machine needs. */
export const DEADLINE_MS = 60_000;

/** Every event of the client (the compiler checks that none is missing). */
const EVENT_NAMES: Record<keyof ClientEvents, true> = {
  state: true,
  message: true,
  recall: true,
  read: true,
  delivered: true,
  typing: true,
  live: true,
  presence: true,
  conversation: true,
  userEvent: true,
  snapshot: true,
  pong: true,
  syncError: true,
};
const EVENTS = Object.keys(EVENT_NAMES) as (keyof ClientEvents)[];

/** A client and what it emitted, in order. */
export class Recorded {
  readonly messages: Message[] = [];
  readonly states: ClientState[] = [];
  readonly userEvents: UserEvent[] = [];
  readonly snapshots: SnapshotEvent[] = [];
  readonly pongs: number[] = [];
  readonly errors: string[] = [];

  constructor(readonly client: CourierClient) {
    client.on("message", (m) => this.messages.push(m));
    client.on("state", (s) => this.states.push(s));
    client.on("userEvent", (e) => this.userEvents.push(e));
    client.on("snapshot", (s) => this.snapshots.push(s));
    client.on("pong", (p) => this.pongs.push(p.rttMs));
    client.on("syncError", (e) => this.errors.push(`${e.code}: ${e.message}`));
  }

  /** The seqs emitted for one conversation, in the order they were emitted. */
  seqs(conversationId: number): number[] {
    return this.messages.filter((m) => m.conversationId === conversationId).map((m) => m.seq);
  }

  texts(conversationId: number): string[] {
    return this.messages
      .filter((m) => m.conversationId === conversationId)
      .map((m) => (m.payload as { text?: string } | null)?.text ?? "");
  }

  stateNames(): string[] {
    return this.states.map((s) => s.state);
  }
}

export function client(server: TestServer, options: Partial<ClientOptions> & { token: string; deviceId: string }): Recorded {
  return new Recorded(new CourierClient({ url: server.url, ...options }));
}

/** Resolves once `check` holds, re-checking on every event of `clients`. */
export function eventually(clients: Recorded[], check: () => boolean, what: string, timeoutMs = DEADLINE_MS): Promise<void> {
  if (check()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const offs: (() => void)[] = [];
    const done = (err?: Error) => {
      clearTimeout(timer);
      for (const off of offs) off();
      if (err) reject(err);
      else resolve();
    };
    const timer = setTimeout(() => {
      const states = clients.map((c) => c.stateNames().join(">")).join(" | ");
      const errors = clients.flatMap((c) => c.errors).join("; ");
      done(new Error(`timed out waiting for ${what} (states: ${states}; sync errors: ${errors || "none"})`));
    }, timeoutMs);
    for (const c of clients) {
      for (const event of EVENTS) {
        offs.push(
          c.client.on(event, () => {
            if (check()) done();
          }),
        );
      }
    }
  });
}

export function online(clients: Recorded[]): Promise<void> {
  return eventually(clients, () => clients.every((c) => c.client.state.state === "online"), "every client online");
}

/** Polls an HTTP condition (bounded: 400 tries, 50 ms apart). */
export async function poll<T>(what: string, read: () => Promise<T>, ok: (value: T) => boolean): Promise<T> {
  let last: T | undefined;
  for (let attempt = 0; attempt < 400; attempt++) {
    last = await read();
    if (ok(last)) return last;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${what}: never held (last: ${JSON.stringify(last)})`);
}

export function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

export function text(body: string): { contentType: number; payload: { text: string } } {
  return { contentType: 1, payload: { text: body } };
}

// A loopback TCP relay between a client's WebSocket and the server, which reads the
// WebSocket frames going through it so a test can break the network at a chosen frame:
// cut every connection (the client sees its socket die, the server sees nothing, as when a
// phone loses its network), cut right after one client frame went out (so its answer is
// lost), drop chosen server frames (pushes lost on the way), and hold new connections
// until the test is ready.

import net from "node:net";

/** One WebSocket frame as it went through, its text payload parsed when it is JSON. */
export interface SeenFrame {
  connection: number;
  json: Record<string, unknown> | undefined;
}

export type ClientFrameVerdict = "forward" | "cut";
/** `cutAfter`: this frame reaches the client, then the connection is cut. */
export type ServerFrameVerdict = "forward" | "drop" | "cut" | "cutAfter";

interface Relay {
  id: number;
  client: net.Socket;
  server?: net.Socket;
  /** Cut: the client side is gone, the server side is left open and not read any more. */
  cut: boolean;
}

export class Link {
  readonly #listener: net.Server;
  readonly #target: { host: string; port: number };
  readonly #relays = new Set<Relay>();
  #held: (() => void)[] | undefined;
  #ids = 0;
  /** Decides about each client → server text frame after it went out. */
  onClientFrame: (frame: SeenFrame) => ClientFrameVerdict | void = () => {};
  /** Decides about each server → client text frame before it goes on. */
  onServerFrame: (frame: SeenFrame) => ServerFrameVerdict | void = () => {};

  private constructor(listener: net.Server, target: { host: string; port: number }) {
    this.#listener = listener;
    this.#target = target;
    listener.on("connection", (socket) => this.#accept(socket));
  }

  static async start(target: { host: string; port: number }): Promise<Link> {
    const listener = net.createServer();
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    return new Link(listener, target);
  }

  /** The WebSocket base to give the client (`ws://127.0.0.1:PORT`). */
  get wsUrl(): string {
    const address = this.#listener.address() as net.AddressInfo;
    return `ws://127.0.0.1:${address.port}`;
  }

  /** How many client connections the link has accepted. */
  get accepted(): number {
    return this.#ids;
  }

  /** Cuts every open connection. */
  cutAll(): void {
    for (const relay of this.#relays) this.#cut(relay);
  }

  /** New connections wait (accepted, not relayed) until `release`. */
  hold(): void {
    this.#held ??= [];
  }

  release(): void {
    const held = this.#held ?? [];
    this.#held = undefined;
    for (const go of held) go();
  }

  async close(): Promise<void> {
    this.release();
    for (const relay of this.#relays) {
      relay.client.destroy();
      relay.server?.destroy();
    }
    await new Promise<void>((resolve) => this.#listener.close(() => resolve()));
  }

  #accept(client: net.Socket): void {
    const relay: Relay = { id: ++this.#ids, client, cut: false };
    this.#relays.add(relay);
    client.on("error", () => {});
    client.pause();
    const go = () => this.#connect(relay);
    if (this.#held) this.#held.push(go);
    else go();
  }

  #connect(relay: Relay): void {
    const { client } = relay;
    if (client.destroyed) {
      this.#relays.delete(relay);
      return;
    }
    const server = net.connect(this.#target.port, this.#target.host);
    relay.server = server;
    server.on("error", () => {});
    const up = new FrameReader();
    const down = new FrameReader();
    client.on("data", (chunk: Buffer) => {
      for (const piece of up.push(chunk)) {
        server.write(piece.raw);
        if (piece.json === undefined) continue;
        const verdict = this.onClientFrame({ connection: relay.id, json: piece.json });
        if (verdict === "cut") return this.#cut(relay);
      }
    });
    server.on("data", (chunk: Buffer) => {
      if (relay.cut) return;
      for (const piece of down.push(chunk)) {
        if (piece.json !== undefined) {
          const verdict = this.onServerFrame({ connection: relay.id, json: piece.json });
          if (verdict === "drop") continue;
          if (verdict === "cut") return this.#cut(relay);
          if (verdict === "cutAfter") {
            client.end(piece.raw); // flushed, then the socket closes
            return this.#cut(relay, false);
          }
        }
        client.write(piece.raw);
      }
    });
    client.on("close", () => {
      if (!relay.cut) server.end();
    });
    server.on("close", () => {
      client.destroy();
      this.#relays.delete(relay);
    });
    client.resume();
  }

  #cut(relay: Relay, destroy = true): void {
    if (relay.cut) return;
    relay.cut = true;
    if (destroy) relay.client.destroy();
    // The server side stays open, unread: the server learns nothing until the device's next
    // connection replaces this one, or its heartbeat lapses.
    relay.server?.pause();
  }
}

interface Piece {
  raw: Buffer;
  json: Record<string, unknown> | undefined;
}

/** Splits one direction of a WebSocket connection into the HTTP head and whole frames. */
class FrameReader {
  #buffer = Buffer.alloc(0);
  #inHead = true;

  push(chunk: Buffer): Piece[] {
    this.#buffer = Buffer.concat([this.#buffer, chunk]);
    const pieces: Piece[] = [];
    if (this.#inHead) {
      const end = this.#buffer.indexOf("\r\n\r\n");
      if (end < 0) return pieces;
      pieces.push({ raw: this.#buffer.subarray(0, end + 4), json: undefined });
      this.#buffer = this.#buffer.subarray(end + 4);
      this.#inHead = false;
    }
    for (;;) {
      const frame = this.#next();
      if (!frame) return pieces;
      pieces.push(frame);
    }
  }

  #next(): Piece | undefined {
    const b = this.#buffer;
    if (b.length < 2) return undefined;
    const opcode = b[0]! & 0x0f;
    const masked = (b[1]! & 0x80) !== 0;
    let length = b[1]! & 0x7f;
    let offset = 2;
    if (length === 126) {
      if (b.length < 4) return undefined;
      length = b.readUInt16BE(2);
      offset = 4;
    } else if (length === 127) {
      if (b.length < 10) return undefined;
      length = Number(b.readBigUInt64BE(2));
      offset = 10;
    }
    let mask: Buffer | undefined;
    if (masked) {
      if (b.length < offset + 4) return undefined;
      mask = b.subarray(offset, offset + 4);
      offset += 4;
    }
    if (b.length < offset + length) return undefined;
    const raw = Buffer.from(b.subarray(0, offset + length));
    this.#buffer = b.subarray(offset + length);
    let json: Record<string, unknown> | undefined;
    if (opcode === 1) {
      const payload = Buffer.from(raw.subarray(offset));
      if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i % 4]!;
      try {
        json = JSON.parse(payload.toString("utf8")) as Record<string, unknown>;
      } catch {
        json = undefined;
      }
    }
    return { raw, json };
  }
}

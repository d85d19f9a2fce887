// A real `courier serve` per test file: SQLite in a temp dir, loopback, a port the server
// picks, a config written for the test. The binary is $COURIER_BIN, else the release build
// of this repository.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const CLIENT_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const ADMIN_TOKEN = "clients-js-test-admin-token";

export interface ServerOptions {
  /** `gateway.heartbeat_secs` (default 90). */
  heartbeatSecs?: number;
}

export interface TestServer {
  /** `http://127.0.0.1:PORT` */
  url: string;
  host: string;
  port: number;
  /** Registers a user (password `password-<id>`) and returns its token. */
  register(userId: string): Promise<string>;
  /** An admin request; returns the JSON answer, throws on an error status. */
  admin(method: string, path: string): Promise<unknown>;
  /** Stops the process (SIGTERM) and starts it again on the same port and database. */
  restart(): Promise<void>;
  /** Stops the process and removes its temp dir. */
  stop(): Promise<void>;
  /** The server's recent output, for failure messages. */
  log(): string;
}

// A test process stopped by a signal takes its servers with it (an exception already does,
// through the "exit" hook of each server).
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => process.exit(signal === "SIGINT" ? 130 : 143));
}

export function courierBin(): string {
  return process.env.COURIER_BIN || path.resolve(CLIENT_DIR, "../../target/release/courier");
}

export async function startServer(options: ServerOptions = {}): Promise<TestServer> {
  const bin = courierBin();
  if (!existsSync(bin)) throw new Error(`no server binary at ${bin}: build it or set COURIER_BIN`);
  const dir = mkdtempSync(path.join(tmpdir(), "courier-js-"));
  const configPath = path.join(dir, "courier.toml");
  const writeConfig = (listen: string) =>
    writeFileSync(
      configPath,
      [
        "[server]",
        `listen = "${listen}"`,
        `admin_token = "${ADMIN_TOKEN}"`,
        "[storage]",
        `url = "sqlite://${path.join(dir, "c.db")}"`,
        `sqlite_synchronous = "normal"`,
        "[runtime]",
        `cache_dir = ""`,
        "[auth]",
        "attempts_per_minute_per_address = 0",
        "failed_logins_per_hour_per_account = 0",
        "[gateway]",
        "send_rate_per_sec = 100000",
        "send_burst = 100000",
        `heartbeat_secs = ${options.heartbeatSecs ?? 90}`,
        "",
      ].join("\n"),
    );
  writeConfig("127.0.0.1:0");

  let output = "";
  const record = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-20_000);
  };
  let child: ChildProcess | undefined;

  const launch = async (): Promise<string> => {
    const env: NodeJS.ProcessEnv = {};
    for (const [key, value] of Object.entries(process.env)) {
      if (!(key.startsWith("COURIER_") && key.includes("__"))) env[key] = value;
    }
    const started = spawn(bin, ["serve", "-c", configPath], { env, stdio: ["ignore", "pipe", "pipe"] });
    child = started;
    started.stderr!.on("data", record);

    // "listening on 127.0.0.1:PORT" is the first line on stdout (port 0 picks a free one).
    return new Promise<string>((resolve, reject) => {
      let stdout = "";
      const timer = setTimeout(() => reject(new Error(`the server did not start in 120 s:\n${output}`)), 120_000);
      started.stdout!.on("data", (chunk: Buffer) => {
        record(chunk);
        stdout += chunk.toString();
        const match = /listening on (\S+)/.exec(stdout);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]!);
        }
      });
      started.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the server exited (${code}) before listening:\n${output}`));
      });
    });
  };

  // If the test process ends without stop(), the server and its files go with it.
  const cleanUp = () => {
    child?.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  process.once("exit", cleanUp);

  const address = await launch();
  const [host, portText] = address.split(":") as [string, string];
  const port = Number(portText);
  const url = `http://${host}:${port}`;
  await waitHealthy(url, () => output);

  const stopProcess = async () => {
    const running = child;
    if (!running || running.exitCode !== null || running.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => running.once("exit", () => resolve()));
    running.kill("SIGTERM");
    const timer = setTimeout(() => running.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  };

  return {
    url,
    host,
    port,
    async register(userId) {
      const response = await fetch(`${url}/v1/auth/register`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ userId, password: `password-${userId}` }),
      });
      const body = (await response.json()) as { token?: string };
      if (response.status !== 201 || !body.token) throw new Error(`register ${userId}: ${response.status} ${JSON.stringify(body)}`);
      return body.token;
    },
    async admin(method, adminPath) {
      const response = await fetch(url + adminPath, { method, headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      const body = await response.json();
      if (!response.ok) throw new Error(`${method} ${adminPath}: ${response.status} ${JSON.stringify(body)}`);
      return body;
    },
    async restart() {
      await stopProcess();
      writeConfig(`${host}:${port}`);
      await launch();
      await waitHealthy(url, () => output);
    },
    async stop() {
      await stopProcess();
      process.off("exit", cleanUp);
      rmSync(dir, { recursive: true, force: true });
    },
    log: () => output,
  };
}

/** Polls `GET /healthz` until it answers 200 (at most 600 tries, 50 ms apart). */
async function waitHealthy(url: string, log: () => string): Promise<void> {
  let last = "";
  for (let attempt = 0; attempt < 600; attempt++) {
    try {
      const response = await fetch(`${url}/healthz`);
      if (response.ok) return;
      last = `HTTP ${response.status}`;
    } catch (err) {
      last = String(err);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${url}/healthz never answered 200 (${last}):\n${log()}`);
}

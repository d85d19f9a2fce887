/**
 * An error from the server (its stable `code`, e.g. `not_a_member`, with `status` over
 * HTTP) or from the SDK itself:
 *
 * - `network`: the HTTP request did not get an answer;
 * - `timeout`: a send got no ack after its last resend;
 * - `closed`: the client was closed, or the server ended its session for good
 *   (the `kicked` reason is in `reason`), before an answer;
 * - `offline`: a send that may not wait (typing) found no open session;
 * - `frame_too_large`: the frame is over the server's `maxFrameBytes`; nothing was sent.
 */
export interface CourierErrorDetails {
  /** The HTTP status, for an error answered over HTTP. */
  status?: number;
  /** With `payload_invalid`: the plugin's rejection code; with `closed`: why. */
  reason?: string;
  /** The server's `x-request-id` of the failed request: quote it in a report. */
  requestId?: string;
  cause?: unknown;
}

export class CourierError extends Error {
  override readonly name = "CourierError";
  readonly status: number | undefined;
  readonly reason: string | undefined;
  readonly requestId: string | undefined;

  constructor(
    readonly code: string,
    message: string,
    details: CourierErrorDetails = {},
  ) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.status = details.status;
    this.reason = details.reason;
    this.requestId = details.requestId;
  }
}

/** Codes after which the same send may succeed later: it stays in the outbox. */
export const RETRYABLE_SEND_CODES: ReadonlySet<string> = new Set([
  "rate_limited",
  "store_unavailable",
  "plugin_busy",
]);

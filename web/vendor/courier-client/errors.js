export class CourierError extends Error {
    code;
    name = "CourierError";
    status;
    reason;
    requestId;
    constructor(code, message, details = {}) {
        super(message, details.cause === undefined ? undefined : { cause: details.cause });
        this.code = code;
        this.status = details.status;
        this.reason = details.reason;
        this.requestId = details.requestId;
    }
}
/** Codes after which the same send may succeed later: it stays in the outbox. */
export const RETRYABLE_SEND_CODES = new Set([
    "rate_limited",
    "store_unavailable",
    "plugin_busy",
]);

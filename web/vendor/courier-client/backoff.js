export const DEFAULT_BACKOFF = { initialMs: 500, maxMs: 30_000 };
/**
 * The wait before reconnect attempt `attempt` (0 for the first retry): exponential with
 * jitter. The ceiling doubles per attempt from `initialMs` up to `maxMs`, and the delay
 * is drawn uniformly from its upper half, so clients that lost the same server spread out
 * and none retries sooner than half the ceiling.
 */
export function backoffDelay(attempt, options = DEFAULT_BACKOFF, random = Math.random) {
    const exponent = Math.min(Math.max(0, Math.floor(attempt)), 30);
    const ceiling = Math.min(options.maxMs, options.initialMs * 2 ** exponent);
    return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

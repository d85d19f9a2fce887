export interface BackoffOptions {
  /** The ceiling of the first delay, in ms. */
  initialMs: number;
  /** The largest ceiling, in ms. */
  maxMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { initialMs: 500, maxMs: 30_000 };

/**
 * The wait before reconnect attempt `attempt` (0 for the first retry): exponential with
 * jitter. The ceiling doubles per attempt from `initialMs` up to `maxMs`, and the delay
 * is drawn uniformly from its upper half, so clients that lost the same server spread out
 * and none retries sooner than half the ceiling.
 */
export function backoffDelay(
  attempt: number,
  options: BackoffOptions = DEFAULT_BACKOFF,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(0, Math.floor(attempt)), 30);
  const ceiling = Math.min(options.maxMs, options.initialMs * 2 ** exponent);
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

import { MamError } from "@mam/core";

/**
 * How the adapters read an AWS SDK v3 failure. The SDK gives a service error a
 * `name` (its error shape) and `$metadata.httpStatusCode`; a failure below HTTP
 * (refused connection, reset socket, DNS, a timeout or an abort) has no status, only
 * a Node `code` or an `AbortError`/`TimeoutError` name.
 */
export interface SdkFailure {
  readonly name: string;
  readonly code: string | undefined;
  /** Undefined when no HTTP response came back. */
  readonly status: number | undefined;
  /** The SDK attached `$metadata`: the failure came out of a `send`, not our own code. */
  readonly fromSdk: boolean;
}

export function readSdkFailure(err: unknown): SdkFailure {
  if (typeof err !== "object" || err === null) return { name: String(err), code: undefined, status: undefined, fromSdk: false };
  const e = err as { name?: unknown; code?: unknown; Code?: unknown; $metadata?: { httpStatusCode?: unknown } };
  const status = typeof e.$metadata?.httpStatusCode === "number" ? e.$metadata.httpStatusCode : undefined;
  const code = typeof e.code === "string" ? e.code : typeof e.Code === "string" ? e.Code : undefined;
  return { name: typeof e.name === "string" ? e.name : "Error", code, status, fromSdk: typeof e.$metadata === "object" };
}

/** Service answers that mean "not now": throttling and the service's own failures. */
const TRANSIENT_NAMES = new Set([
  "ProvisionedThroughputExceededException",
  "ThrottlingException",
  "Throttling",
  "ThrottledException",
  "RequestLimitExceeded",
  "LimitExceededException",
  "InternalServerError",
  "InternalFailure",
  "InternalFailureException",
  "InternalError",
  "ServiceUnavailable",
  "ServiceUnavailableException",
  "SlowDown",
  "RequestTimeout",
  "RequestTimeoutException",
  "TimeoutError",
  "AbortError",
  "TransactionInProgressException",
]);

/** Node socket-level failures: nothing reached the service, or the answer was lost. */
const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENETDOWN",
  "ERR_SOCKET_CONNECTION_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/** No HTTP answer at all: the peer could not be reached (or did not answer in time). */
export function isNetworkFailure(f: SdkFailure): boolean {
  if (f.code !== undefined && NETWORK_CODES.has(f.code)) return true;
  if (f.name === "TimeoutError" || f.name === "AbortError") return true;
  // The SDK's own retry wrapper attaches `$metadata` (attempts, no status) to a
  // socket error it gave up on; an error without it came from our own code.
  return f.status === undefined && f.fromSdk;
}

/** Worth retrying later: throttled, the service failed, or it could not be reached. */
export function isTransient(f: SdkFailure): boolean {
  if (TRANSIENT_NAMES.has(f.name) || (f.code !== undefined && TRANSIENT_NAMES.has(f.code))) return true;
  if (f.status !== undefined && (f.status >= 500 || f.status === 429)) return true;
  return isNetworkFailure(f);
}

/**
 * The one mapping both storage adapters use for a failure they did not expect:
 * transient ones become the retryable `store.unavailable`; anything else is a
 * programming or configuration fault (`internal`), with the SDK error as the cause.
 */
export function storeFailure(err: unknown, what: string): MamError {
  if (err instanceof MamError) return err;
  const f = readSdkFailure(err);
  const detail = `${f.name}${f.code !== undefined && f.code !== f.name ? ` ${f.code}` : ""}${f.status !== undefined ? ` (HTTP ${f.status})` : ""}`;
  if (isTransient(f)) {
    return new MamError("store.unavailable", `${what}: the store could not be reached or throttled the request: ${detail}`, {
      cause: err,
      details: { sdkError: f.name, ...(f.status !== undefined ? { httpStatus: f.status } : {}) },
    });
  }
  const message = err instanceof Error ? err.message : String(err);
  return new MamError("internal", `${what} failed: ${detail}: ${message}`, { cause: err, details: { sdkError: f.name } });
}

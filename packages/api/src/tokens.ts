import { createHmac, timingSafeEqual } from "node:crypto";
import { AttemptId, type Clock, isMamError, JobId, MamError } from "@mam/core";
import * as z from "zod";

/**
 * Bearer tokens: compact JWTs (HS256) signed with one key from configuration.
 * Hand-rolled on node:crypto rather than `hono/jwt` so that expiry is judged by the
 * injected clock (tests pin time) and the signature check is an explicit
 * constant-time comparison.
 *
 * Two kinds:
 * - operator: carries scopes (a subset of `read`, `write`, `gate`, `ops`, `observe`);
 *   expires only if minted with a TTL (the embedded bootstrap token does not). A
 *   token minted before `observe` existed (no `sv` claim) with every scope there was
 *   then (the bootstrap token of an older data dir) holds `observe` too: a token with
 *   every scope keeps every scope as scopes are added. A token minted since carries
 *   `sv` and exactly the scopes it names.
 * - agent: minted at dispatch, bound to one job and one attempt, always expiring.
 *   A newer dispatch of the same job retires it: the API checks, on every agent
 *   request, that the token's attempt is still the job's latest dispatch.
 */
export const SCOPES = ["read", "write", "gate", "ops", "observe"] as const;
export const ScopeSchema = z.enum(SCOPES);
export type Scope = z.infer<typeof ScopeSchema>;

export type Principal =
  | {
      readonly kind: "operator";
      readonly tokenId: string;
      readonly scopes: readonly Scope[];
      readonly expiresAt?: string;
      /**
       * Who the token is for (`mam token create --name`), when minted with one: a
       * renewed token of the same name is the same subscriber to the MQTT broker,
       * whose persistent sessions belong to the name, not to one token.
       */
      readonly name?: string;
    }
  | {
      readonly kind: "agent";
      readonly tokenId: string;
      readonly jobId: string;
      readonly attemptId: number;
      readonly expiresAt: string;
    };

export interface MintedAgentToken {
  readonly token: string;
  readonly tokenId: string;
  /** ISO-8601. */
  readonly expiresAt: string;
}

export interface TokenService {
  /** An operator token with these scopes; without `ttlSeconds` it does not expire. */
  mintOperator(scopes: readonly Scope[], opts?: { ttlSeconds?: number; name?: string }): string;
  /** An agent token bound to one job and one attempt, expiring after the agent TTL. */
  mintAgent(jobId: string, attemptId: number): MintedAgentToken;
  /** The principal a token names. Throws `auth.invalid` (malformed, bad signature, expired). */
  verify(token: string): Principal;
}

export interface TokenServiceOptions {
  /** At least 32 characters (the same rule as MAM_TOKEN_SIGNING_KEY). */
  readonly signingKey: string;
  readonly clock: Clock;
  /** Agent token lifetime; 24 h by default. */
  readonly agentTtlSeconds?: number;
  /** Token ids; random UUIDs by default. */
  readonly newTokenId?: () => string;
}

const ISSUER = "mam";
const HEADER = base64url(Buffer.from(JSON.stringify({ alg: "HS256", typ: "JWT" })));
const B64URL = /^[A-Za-z0-9_-]+$/;
const MIN_KEY_LENGTH = 32;
const MAX_TOKEN_LENGTH = 4096;
const VERIFIED_CACHE_SIZE = 1024;

/** Every scope there was before `observe` was added: a token minted then holding them all was minted with every scope. */
const SCOPES_BEFORE_OBSERVE: readonly Scope[] = ["read", "write", "gate", "ops"];
/** The scope set operator tokens are minted against now (their `sv` claim). */
const SCOPE_VERSION = 2;

/** An older token's scopes (no `sv`), with those added since when it was minted with every scope there was. */
function withAddedScopes(scopes: readonly Scope[]): readonly Scope[] {
  if (scopes.includes("observe") || !SCOPES_BEFORE_OBSERVE.every((s) => scopes.includes(s))) return scopes;
  return [...scopes, "observe"];
}

/** A token's name: what a subscriber's persistent sessions belong to (letters, digits, `.`, `_`, `-`; at most 64). */
export const TokenName = z.string().regex(/^[A-Za-z0-9._-]{1,64}$/, "a name is 1 to 64 letters, digits, '.', '_' or '-'");

const Common = {
  iss: z.literal(ISSUER),
  jti: z.string().min(1).max(128),
  iat: z.number().int(),
};
const ClaimsSchema = z.discriminatedUnion("kind", [
  z.strictObject({
    ...Common,
    kind: z.literal("operator"),
    scopes: z.array(ScopeSchema).min(1),
    exp: z.number().int().optional(),
    name: TokenName.optional(),
    /** The scope set it was minted against: 2 since `observe` (absent: minted before it). */
    sv: z.literal(SCOPE_VERSION).optional(),
  }),
  z.strictObject({ ...Common, kind: z.literal("agent"), job_id: JobId, attempt_id: AttemptId, exp: z.number().int() }),
]);
type Claims = z.infer<typeof ClaimsSchema>;

export function createTokenService(opts: TokenServiceOptions): TokenService {
  if (opts.signingKey.length < MIN_KEY_LENGTH) {
    throw new MamError("config.invalid", `the token signing key must be at least ${MIN_KEY_LENGTH} characters`);
  }
  const key = Buffer.from(opts.signingKey, "utf8");
  const agentTtl = opts.agentTtlSeconds ?? 86_400;
  const newTokenId = opts.newTokenId ?? (() => globalThis.crypto.randomUUID());
  const nowSeconds = () => Math.floor(opts.clock.now().getTime() / 1000);
  const verified = new Map<string, { principal: Principal; exp: number | undefined }>();
  const expired = (exp: number | undefined): exp is number => exp !== undefined && exp <= nowSeconds();
  const expiredAt = (exp: number): MamError => invalid(`the token expired at ${new Date(exp * 1000).toISOString()}`);
  const mac = (signingInput: string) => createHmac("sha256", key).update(signingInput).digest();

  const sign = (claims: Claims): string => {
    const body = `${HEADER}.${base64url(Buffer.from(JSON.stringify(claims)))}`;
    return `${body}.${base64url(mac(body))}`;
  };

  return {
    mintOperator(scopes, mintOpts = {}) {
      const parsed = z.array(ScopeSchema).min(1).safeParse(scopes);
      if (!parsed.success) {
        throw new MamError("input.invalid", `operator scopes are a non-empty subset of ${SCOPES.join(", ")}`, {
          issues: [{ path: "scopes", message: parsed.error.issues[0]?.message ?? "invalid" }],
        });
      }
      if (mintOpts.name !== undefined) {
        const name = TokenName.safeParse(mintOpts.name);
        if (!name.success) {
          throw new MamError(
            "input.invalid",
            `the token's name ${JSON.stringify(mintOpts.name)} is not one: ${name.error.issues[0]?.message}`,
            {
              issues: [{ path: "name", message: name.error.issues[0]?.message ?? "invalid" }],
            },
          );
        }
      }
      const iat = nowSeconds();
      return sign({
        iss: ISSUER,
        kind: "operator",
        jti: newTokenId(),
        iat,
        scopes: [...new Set(parsed.data)],
        sv: SCOPE_VERSION,
        ...(mintOpts.ttlSeconds === undefined ? {} : { exp: iat + mintOpts.ttlSeconds }),
        ...(mintOpts.name === undefined ? {} : { name: mintOpts.name }),
      });
    },

    mintAgent(jobId, attemptId) {
      const iat = nowSeconds();
      const exp = iat + agentTtl;
      const tokenId = newTokenId();
      const token = sign({ iss: ISSUER, kind: "agent", jti: tokenId, iat, exp, job_id: jobId, attempt_id: attemptId });
      return { token, tokenId, expiresAt: new Date(exp * 1000).toISOString() };
    },

    verify(token) {
      // A token that verified once is remembered (bounded): a dashboard or an agent
      // sends the same token on every request, and the HMAC and claim parsing were
      // a fifth of a cheap request's cost (bench/http.ts). Expiry is still judged
      // on every use; only tokens whose signature verified are ever remembered.
      const known = verified.get(token);
      if (known !== undefined) {
        if (expired(known.exp)) {
          verified.delete(token);
          throw expiredAt(known.exp);
        }
        return known.principal;
      }
      const entry = verifyUncached(token);
      if (verified.size >= VERIFIED_CACHE_SIZE) verified.delete(verified.keys().next().value as string);
      verified.set(token, entry);
      return entry.principal;
    },
  };

  function verifyUncached(token: string): { principal: Principal; exp: number | undefined } {
    if (token.length > MAX_TOKEN_LENGTH) throw invalid("the token is too long");
    const parts = token.split(".");
    if (parts.length !== 3 || !parts.every((p) => B64URL.test(p))) throw invalid("the token is not a signed JWT");
    const [header, payload, signature] = parts as [string, string, string];
    // Only our own header is accepted: no `alg: none`, no algorithm switching.
    if (header !== HEADER) throw invalid("the token's header is not HS256");
    const expected = mac(`${header}.${payload}`);
    const given = Buffer.from(signature, "base64url");
    // Re-encoding refuses a second spelling of the same bytes (unused trailing bits).
    const canonical = base64url(given) === signature;
    if (!canonical || given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw invalid("the token's signature does not verify");
    }
    let json: unknown;
    try {
      json = JSON.parse(Buffer.from(payload, "base64url").toString("utf8"));
    } catch {
      throw invalid("the token's claims are not JSON");
    }
    const claims = ClaimsSchema.safeParse(json);
    if (!claims.success) throw invalid("the token's claims are not ones this service issues");
    const c = claims.data;
    if (expired(c.exp)) throw expiredAt(c.exp);
    if (c.kind === "operator") {
      return {
        exp: c.exp,
        principal: {
          kind: "operator",
          tokenId: c.jti,
          scopes: c.sv === undefined ? withAddedScopes(c.scopes) : c.scopes,
          ...(c.exp === undefined ? {} : { expiresAt: new Date(c.exp * 1000).toISOString() }),
          ...(c.name === undefined ? {} : { name: c.name }),
        },
      };
    }
    return {
      exp: c.exp,
      principal: {
        kind: "agent",
        tokenId: c.jti,
        jobId: c.job_id,
        attemptId: c.attempt_id,
        expiresAt: new Date(c.exp * 1000).toISOString(),
      },
    };
  }
}

/**
 * Who may log in to the embedded broker as a subscriber: an operator token with the
 * read scope and a name (the name owns its persistent sessions), as the API
 * verifies it; an agent token may not, whatever its job.
 */
export function verifySubscriberLogin(tokens: TokenService, token: string): { readonly name: string } | { readonly refused: string } {
  let principal: ReturnType<TokenService["verify"]>;
  try {
    principal = tokens.verify(token);
  } catch (e) {
    return { refused: isMamError(e) ? e.message : "the token does not verify" };
  }
  if (principal.kind !== "operator") return { refused: "an agent token may not log in to the broker; subscribers use an operator token" };
  if (!principal.scopes.includes("read")) return { refused: "this operator token lacks the read scope" };
  if (principal.name === undefined) return { refused: "this operator token has no name: mint one with mam token create --name NAME" };
  return { name: principal.name };
}

function invalid(detail: string): MamError {
  return new MamError("auth.invalid", detail);
}

function base64url(bytes: Buffer): string {
  return bytes.toString("base64url");
}

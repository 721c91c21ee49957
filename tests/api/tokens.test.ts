import { createHmac } from "node:crypto";
import { createTokenService } from "@mam/api";
import { describe, expect, it } from "vitest";
import { TestClock } from "../support/clock.ts";
import { SIGNING_KEY } from "./harness.ts";

const b64 = (v: unknown) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");

/** Sign arbitrary header and claims with the service's key, as a forger who had it would. */
function forge(header: unknown, claims: unknown, key = SIGNING_KEY): string {
  const body = `${b64(header)}.${b64(claims)}`;
  return `${body}.${createHmac("sha256", key).update(body).digest("base64url")}`;
}

describe("token service", () => {
  const setup = (agentTtlSeconds?: number) => {
    const clock = new TestClock("2026-11-20T10:00:00.000Z");
    const tokens = createTokenService({ signingKey: SIGNING_KEY, clock, ...(agentTtlSeconds === undefined ? {} : { agentTtlSeconds }) });
    return { clock, tokens };
  };

  it("an operator token carries its scopes (deduplicated), a token id, and no expiry unless given one", () => {
    const { tokens, clock } = setup();
    const p = tokens.verify(tokens.mintOperator(["read", "gate", "read"]));
    expect(p).toMatchObject({ kind: "operator", scopes: ["read", "gate"] });
    expect(p.tokenId).toMatch(/^[0-9a-f-]{36}$/);
    expect(p.expiresAt).toBeUndefined();
    const short = tokens.mintOperator(["ops"], { ttlSeconds: 30 });
    expect(tokens.verify(short).expiresAt).toBe("2026-11-20T10:00:30.000Z");
    clock.advance(30_000);
    expect(() => tokens.verify(short)).toThrow(expect.objectContaining({ code: "auth.invalid" }));
  });

  it("refuses to mint an operator token without scopes or with an unknown scope", () => {
    const { tokens } = setup();
    expect(() => tokens.mintOperator([])).toThrow(expect.objectContaining({ code: "input.invalid" }));
    expect(() => tokens.mintOperator(["admin" as "read"])).toThrow(expect.objectContaining({ code: "input.invalid" }));
  });

  it("an agent token is bound to one job and attempt and expires after the agent TTL (24 h by default)", () => {
    const { tokens, clock } = setup();
    const minted = tokens.mintAgent("job-1", 3);
    expect(minted.expiresAt).toBe("2026-11-21T10:00:00.000Z");
    expect(tokens.verify(minted.token)).toEqual({
      kind: "agent",
      tokenId: minted.tokenId,
      jobId: "job-1",
      attemptId: 3,
      expiresAt: minted.expiresAt,
    });
    clock.advance(86_399_000);
    expect(tokens.verify(minted.token).kind).toBe("agent");
    clock.advance(1000);
    expect(() => tokens.verify(minted.token)).toThrow(/expired/);

    const custom = setup(60);
    expect(custom.tokens.mintAgent("job-1", 1).expiresAt).toBe("2026-11-20T10:01:00.000Z");
  });

  it("token ids are unique", () => {
    const { tokens } = setup();
    const ids = new Set(Array.from({ length: 50 }, () => tokens.mintAgent("j", 1).tokenId));
    expect(ids.size).toBe(50);
  });

  it("refuses a signature by another key, a flipped signature byte, and a second spelling of the same signature", () => {
    const { tokens, clock } = setup();
    const other = createTokenService({ signingKey: "x".repeat(32), clock });
    expect(() => tokens.verify(other.mintOperator(["read"]))).toThrow(/signature/);

    const good = tokens.mintOperator(["read"]);
    const [h, p, s] = good.split(".") as [string, string, string];
    const sig = Buffer.from(s, "base64url");
    sig[0] = (sig[0] ?? 0) ^ 1;
    expect(() => tokens.verify(`${h}.${p}.${sig.toString("base64url")}`)).toThrow(/signature/);

    // 32 bytes in 43 characters leave two unused bits in the last one.
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const last = alphabet.indexOf(s.at(-1)!);
    const respelled = `${s.slice(0, -1)}${alphabet[last ^ 1]}`;
    expect(Buffer.from(respelled, "base64url")).toEqual(Buffer.from(s, "base64url"));
    expect(() => tokens.verify(`${h}.${p}.${respelled}`)).toThrow(/signature/);
  });

  it("accepts only its own HS256 header and only the claims it issues", () => {
    const { tokens } = setup();
    const claims = { iss: "mam", kind: "operator", jti: "t", iat: 0, scopes: ["read"] };
    expect(tokens.verify(forge({ alg: "HS256", typ: "JWT" }, claims)).kind).toBe("operator");
    expect(() => tokens.verify(forge({ alg: "HS512", typ: "JWT" }, claims))).toThrow(/header/);
    expect(() => tokens.verify(`${b64({ alg: "none", typ: "JWT" })}.${b64(claims)}.`)).toThrow(
      expect.objectContaining({ code: "auth.invalid" }),
    );
    expect(() => tokens.verify(forge({ alg: "HS256", typ: "JWT" }, { ...claims, iss: "elsewhere" }))).toThrow(/claims/);
    expect(() => tokens.verify(forge({ alg: "HS256", typ: "JWT" }, { ...claims, admin: true }))).toThrow(/claims/);
    expect(() => tokens.verify(forge({ alg: "HS256", typ: "JWT" }, { ...claims, scopes: ["root"] }))).toThrow(/claims/);
    expect(() =>
      tokens.verify(
        forge({ alg: "HS256", typ: "JWT" }, { iss: "mam", kind: "agent", jti: "t", iat: 0, exp: 9e9, job_id: "../x", attempt_id: 1 }),
      ),
    ).toThrow(/claims/);
    expect(() => tokens.verify("a.b")).toThrow(/not a signed JWT/);
    expect(() => tokens.verify("a.b.c=")).toThrow(/not a signed JWT/);
    expect(() => tokens.verify(`${"a".repeat(5000)}.b.c`)).toThrow(/too long/);
  });

  it("refuses a signing key shorter than 32 characters", () => {
    expect(() => createTokenService({ signingKey: "short", clock: new TestClock("2026-01-01T00:00:00Z") })).toThrow(
      expect.objectContaining({ code: "config.invalid" }),
    );
  });
});

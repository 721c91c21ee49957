import { z } from "@hono/zod-openapi";
import { AttemptId, IsoTime, JobId } from "@mam/core";
import { anyToken, principalOf } from "../access.ts";
import { defineRoute, jsonAnswer } from "../openapi.ts";
import { SCOPES } from "../tokens.ts";
import { withHandler } from "./support.ts";

export const TokenInfoSchema = z
  .union([
    z.strictObject({
      kind: z.literal("operator"),
      token_id: z.string().min(1),
      scopes: z.array(z.enum(SCOPES)),
      name: z.string().optional().openapi({ description: "Who the token is for (`mam token create --name`), when it names one." }),
      expires_at: IsoTime.optional().openapi({ description: "Absent: the token does not expire." }),
    }),
    z.strictObject({
      kind: z.literal("agent"),
      token_id: z.string().min(1),
      job_id: JobId,
      attempt_id: AttemptId,
      expires_at: IsoTime,
    }),
  ])
  .openapi("TokenInfo");

export const getTokenRoute = withHandler(
  defineRoute(anyToken, {
    operationId: "getToken",
    method: "get",
    path: "/v1/token",
    tags: ["meta"],
    summary: "What the token that asks may do",
    description:
      "Any valid token: an operator token's scopes, name and expiry; an agent token's job, attempt and expiry (a retired agent token is 403). A page reads it to hide the actions its token cannot take. Never the token itself.",
    responses: {
      200: jsonAnswer("The token's principal.", TokenInfoSchema, {
        kind: "operator",
        token_id: "5b0c2f9e-1d3a-4c5e-8f70-9a1b2c3d4e5f",
        scopes: ["read"],
        name: "dashboard",
        expires_at: "2026-11-20T18:00:00.000Z",
      }),
    },
  }),
  (c) => {
    const p = principalOf(c);
    if (p.kind === "agent") {
      return c.json(
        { kind: "agent" as const, token_id: p.tokenId, job_id: p.jobId, attempt_id: p.attemptId, expires_at: p.expiresAt },
        200,
      );
    }
    return c.json(
      {
        kind: "operator" as const,
        token_id: p.tokenId,
        scopes: [...p.scopes],
        ...(p.name === undefined ? {} : { name: p.name }),
        ...(p.expiresAt === undefined ? {} : { expires_at: p.expiresAt }),
      },
      200,
    );
  },
);

import {
  AttemptId,
  DecisionSchema,
  DispatchRecordSchema,
  DispatchRequestSchema,
  ERROR_TABLE,
  EventLogEntrySchema,
  JobId,
  JobRecordSchema,
  ManifestSchema,
  NotificationIntentSchema,
  PublishEventRequestSchema,
  RegisterJobSchema,
  ScenarioSchema,
  SideEffectSchema,
  TransitionRequestSchema,
} from "@mam/core";
import * as z from "zod";
import { type Access, ROUTE_PERMISSIONS } from "./access.ts";
import { PROBLEM_CONTENT_TYPE, ROUTING_PROBLEMS } from "./problem.ts";
import { ROUTES, type RouteSpec, routeKey } from "./routes.ts";
import {
  DispatchResponseSchema,
  EvaluationRequestSchema,
  EventLogSchema,
  FinalizedSchema,
  FinalizeRequestSchema,
  GateResponseSchema,
  HealthSchema,
  JobPageSchema,
  NotificationReleaseRequestSchema,
  NotificationReleaseResultSchema,
  ProblemSchema,
  PublishEventResponseSchema,
  RecoverySweepRequestSchema,
  RecoverySweepResultSchema,
  ScenarioInputSchema,
  StagedReportSchema,
  VerificationSchema,
} from "./wire.ts";

/**
 * The OpenAPI 3.1 document, generated from the route table and the same zod
 * schemas the handlers validate with (`z.toJSONSchema`); nothing is written twice.
 */

type JsonSchema = Record<string, unknown>;
export type OpenApiDocument = Record<string, unknown> & { paths: Record<string, Record<string, unknown>> };

/** Named components: every schema a route refers to by name. */
const COMPONENTS: readonly [string, z.ZodType][] = [
  ["JobRecord", JobRecordSchema],
  ["NotificationIntent", NotificationIntentSchema],
  ["RegisterJob", RegisterJobSchema],
  ["TransitionRequest", TransitionRequestSchema],
  ["DispatchRequest", DispatchRequestSchema],
  ["DispatchRecord", DispatchRecordSchema],
  ["DispatchResponse", DispatchResponseSchema],
  ["SideEffect", SideEffectSchema],
  ["FinalizeRequest", FinalizeRequestSchema],
  ["Manifest", ManifestSchema],
  ["Finalized", FinalizedSchema],
  ["StagedReport", StagedReportSchema],
  ["Verification", VerificationSchema],
  ["Scenario", ScenarioSchema],
  ["EvaluationRequest", EvaluationRequestSchema],
  ["Decision", DecisionSchema],
  ["GateResponse", GateResponseSchema],
  ["PublishEventRequest", PublishEventRequestSchema],
  ["PublishEventResponse", PublishEventResponseSchema],
  ["EventLogEntry", EventLogEntrySchema],
  ["EventLog", EventLogSchema],
  ["JobPage", JobPageSchema],
  ["RecoverySweepRequest", RecoverySweepRequestSchema],
  ["RecoverySweepResult", RecoverySweepResultSchema],
  ["NotificationReleaseRequest", NotificationReleaseRequestSchema],
  ["NotificationReleaseResult", NotificationReleaseResultSchema],
  ["Health", HealthSchema],
  ["Problem", ProblemSchema],
];

const REF = (name: string) => `#/components/schemas/${name}`;
const SHARED = "#/components/schemas/__shared#/$defs/";

function componentSchemas(): { schemas: Record<string, JsonSchema>; idOf: Map<z.ZodType, string> } {
  const registry = z.registry<{ id: string }>();
  const idOf = new Map<z.ZodType, string>();
  for (const [id, schema] of COMPONENTS) {
    registry.add(schema, { id });
    idOf.set(schema, id);
  }
  const out = z.toJSONSchema(registry, {
    target: "draft-2020-12",
    io: "input",
    unrepresentable: "any",
    uri: REF,
    // The gate reads the scenario raw; its documented shape is core's ScenarioSchema.
    override: (ctx) => {
      if (ctx.zodSchema === ScenarioInputSchema) {
        for (const k of Object.keys(ctx.jsonSchema)) delete (ctx.jsonSchema as JsonSchema)[k];
        Object.assign(ctx.jsonSchema, { $ref: REF("Scenario"), description: "read raw by the gate; a scenario it cannot read is a hold" });
      }
    },
  }) as { schemas: Record<string, JsonSchema> };
  return { schemas: liftShared(out.schemas), idOf };
}

/**
 * zod puts schemas shared between components (the recursive JSON value type) under
 * a `__shared` pseudo-component addressed as `__shared#/$defs/<n>`, which OpenAPI
 * tools cannot follow: lift each into a component of its own, merging identical ones.
 */
function liftShared(schemas: Record<string, JsonSchema>): Record<string, JsonSchema> {
  const shared = ((schemas.__shared as JsonSchema | undefined)?.$defs ?? {}) as Record<string, JsonSchema>;
  delete schemas.__shared;
  const names = new Map<string, string>();
  const byShape = new Map<string, string>();
  const lifted: Record<string, JsonSchema> = {};
  for (const [def, schema] of Object.entries(shared)) {
    const shape = JSON.stringify(schema).replaceAll(`"${SHARED}${def}"`, '"SELF"');
    let name = byShape.get(shape);
    if (name === undefined) {
      name = byShape.size === 0 ? "JsonValue" : `JsonValue${byShape.size + 1}`;
      byShape.set(shape, name);
      lifted[name] = schema;
    }
    names.set(`${SHARED}${def}`, REF(name));
  }
  const rewrite = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(rewrite);
    if (v === null || typeof v !== "object") return v;
    const o: JsonSchema = {};
    for (const [k, x] of Object.entries(v)) {
      if (k === "$schema" || k === "$id") continue;
      o[k] = k === "$ref" && typeof x === "string" ? (names.get(x) ?? x) : rewrite(x);
    }
    return o;
  };
  return rewrite({ ...schemas, ...lifted }) as Record<string, JsonSchema>;
}

function inline(schema: z.ZodType): JsonSchema {
  const { $schema: _, ...rest } = z.toJSONSchema(schema, { target: "draft-2020-12", io: "input", unrepresentable: "any" }) as JsonSchema;
  return rest;
}

const PATH_PARAM_DOCS: Record<string, { description: string; schema: () => JsonSchema }> = {
  job_id: { description: "the job id", schema: () => inline(JobId) },
  attempt: { description: "the attempt id: a positive integer", schema: () => inline(AttemptId) },
  file: { description: "an asset file name", schema: () => ({ type: "string", pattern: "^[A-Za-z0-9._-]+$" }) },
};

function problemResponse(status: number): Record<string, unknown> {
  const titles = [...Object.values(ERROR_TABLE), ...Object.values(ROUTING_PROBLEMS)].filter((e) => e.status === status).map((e) => e.title);
  return {
    description: titles.length > 0 ? titles.join("; ") : "Problem",
    headers:
      status === 401
        ? { "WWW-Authenticate": { description: "Bearer challenge", schema: { type: "string" } }, ...REQUEST_ID_HEADER }
        : REQUEST_ID_HEADER,
    content: { [PROBLEM_CONTENT_TYPE]: { schema: { $ref: REF("Problem") } } },
  };
}

const REQUEST_ID_HEADER = {
  "X-Request-Id": { description: "the request id (the caller's, when it sent a sane one)", schema: { type: "string" } },
};

function accessText(access: Access): string {
  if (access.kind === "public") return "Anyone.";
  const agent =
    access.agent === "job"
      ? " or the job's agent token"
      : access.agent === "attempt"
        ? " or the agent token of this job and attempt"
        : "; agent tokens are refused";
  return `Operator token with the \`${access.scope}\` scope${agent}.`;
}

function operation(spec: RouteSpec, idOf: Map<z.ZodType, string>, limits: { json: number; report: number }): Record<string, unknown> {
  const access: Access = ROUTE_PERMISSIONS[routeKey(spec)];
  const ref = (schema: z.ZodType): JsonSchema => {
    const id = idOf.get(schema);
    return id === undefined ? inline(schema) : { $ref: REF(id) };
  };
  const parameters: Record<string, unknown>[] = spec.params.map((name) => {
    const p = PATH_PARAM_DOCS[name]!;
    return { name, in: "path", required: true, description: p.description, schema: p.schema() };
  });
  if (spec.query) {
    const q = inline(spec.query) as { properties?: Record<string, JsonSchema>; required?: string[] };
    for (const [name, schema] of Object.entries(q.properties ?? {})) {
      const { description, ...rest } = schema;
      parameters.push({
        name,
        in: "query",
        required: (q.required ?? []).includes(name),
        ...(description === undefined ? {} : { description }),
        schema: rest,
      });
    }
  }

  const statuses = new Set<number>(spec.problems);
  if (spec.params.includes("job_id") || spec.params.includes("attempt") || spec.query || spec.body) statuses.add(400);
  if (spec.body?.kind === "json") {
    statuses.add(413);
    statuses.add(415);
  }
  if (spec.body?.kind === "report") statuses.add(413);
  if (access.kind === "protected") {
    statuses.add(401);
    statuses.add(403);
  }
  statuses.add(500);

  const s = spec.success;
  const successHeaders: Record<string, unknown> = { ...REQUEST_ID_HEADER };
  if ("etag" in s && s.etag) successHeaders.ETag = { description: "the record's transition_seq, quoted", schema: { type: "string" } };
  const successContent =
    "schema" in s && s.schema !== undefined
      ? { "application/json": { schema: ref(s.schema) } }
      : { [("media" in s && s.media) || "application/octet-stream"]: { schema: { type: "string" } } };

  const responses: Record<string, unknown> = {
    [String(s.status)]: { description: s.description, headers: successHeaders, content: successContent },
  };
  for (const status of [...statuses].sort()) responses[String(status)] = problemResponse(status);

  const op: Record<string, unknown> = {
    operationId: spec.operationId,
    summary: spec.summary,
    description: [spec.description, accessText(access)].filter((x) => x !== undefined).join("\n\n"),
    tags: [spec.tag],
    parameters,
    responses,
    security: access.kind === "public" ? [] : [{ bearerAuth: [access.scope] }],
    "x-mam-access": access,
  };
  if (spec.body?.kind === "json") {
    op.requestBody = {
      required: spec.body.optional !== true,
      description: `JSON, at most ${limits.json} bytes; unknown fields are refused`,
      content: { "application/json": { schema: ref(spec.body.schema) } },
    };
  } else if (spec.body?.kind === "report") {
    op.requestBody = {
      required: true,
      description: `The report body, at most ${limits.report} bytes, any content type`,
      content: {
        "text/markdown": { schema: { type: "string" } },
        "*/*": { schema: { type: "string", contentMediaType: "application/octet-stream" } },
      },
    };
  }
  return op;
}

export function buildOpenApi(opts: { jsonBodyLimit: number; reportBodyLimit: number }): OpenApiDocument {
  const { schemas, idOf } = componentSchemas();
  const paths: Record<string, Record<string, unknown>> = {};
  for (const spec of ROUTES as readonly RouteSpec[]) {
    paths[spec.path] ??= {};
    paths[spec.path]![spec.method] = operation(spec, idOf, { json: opts.jsonBodyLimit, report: opts.reportBodyLimit });
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "mam",
      version: "1",
      description:
        "The job registry, report store and completion gate for delegated AI coding agents. " +
        "Every error is `application/problem+json` (RFC 9457) with a stable `type` per `code`.",
    },
    servers: [{ url: "/" }],
    security: [{ bearerAuth: [] }],
    tags: ["jobs", "dispatch", "reports", "gate", "events", "operations", "meta"].map((name) => ({ name })),
    paths,
    components: {
      schemas,
      securitySchemes: {
        bearerAuth: {
          type: "http",
          scheme: "bearer",
          bearerFormat: "JWT",
          description:
            "Operator tokens carry scopes (read, write, gate, ops), listed as the roles each operation requires. " +
            "Agent tokens are bound to one job and one attempt, and retired by a newer dispatch of the job.",
        },
      },
    },
  };
}

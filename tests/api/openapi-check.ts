import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import type { Hono } from "hono";

/**
 * Every answer checked against the document the app serves (`GET /openapi.json`), by
 * an independent validator: Ajv's JSON Schema 2020-12 over the served JSON, never the
 * zod schemas it was generated from. The operation is found by method and path
 * template; its status must be declared, the answer's media type must be one it
 * declares, a JSON body must match that media type's schema, and every declared
 * header the answer carries must match its schema. An answer no operation owns (an
 * unknown route, a known path with another method) must be a 404 or 405 problem.
 */
export interface DocumentCheck {
  /** Problems with this answer, empty when it is what the document says. */
  check(method: string, url: string, res: { status: number; headers: Headers; body: unknown; text: string }): string[];
}

type Json = Record<string, unknown>;
interface Operation {
  readonly responses: Record<string, { content?: Record<string, unknown>; headers?: Record<string, { schema?: Json }> }>;
}

const checks = new WeakMap<Hono, Promise<DocumentCheck>>();
/** Compiled once per document text: the suites build an app per test, all serving the same document. */
const compiled = new Map<string, DocumentCheck>();

/** The check for `app`'s own document, read once per app. */
export function documentCheckFor(app: Hono): Promise<DocumentCheck> {
  let check = checks.get(app);
  if (check === undefined) {
    check = Promise.resolve(app.request("/openapi.json"))
      .then((res) => res.text())
      .then((text) => {
        let c = compiled.get(text);
        if (c === undefined) {
          c = compile(JSON.parse(text) as Json);
          compiled.set(text, c);
        }
        return c;
      });
    checks.set(app, check);
  }
  return check;
}

const DOC_ID = "https://mam.test/openapi.json";
/** OpenAPI's own keywords inside a Schema Object, beside JSON Schema's. */
const OAS_KEYWORDS = ["example", "discriminator", "xml", "externalDocs"];

export function compile(doc: Json): DocumentCheck {
  const ajv = new Ajv2020({ strict: true, allErrors: true, validateSchema: false });
  addFormats.default(ajv);
  // The document's own members (`paths`, `components`...) are keywords that assert
  // nothing at its root, so schemas inside it are addressed by JSON Pointer.
  ajv.addVocabulary([...OAS_KEYWORDS, ...Object.keys(doc), ...extensionKeywords(doc)]);
  ajv.addSchema({ ...doc, $id: DOC_ID });
  const validators = new Map<string, ValidateFunction>();
  const validatorAt = (pointer: string): ValidateFunction => {
    let v = validators.get(pointer);
    if (v === undefined) {
      v = ajv.getSchema(`${DOC_ID}#${pointer}`);
      if (v === undefined) throw new Error(`no schema at ${pointer}`);
      validators.set(pointer, v);
    }
    return v;
  };
  const paths = doc.paths as Record<string, Record<string, Operation>>;
  const templates = Object.keys(paths).map((template) => ({
    template,
    pattern: new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\\?\{[a-z_]+\\?\}/g, "[^/]+")}$`),
    literal: template.replace(/\{[a-z_]+\}/g, "").length,
  }));

  return {
    check(method, url, res) {
      const path = new URL(url, "http://mam.test").pathname;
      const at = `${method} ${path} answered ${res.status}`;
      // The most literal template wins: `/v1/jobs` before `/v1/jobs/{job_id}`.
      const match = templates.filter((t) => t.pattern.test(path)).sort((a, b) => b.literal - a.literal)[0];
      const operation = match === undefined ? undefined : paths[match.template]?.[method.toLowerCase()];
      if (match === undefined || operation === undefined) {
        if (res.status !== 404 && res.status !== 405) return [`${at}: no operation in the document serves it`];
        return schemaProblems(validatorAt("/components/schemas/Problem"), res.body, `${at} (no operation)`);
      }
      const pointer = `/paths/${pointerSegment(match.template)}/${method.toLowerCase()}/responses`;
      const status = String(res.status);
      const declared = operation.responses[status] ?? operation.responses[`${status[0]}XX`] ?? operation.responses.default;
      if (declared === undefined) {
        return [`${at}: status not declared for the operation (it declares ${Object.keys(operation.responses).join(", ")})`];
      }
      const key = operation.responses[status] !== undefined ? status : operation.responses[`${status[0]}XX`] ? `${status[0]}XX` : "default";
      const problems: string[] = [];
      for (const [name, header] of Object.entries(declared.headers ?? {})) {
        const value = res.headers.get(name);
        if (value === null || header.schema === undefined) continue;
        const v = validatorAt(`${pointer}/${pointerSegment(key)}/headers/${pointerSegment(name)}/schema`);
        problems.push(...schemaProblems(v, header.schema.type === "integer" ? Number(value) : value, `${at}: header ${name}`));
      }
      const content = declared.content ?? {};
      const type = res.headers.get("content-type");
      if (type === null) {
        if (res.text.length > 0) problems.push(`${at}: a body without a Content-Type`);
        if (Object.keys(content).length > 0 && res.text.length === 0) problems.push(`${at}: no body, but the document declares one`);
        return problems;
      }
      const essence = type.split(";")[0]!.trim().toLowerCase();
      const media = Object.keys(content).find(
        (m) => m === essence || m === "*/*" || (m.endsWith("/*") && essence.startsWith(m.slice(0, -1))),
      );
      if (media === undefined)
        return [...problems, `${at}: ${essence} is not among the declared ${Object.keys(content).join(", ") || "(none)"}`];
      if (/^application\/([a-z.-]+\+)?json$/.test(essence)) {
        const v = validatorAt(`${pointer}/${pointerSegment(key)}/content/${pointerSegment(media)}/schema`);
        problems.push(...schemaProblems(v, res.body, `${at}: body`));
      }
      return problems;
    },
  };
}

function schemaProblems(v: ValidateFunction, value: unknown, what: string): string[] {
  if (v(value)) return [];
  return (v.errors ?? []).map((e) => `${what}: ${e.instancePath || "(root)"} ${e.message ?? ""} ${JSON.stringify(e.params)}`);
}

/** A JSON Pointer segment. */
function pointerSegment(segment: string): string {
  return segment.replaceAll("~", "~0").replaceAll("/", "~1");
}

/** The `x-` keywords the document's schemas use (`x-max-bytes`, ...), so a strict Ajv knows them. */
function extensionKeywords(doc: Json): string[] {
  const found = new Set<string>();
  const walk = (v: unknown): void => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v !== null && typeof v === "object") {
      for (const [k, x] of Object.entries(v)) {
        if (k.startsWith("x-")) found.add(k);
        walk(x);
      }
    }
  };
  walk(doc);
  return [...found];
}

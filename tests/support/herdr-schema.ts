import { readFileSync } from "node:fs";
import path from "node:path";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";

/**
 * herdr's own schema file, pinned (fixtures/herdr/README.md), as validators: each of
 * its five top-level schemas (`request`, `success_response`, `error_response`,
 * `event`, `subscription_event`) validates one line of herdr's socket protocol.
 */
export type HerdrSchemaName = "request" | "success_response" | "error_response" | "event" | "subscription_event";

const SCHEMA_FILE = path.join(import.meta.dirname, "../../fixtures/herdr/herdr-api.schema.json");
const ID = "https://herdr.invalid/herdr-api.schema.json";

let validators: Map<HerdrSchemaName, ValidateFunction> | undefined;

function validatorOf(name: HerdrSchemaName): ValidateFunction {
  if (validators === undefined) {
    // Not strict: the file's root carries herdr's own keywords (protocol, schemas) and formats such as uint64.
    const ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false, validateFormats: false });
    ajv.addSchema({ ...JSON.parse(readFileSync(SCHEMA_FILE, "utf8")), $id: ID });
    validators = new Map();
    for (const n of ["request", "success_response", "error_response", "event", "subscription_event"] as const) {
      const v = ajv.getSchema(`${ID}#/schemas/${n}`);
      if (v === undefined) throw new Error(`herdr's schema has no schemas.${n}`);
      validators.set(n, v);
    }
  }
  return validators.get(name) as ValidateFunction;
}

/** The schema's complaints about `line` as a `name`, or [] when it conforms. */
export function herdrSchemaErrors(name: HerdrSchemaName, line: unknown): string[] {
  const validate = validatorOf(name);
  if (validate(line)) return [];
  return (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message ?? ""} (${e.schemaPath})`);
}

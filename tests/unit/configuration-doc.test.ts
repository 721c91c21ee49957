/**
 * docs/configuration.md held to the schema (`EnvSchema`, packages/core/src/config.ts):
 * every variable the schema reads is documented, nothing is documented that it lacks,
 * and a default the table shows as a value is the schema's own default (a variable
 * shown with none, `—`, has none). Where the table explains a default instead of
 * stating one (`(generated)`, `(embedded broker)`), the schema must have none, or the
 * row names the schema's value too.
 */
import { readFileSync } from "node:fs";
import { EnvSchema } from "@mam/core";
import { describe, expect, it } from "vitest";

const DOC = readFileSync(new URL("../../docs/configuration.md", import.meta.url), "utf8");

interface Row {
  readonly variables: string[];
  readonly shown: string;
}

/** The rows of the variable tables: a first cell of backticked names, the second the default shown. */
function documentedRows(): Row[] {
  const rows: Row[] = [];
  for (const line of DOC.split("\n")) {
    if (!line.startsWith("| `")) continue;
    const cells = line.split("|").map((c) => c.trim());
    const variables = [...(cells[1] ?? "").matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((m) => m[1] as string);
    if (variables.length === 0) continue;
    rows.push({ variables, shown: cells[2] ?? "" });
  }
  return rows;
}

/** The schema's default for `name`, as an environment variable would spell it (booleans as 0/1), or undefined. */
function schemaDefault(name: string): string | undefined {
  const schema = EnvSchema.shape[name as keyof typeof EnvSchema.shape];
  const parsed = schema.safeParse(undefined);
  if (!parsed.success || parsed.data === undefined) return undefined;
  const value = parsed.data as unknown;
  if (typeof value === "boolean") return value ? "1" : "0";
  return String(value);
}

describe("docs/configuration.md and the configuration schema", () => {
  const rows = documentedRows();
  const documented = rows.flatMap((r) => r.variables);

  it("documents every variable the schema reads, once, and none it does not", () => {
    const read = Object.keys(EnvSchema.shape).sort();
    expect([...documented].sort()).toEqual(read);
    expect(new Set(documented).size).toBe(documented.length);
  });

  it("shows each variable's default as the schema has it", () => {
    const wrong: string[] = [];
    for (const row of rows) {
      for (const name of row.variables) {
        const actual = schemaDefault(name);
        const stated = /^`([^`]*)`/.exec(row.shown)?.[1];
        if (stated !== undefined) {
          if (stated !== actual) wrong.push(`${name}: the table shows ${stated}, the schema's default is ${actual ?? "none"}`);
        } else if (row.shown === "—") {
          if (actual !== undefined) wrong.push(`${name}: the table shows no default, the schema's is ${actual}`);
        } else if (actual !== undefined && !row.shown.includes(actual)) {
          wrong.push(`${name}: the table explains its default (${row.shown}) without the schema's value ${actual}`);
        }
      }
    }
    expect(wrong).toEqual([]);
  });
});

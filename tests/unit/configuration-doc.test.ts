/**
 * A configuration variable is one entry (`setting` in packages/core/src/config.ts):
 * its schema, its default and its documentation. docs/configuration.md's table is
 * generated from those entries (scripts/configuration-doc.ts, `npm run docs:config`);
 * these tests fail when the committed page is not what the schema renders, and when
 * an entry's shown default contradicts the schema's own.
 */
import { readFileSync } from "node:fs";
import { EnvSchema, settingDoc } from "@mam/core";
import { describe, expect, it } from "vitest";
import { CONFIGURATION_DOC, renderConfigurationDoc, schemaDefault } from "../../scripts/configuration-doc.ts";

type Variable = keyof typeof EnvSchema.shape;
const VARIABLES = Object.keys(EnvSchema.shape) as Variable[];

describe("docs/configuration.md and the configuration schema", () => {
  it("is the page the schema renders (run npm run docs:config after editing an entry)", () => {
    const page = readFileSync(CONFIGURATION_DOC, "utf8");
    expect(renderConfigurationDoc(page)).toBe(page);
  });

  it("documents every variable the schema reads, once, and none it does not", () => {
    // The committed page's rows (not the renderer's, which lists the schema's keys by construction).
    const page = readFileSync(CONFIGURATION_DOC, "utf8");
    const rows = page
      .split("\n")
      .map((row) => /^\| `([A-Z0-9_]+)` +\|/.exec(row)?.[1])
      .filter((name) => name !== undefined);
    expect(rows).toEqual(VARIABLES);
    for (const name of VARIABLES) expect(settingDoc(name).meaning.length, name).toBeGreaterThan(10);
  });

  it("explains a default only alongside the schema's own value (or where the schema has none)", () => {
    const wrong: string[] = [];
    for (const name of VARIABLES) {
      const shown = settingDoc(name).shownDefault;
      const actual = schemaDefault(name);
      if (shown !== undefined && actual !== undefined && !shown.includes(`\`${actual}\``)) {
        wrong.push(`${name}: shown as ${shown}, the schema's default is ${actual}`);
      }
    }
    expect(wrong).toEqual([]);
  });
});

/**
 * @mam/client's types are generated from the document the app serves and checked
 * in; regenerating them from the app as it is now must give the same file, byte for
 * byte. A change to the API without `npm run generate:client` fails here.
 */
import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { CLIENT_SCHEMA_PATH, generateClientSchema } from "../../scripts/generate-client.ts";

describe("@mam/client schema", () => {
  it("packages/client/src/schema.ts is what npm run generate:client makes from the served /openapi.json", async () => {
    const checkedIn = await readFile(CLIENT_SCHEMA_PATH, "utf8");
    const regenerated = await generateClientSchema();
    // toBe on the whole text would print 2,000 lines on a failure: name the first line that differs.
    const a = checkedIn.split("\n");
    const b = regenerated.split("\n");
    const first = a.findIndex((line, i) => line !== b[i]);
    const where = first < 0 && a.length === b.length ? undefined : first < 0 ? Math.min(a.length, b.length) : first;
    expect(
      where === undefined ? "identical" : `line ${where + 1}: checked in ${JSON.stringify(a[where])}, served ${JSON.stringify(b[where])}`,
      "the API changed without regenerating its client: run npm run generate:client and commit packages/client/src/schema.ts",
    ).toBe("identical");
    expect(regenerated).toBe(checkedIn);
  });
});

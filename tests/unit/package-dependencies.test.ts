/**
 * Each workspace package declares what it depends on: every package its sources
 * import (`from "…"`, `import("…")`, `require("…")`) is in its package.json's
 * `dependencies`, in `peerDependencies` marked optional where it is loaded only on
 * demand (`mam migrate --table` loads the AWS SDK and `@mam/aws`), or in
 * `devDependencies` where it is only ever imported as a type; and nothing is declared
 * that its sources do not import. (The rules on what a
 * package may import at all are biome's: biome.json's overrides, docs/architecture.md.)
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const PACKAGES = path.join(import.meta.dirname, "..", "..", "packages");

function sourcesOf(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourcesOf(path.join(dir, e.name)) : /\.tsx?$/.test(e.name) ? [path.join(dir, e.name)] : [],
  );
}

/** `@scope/name/sub` -> `@scope/name`, `name/sub` -> `name`. */
const packageOf = (specifier: string): string =>
  specifier
    .split("/")
    .slice(0, specifier.startsWith("@") ? 2 : 1)
    .join("/");

/** What a package's sources import from outside it: by package, whether any import of it is more than a type. */
function importsOf(pkg: string): Map<string, { value: boolean }> {
  const found = new Map<string, { value: boolean }>();
  for (const file of sourcesOf(path.join(PACKAGES, pkg, "src"))) {
    const text = readFileSync(file, "utf8");
    const specifiers: [string, boolean][] = [];
    for (const m of text.matchAll(/^(import|export)\s+(type\s+)?[^;]*?\sfrom\s+"([^"]+)"/gms))
      specifiers.push([m[3] as string, m[2] === undefined]);
    for (const m of text.matchAll(/\b(?:import|require)\(\s*"([^"]+)"\s*\)/g)) specifiers.push([m[1] as string, true]);
    for (const [specifier, value] of specifiers) {
      if (specifier.startsWith(".") || specifier.startsWith("node:")) continue;
      const name = packageOf(specifier);
      const seen = found.get(name) ?? { value: false };
      found.set(name, { value: seen.value || value });
    }
  }
  return found;
}

const TYPES_OF: Readonly<Record<string, string>> = { "aws-lambda": "@types/aws-lambda" };

describe("each workspace package declares its dependencies", () => {
  for (const pkg of readdirSync(PACKAGES)) {
    it(`packages/${pkg}: what its sources import is what its package.json declares`, () => {
      const manifest = JSON.parse(readFileSync(path.join(PACKAGES, pkg, "package.json"), "utf8")) as {
        dependencies?: Record<string, string>;
        devDependencies?: Record<string, string>;
        peerDependencies?: Record<string, string>;
        peerDependenciesMeta?: Record<string, { optional?: boolean }>;
      };
      const peers = Object.keys(manifest.peerDependencies ?? {});
      expect(
        peers.filter((name) => manifest.peerDependenciesMeta?.[name]?.optional !== true),
        "peers not marked optional",
      ).toEqual([]);
      const declared = new Set([...Object.keys(manifest.dependencies ?? {}), ...peers]);
      const dev = new Set(Object.keys(manifest.devDependencies ?? {}));
      const imports = importsOf(pkg);
      const undeclared: string[] = [];
      const typesOnly = new Set<string>();
      for (const [name, { value }] of imports) {
        if (declared.has(name)) continue;
        const types = TYPES_OF[name] ?? `@types/${name}`;
        if (!value && (dev.has(name) || dev.has(types))) {
          typesOnly.add(dev.has(name) ? name : types);
          continue;
        }
        undeclared.push(`${name}${value ? "" : " (types)"}`);
      }
      expect(undeclared, "imported but not declared").toEqual([]);
      const unused = [...declared].filter((name) => !imports.has(name));
      // A dev dependency that is a package's types is used when the package is imported.
      const unusedDev = [...dev].filter(
        (name) => !typesOnly.has(name) && ![...imports.keys()].some((i) => `@types/${i}` === name || TYPES_OF[i] === name),
      );
      expect([...unused, ...unusedDev], "declared but not imported").toEqual([]);
    });
  }
});

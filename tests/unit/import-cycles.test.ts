/**
 * No module of a package (packages/*\/src) or of the Lambda root (functions/) imports
 * itself back through others, type-only imports included: a circle makes a module's
 * exports read while it is still loading, and says two modules are one.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { expect, it } from "vitest";

const ROOT = path.join(import.meta.dirname, "..", "..");

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(path.join(dir, e.name)) : /\.tsx?$/.test(e.name) ? [path.join(dir, e.name)] : [],
  );
}

/** Each module's relative imports and re-exports, resolved. */
function importGraph(): Map<string, string[]> {
  const files = [
    ...readdirSync(path.join(ROOT, "packages")).flatMap((p) => sources(path.join(ROOT, "packages", p, "src"))),
    ...sources(path.join(ROOT, "functions")),
  ];
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const text = readFileSync(file, "utf8");
    const targets = [...text.matchAll(/^(?:import|export)\s[^;]*?\sfrom\s+"(\.[^"]+)"/gms)]
      .map((m) => path.resolve(path.dirname(file), m[1] as string))
      .filter((target) => existsSync(target));
    graph.set(file, targets);
  }
  return graph;
}

/** Every circle found by a depth-first walk (one per back edge), as module paths. */
function circles(graph: Map<string, string[]>): string[] {
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const found: string[] = [];
  const visit = (node: string): void => {
    state.set(node, "open");
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (state.get(next) === "open")
        found.push([...stack.slice(stack.indexOf(next)), next].map((f) => path.relative(ROOT, f)).join(" -> "));
      else if (state.get(next) === undefined) visit(next);
    }
    stack.pop();
    state.set(node, "done");
  };
  for (const node of graph.keys()) if (state.get(node) === undefined) visit(node);
  return found;
}

it("no import circles in packages/*/src or functions/, type-only imports included", () => {
  const graph = importGraph();
  expect(graph.size).toBeGreaterThan(80);
  expect(circles(graph)).toEqual([]);
});

it("the walk finds a circle when there is one", () => {
  const a = path.join(ROOT, "a.ts");
  const b = path.join(ROOT, "b.ts");
  expect(
    circles(
      new Map([
        [a, [b]],
        [b, [a]],
      ]),
    ),
  ).toEqual(["a.ts -> b.ts -> a.ts"]);
});

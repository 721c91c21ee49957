/**
 * What a newcomer reads stays true to the repository: docs/behaviours.md lists every
 * behaviour tests/seed pins, each with a test that exists; every relative link in the
 * README, CONTRIBUTING.md and docs/*.md resolves to a file here (and a heading there,
 * for a `#fragment`); nothing points outside the repository.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const SEED_DIR = path.join(ROOT, "tests/seed");
const BEHAVIOURS = path.join(ROOT, "docs/behaviours.md");

const read = (file: string): string => readFileSync(file, "utf8");

/** Every test name in tests/seed that starts with a behaviour ID, by file (the rule of tests/seed/harness.test.ts). */
function seedTests(): Map<string, string[]> {
  const byFile = new Map<string, string[]>();
  for (const f of readdirSync(SEED_DIR).filter((f) => f.endsWith(".test.ts"))) {
    const names = [...read(path.join(SEED_DIR, f)).matchAll(/\bit(?:\.each\([\s\S]*?\))?\(\s*"(B-\d\d [^"]*)"/g)].map((m) => m[1] ?? "");
    byFile.set(f, names);
  }
  return byFile;
}

interface Row {
  readonly id: string;
  readonly link: string;
  readonly name: string;
}

/** `| B-xx | words | [file](../tests/seed/file) "test name" |` */
function behaviourRows(): Row[] {
  return read(BEHAVIOURS)
    .split("\n")
    .filter((line) => /^\|\s*B-\d\d\s*\|/.test(line))
    .map((line) => {
      const m = /^\|\s*(B-\d\d)\s*\|.*\|\s*\[[^\]]*\]\(([^)]+)\)\s*"([^"]+)"\s*\|$/.exec(line);
      if (m === null) throw new Error(`docs/behaviours.md: a row not of the form | B-xx | words | [file](path) "test name" |: ${line}`);
      return { id: m[1] ?? "", link: m[2] ?? "", name: m[3] ?? "" };
    });
}

const DOCS = [
  "README.md",
  "CONTRIBUTING.md",
  ...readdirSync(path.join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`),
];

/** The text outside fenced code blocks (a link in an example is not a link). */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```/gm, "");
}

/** GitHub's anchor of a heading: lowercased, punctuation dropped, spaces to hyphens. */
function anchorOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-");
}

function anchorsOf(file: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const m of prose(read(file)).matchAll(/^#{1,6} (.+)$/gm)) {
    const base = anchorOf(m[1] ?? "");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

describe("docs/behaviours.md", () => {
  const tests = seedTests();
  const rows = behaviourRows();

  it("lists every behaviour ID a test in tests/seed is named for, once", () => {
    const tested = [...new Set([...tests.values()].flat().map((name) => name.slice(0, 4)))].sort();
    const listed = rows.map((r) => r.id);
    expect(tested.filter((id) => !listed.includes(id))).toEqual([]);
    expect(listed.filter((id, i) => listed.indexOf(id) !== i)).toEqual([]);
  });

  it("names, for each row, a test file that exists and a test in it with that ID and that name", () => {
    const wrong: string[] = [];
    for (const row of rows) {
      const target = path.resolve(path.dirname(BEHAVIOURS), row.link);
      const names = tests.get(path.basename(target));
      if (path.dirname(target) !== SEED_DIR || names === undefined) {
        wrong.push(`${row.id}: ${row.link} is not a test file in tests/seed`);
      } else if (!row.name.startsWith(`${row.id} `)) {
        wrong.push(`${row.id}: the test name "${row.name}" does not start with ${row.id}`);
      } else if (!names.includes(row.name)) {
        wrong.push(`${row.id}: ${row.link} has no test named "${row.name}"`);
      }
    }
    expect(wrong).toEqual([]);
  });
});

describe("links in README.md, CONTRIBUTING.md and docs/*.md", () => {
  it("every relative link resolves to a file in the repository (and a #fragment to a heading in it)", () => {
    const broken: string[] = [];
    for (const doc of DOCS) {
      const file = path.join(ROOT, doc);
      for (const m of prose(read(file)).matchAll(/\]\(([^)\s]+)\)/g)) {
        const link = m[1] ?? "";
        if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue; // https:, mailto:: not a file
        const [target = "", fragment] = link.split("#");
        const resolved = target === "" ? file : path.resolve(path.dirname(file), decodeURIComponent(target));
        if (path.relative(ROOT, resolved).startsWith("..")) {
          broken.push(`${doc}: ${link} points outside the repository`);
        } else if (!existsSync(resolved)) {
          broken.push(`${doc}: ${link} does not exist`);
        } else if (fragment !== undefined && resolved.endsWith(".md") && !anchorsOf(resolved).has(fragment)) {
          broken.push(`${doc}: ${link} names no heading of ${path.relative(ROOT, resolved)}`);
        } else if (fragment !== undefined && statSync(resolved).isDirectory()) {
          broken.push(`${doc}: ${link} has a fragment on a directory`);
        }
      }
    }
    expect(broken).toEqual([]);
  });

  it("names nothing outside the repository: no ../shared, no seed spec, no DESIGN.md", () => {
    const outside: string[] = [];
    for (const doc of DOCS) {
      read(path.join(ROOT, doc))
        .split("\n")
        .forEach((line, i) => {
          if (/\.\.\/shared|SEED-BEHAVIOURS|DESIGN\.md/.test(line)) outside.push(`${doc}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(outside).toEqual([]);
  });
});

describe("package.json files", () => {
  it("the root and every workspace say what they are (description)", () => {
    const root = JSON.parse(read(path.join(ROOT, "package.json"))) as { workspaces: string[]; description?: string };
    const missing = [".", ...root.workspaces].filter((dir) => {
      const pkg = JSON.parse(read(path.join(ROOT, dir, "package.json"))) as { description?: unknown };
      return typeof pkg.description !== "string" || pkg.description.trim() === "";
    });
    expect(missing).toEqual([]);
  });
});

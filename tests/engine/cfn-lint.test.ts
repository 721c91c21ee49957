/**
 * AWS's CloudFormation linter on the packaged template (the aws-engine tier only:
 * `npm test` does not need cfn-lint). The template is the one `npm run package`
 * writes (tests/packaging/run-package.ts, as the packaging test runs it).
 *
 * - 0 errors.
 * - Every warning is listed, by rule id and resource, in docs/deploy.md's
 *   "## cfn-lint warnings" table with why it stays: a warning not explained there fails.
 *
 * cfn-lint is part of the machine image (no registry here serves it): when it is
 * missing this test fails naming it, never skips.
 */
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPackage } from "../packaging/package.ts";
import { tempDirSync } from "../support/temp-dir.ts";

const ROOT = join(import.meta.dirname, "..", "..");
const DEPLOY_DOC = join(ROOT, "docs", "deploy.md");
const SECTION = "## cfn-lint warnings";

/** One finding of `cfn-lint --format json`, the fields read here. */
interface Finding {
  readonly Level: "Error" | "Warning" | "Informational";
  readonly Message: string;
  readonly Rule: { readonly Id: string };
  readonly Location: { readonly Path: readonly (string | number)[] };
}

/** The resource a finding is about: its logical id, or the template path (`Outputs/X`) outside Resources. */
function subject(f: Finding): string {
  const [top, name] = f.Location.Path;
  if (top === "Resources" && name !== undefined) return String(name);
  return f.Location.Path.slice(0, 2).join("/");
}

/** `cfn-lint --version`, or an error naming the prerequisite. */
function cfnLintVersion(): string {
  const run = spawnSync("cfn-lint", ["--version"], { encoding: "utf8" });
  if (run.error !== undefined || run.status !== 0) {
    throw new Error(
      `the aws-engine tier needs AWS's CloudFormation linter, cfn-lint (1.51 is part of the machine image), on PATH: ${run.error?.message ?? run.stderr}`,
    );
  }
  return run.stdout.trim();
}

/** The (rule, resource) pairs docs/deploy.md's "## cfn-lint warnings" table explains: `| W3005 | HttpLambdaFunction | why |`. */
function explainedWarnings(): Map<string, string> {
  const doc = readFileSync(DEPLOY_DOC, "utf8");
  const start = doc.indexOf(`\n${SECTION}\n`);
  if (start < 0) throw new Error(`docs/deploy.md has no "${SECTION}" section`);
  const rest = doc.slice(start + SECTION.length + 2);
  const end = rest.search(/^## /m);
  const section = end < 0 ? rest : rest.slice(0, end);
  const explained = new Map<string, string>();
  for (const line of section.split("\n")) {
    const cells = line.split("|").map((c) => c.trim().replace(/^`|`$/g, ""));
    // | rule | resource | explanation |  -> ["", rule, resource, explanation, ""]
    if (cells.length < 5 || !/^[EWI]\d{4}$/.test(cells[1] ?? "")) continue;
    const why = cells[3] ?? "";
    if (why === "") throw new Error(`docs/deploy.md lists ${cells[1]} on ${cells[2]} without saying why`);
    explained.set(`${cells[1]} ${cells[2]}`, why);
  }
  return explained;
}

let outDir: string | undefined;
let version: string;
let findings: Finding[];

beforeAll(() => {
  version = cfnLintVersion();
  outDir = tempDirSync("cfn-lint").dir;
  const { templateFile } = runPackage(outDir, []);
  const run = spawnSync("cfn-lint", ["--format", "json", "--", templateFile], { encoding: "utf8", timeout: 240_000 });
  // Exit status: a bit per level found (2 errors, 4 warnings, 8 informational); 1 is a failure of cfn-lint itself.
  if (run.error !== undefined || run.status === null || run.status === 1) {
    throw new Error(`cfn-lint did not run (${run.error?.message ?? `status ${run.status}`}):\n${run.stderr}`);
  }
  findings = JSON.parse(run.stdout) as Finding[];
  const count = (level: Finding["Level"]): number => findings.filter((f) => f.Level === level).length;
  console.log(`[cfn-lint] ${version} on the packaged template: ${count("Error")} errors, ${count("Warning")} warnings`);
}, 300_000);

afterAll(() => {
  if (outDir !== undefined) rmSync(outDir, { recursive: true, force: true });
});

describe("cfn-lint on the packaged CloudFormation template", () => {
  it("reports no error", () => {
    const errors = findings.filter((f) => f.Level === "Error").map((f) => `${f.Rule.Id} ${subject(f)}: ${f.Message}`);
    expect(errors).toEqual([]);
  });

  it("reports no warning that docs/deploy.md's '## cfn-lint warnings' does not list (rule id and resource) and explain", () => {
    const explained = explainedWarnings();
    const warnings = findings.filter((f) => f.Level === "Warning");
    const unexplained = warnings
      .filter((f) => !explained.has(`${f.Rule.Id} ${subject(f)}`))
      .map((f) => `${f.Rule.Id} ${subject(f)}: ${f.Message}`);
    expect(unexplained, "add each to docs/deploy.md's table with why it stays, or fix it").toEqual([]);
    // Listed but no longer reported: said, not failed (the warning is gone; the row can go).
    const seen = new Set(warnings.map((f) => `${f.Rule.Id} ${subject(f)}`));
    const stale = [...explained.keys()].filter((k) => !seen.has(k));
    if (stale.length > 0) console.log(`[cfn-lint] listed in docs/deploy.md, no longer reported: ${stale.join(", ")}`);
  });
});

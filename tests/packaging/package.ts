/**
 * `npm run package` (scripts/package.mjs) into a directory of the caller's, offline
 * and without credentials, and the CloudFormation template it wrote. Shared by the
 * packaging tests, the metrics test (which checks the template's dashboard and
 * alarms against what the functions emit) and tests/engine/cfn-lint.test.ts (which
 * lints the template file). Packaging rebuilds `.build/` as `npm run package` does.
 */
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = join(import.meta.dirname, "..", "..");

export interface Resource {
  readonly Type: string;
  readonly Properties: Record<string, unknown>;
  readonly DependsOn?: readonly string[];
  readonly Condition?: string;
}
export interface Template {
  readonly Parameters?: Record<string, { readonly Type: string; readonly Default?: unknown }>;
  readonly Conditions?: Record<string, unknown>;
  readonly Resources: Record<string, Resource>;
}

/** The template osls writes into the package directory. */
export const TEMPLATE_FILE = "cloudformation-template-update-stack.json";

/** Run the packaging script; the template it wrote (parsed, and its path) and what it printed. */
export function runPackage(outDir: string, args: readonly string[]): { template: Template; templateFile: string; output: string } {
  const run = spawnSync(process.execPath, [join(ROOT, "scripts", "package.mjs"), "--package", outDir, ...args], {
    cwd: ROOT,
    encoding: "utf8",
    // Offline and without credentials: nothing from the caller's AWS setup leaks in.
    env: { PATH: process.env.PATH ?? "", HOME: outDir, NO_COLOR: "1", AWS_SDK_LOAD_CONFIG: "0" },
    timeout: 240_000,
  });
  const output = `${run.stdout}\n${run.stderr}`;
  if (run.status !== 0) throw new Error(`npm run package failed (${run.status ?? run.signal}):\n${output}`);
  const templateFile = join(outDir, TEMPLATE_FILE);
  const template = JSON.parse(readFileSync(templateFile, "utf8")) as Template;
  return { template, templateFile, output };
}

/**
 * `npm run package` into a directory of the caller's, offline and without
 * credentials: what tests/packaging/template.test.ts checks and what
 * tests/engine/cfn-lint.test.ts lints. Packaging rebuilds `.build/` (as `npm run
 * package` does) and writes the zips and the CloudFormation template to `outDir`.
 */
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = join(import.meta.dirname, "..", "..");

/** The template osls writes into the package directory. */
export const TEMPLATE_FILE = "cloudformation-template-update-stack.json";

/** Run the packaging script; the template it wrote (parsed, and its path) and what it printed. */
export function runPackage<T = unknown>(outDir: string, args: readonly string[]): { template: T; templateFile: string; output: string } {
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
  const template = JSON.parse(readFileSync(templateFile, "utf8")) as T;
  return { template, templateFile, output };
}

/**
 * `npm run package` (scripts/package.mjs) into a directory of the caller's, offline
 * and without credentials, and the CloudFormation template it wrote. Shared by the
 * packaging tests, the metrics test (which checks the template's dashboard and
 * alarms against what the functions emit) and tests/engine/cfn-lint.test.ts (which
 * lints the template file). Packaging rebuilds `.build/` as `npm run package` does.
 */
import { spawn, spawnSync } from "node:child_process";
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

/**
 * Packaging rebuilds the one `.build/` of the checkout, so two test files packaging
 * at once (vitest runs two workers) would build over each other, or over the bundles
 * another file is reading: each run holds an exclusive lock on a file beside it for
 * its whole length (util-linux `flock`, which waits for the holder to let go), and a
 * file that reads `.build/` after packaging holds it from its first packaging to its
 * end (`holdPackagingLock`).
 */
const PACKAGE_LOCK = join(ROOT, "node_modules", ".mam-package.lock");
let heldHere = false;

/**
 * Take the packaging lock until the returned release is called: a child `flock` that
 * says it holds the lock, then holds it while its stdin stays open.
 */
export async function holdPackagingLock(): Promise<() => Promise<void>> {
  const holder = spawn("flock", [PACKAGE_LOCK, "-c", "echo held; exec cat"], { stdio: ["pipe", "pipe", "inherit"] });
  await new Promise<void>((resolve, reject) => {
    holder.once("error", reject);
    holder.once("exit", (code) => reject(new Error(`flock exited (${code}) before it held the packaging lock`)));
    holder.stdout.once("data", () => resolve());
  });
  holder.removeAllListeners("exit");
  heldHere = true;
  return async () => {
    heldHere = false;
    const exited = new Promise((resolve) => holder.once("exit", resolve));
    holder.stdin.end();
    await exited;
  };
}

/** Run the packaging script; the template it wrote (parsed, and its path) and what it printed. */
export function runPackage(outDir: string, args: readonly string[]): { template: Template; templateFile: string; output: string } {
  const script = [process.execPath, join(ROOT, "scripts", "package.mjs"), "--package", outDir, ...args];
  const [command, ...rest] = heldHere ? script : ["flock", PACKAGE_LOCK, ...script];
  const run = spawnSync(command as string, rest, {
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

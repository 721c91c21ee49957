#!/usr/bin/env node
/**
 * `npm run package [-- <osls package options>]`: bundle each Lambda entry point with
 * esbuild into `.build/<function>/`, then let osls package serverless.yml into
 * `.serverless/` (or `--package <dir>`): one zip per function holding only its
 * bundle, and the CloudFormation template. Offline and without credentials: osls's
 * `package` calls no AWS API, and nothing here asks for an account.
 *
 * Bundles: scripts/lambda-bundle.mjs (the AWS SDK is bundled, not taken from the
 * runtime: the adapters rely on recent client features such as the S3 checksum
 * settings and ReturnValuesOnConditionCheckFailure).
 *
 * Extra arguments go to osls, e.g. `npm run package -- --stage prod --param iotEndpoint=...`.
 */
import { spawnSync } from "node:child_process";
import { cpSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { buildDashboard, DASHBOARD_FILES } from "../packages/dashboard/build.mjs";
import { LAMBDA_ENTRIES, lambdaBuildOptions } from "./lambda-bundle.mjs";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(root, "package.json"));
const outRoot = join(root, ".build");

/**
 * The docs page's assets (packages/api DOCS_ASSETS), served by the http function
 * from `swagger-ui-dist` found next to its bundle: no CDN is reachable from a closed
 * network. tests/packaging checks this list against DOCS_ASSETS.
 */
const DOCS_ASSET_FILES = [
  "swagger-ui.css",
  "index.css",
  "swagger-ui-bundle.js",
  "swagger-ui-standalone-preset.js",
  "favicon-32x32.png",
  "favicon-16x16.png",
];

async function bundle() {
  rmSync(outRoot, { recursive: true, force: true });
  const sizes = {};
  for (const [name, entry] of Object.entries(LAMBDA_ENTRIES)) {
    const outdir = join(outRoot, name);
    const result = await build(lambdaBuildOptions(root, name, entry, outdir));
    writeFileSync(join(outRoot, `${name}.meta.json`), JSON.stringify(result.metafile));
    sizes[name] = Object.entries(result.metafile.outputs)
      .filter(([file]) => file.endsWith(".mjs"))
      .reduce((n, [, o]) => n + o.bytes, 0);
  }
  copyDocsAssets(join(outRoot, "http", "node_modules", "swagger-ui-dist"));
  await copyDashboard(join(outRoot, "http", "node_modules", "@mam", "dashboard"));
  return sizes;
}

/**
 * The dashboard's files (@mam/api DASHBOARD_FILES), built from the source now and
 * placed where the http function finds them at its first request for the page
 * (`@mam/dashboard/package.json`, then `dist/`): files beside the bundle, never in
 * it, so a cold start parses none of them (bench/bundles counts them apart).
 */
async function copyDashboard(target) {
  const { outdir, sizes } = await buildDashboard();
  mkdirSync(join(target, "dist"), { recursive: true });
  cpSync(join(root, "packages", "dashboard", "package.json"), join(target, "package.json"));
  for (const file of DASHBOARD_FILES) cpSync(join(outdir, file), join(target, "dist", file));
  const total = Object.values(sizes).reduce((a, b) => a + b, 0);
  console.log(`dashboard: ${DASHBOARD_FILES.join(", ")} beside the http bundle (${(total / 1024).toFixed(1)} KiB, not in it)`);
}

function copyDocsAssets(target) {
  const source = dirname(require.resolve("swagger-ui-dist/package.json"));
  mkdirSync(target, { recursive: true });
  for (const file of ["package.json", ...DOCS_ASSET_FILES]) cpSync(join(source, file), join(target, file));
}

function packageWithOsls(args) {
  const cli = join(dirname(require.resolve("osls/package.json")), "bin", "serverless.js");
  const env = {
    ...process.env,
    // No telemetry, update checks, prompts or deprecation noise; nothing to reach.
    SLS_TELEMETRY_DISABLED: "1",
    SLS_TRACKING_DISABLED: "1",
    SLS_NOTIFICATIONS_MODE: "off",
    SLS_DEPRECATION_DISABLE: "*",
    SLS_INTERACTIVE_SETUP_DISABLE: "1",
    CI: process.env.CI ?? "1",
  };
  const run = spawnSync(process.execPath, [cli, "package", ...args], { cwd: root, env, stdio: "inherit" });
  if (run.error) throw run.error;
  return run.status ?? 1;
}

/** The `--param name=value` (or `--param=name=value`) values and the stage (`--stage`, `-s`; serverless.yml: dev), as osls reads them. */
function deployArgs(args) {
  const params = new Map();
  let stage = "dev";
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? "";
    const flagValue = (flag) => (arg === flag ? args[i + 1] : arg.startsWith(`${flag}=`) ? arg.slice(flag.length + 1) : undefined);
    const param = flagValue("--param");
    const match = /^([^=]+)=(.*)$/s.exec(param ?? "");
    if (match) params.set(match[1], match[2]);
    const named = flagValue("--stage") ?? flagValue("-s");
    if (named !== undefined) stage = named;
  }
  return { params, stage };
}

const refuse = (line) => {
  process.stderr.write(`package: ${line}\n`);
  process.exit(1);
};

/**
 * Parameters whose absence or form would make a stack that deploys but does not work.
 * - The SSM parameter's ARN is `...:parameter` + its name: only a hierarchical name ("/a/b") makes a valid one.
 * - Without iotEndpoint the functions get serverless.yml's placeholder and every publish
 *   fails: said loudly on the dev stage, refused on any other.
 */
function checkParams(args) {
  const { params, stage } = deployArgs(args);
  const signingKeyParameter = params.get("signingKeyParameter");
  if (signingKeyParameter !== undefined && !signingKeyParameter.startsWith("/")) {
    refuse(`signingKeyParameter must be a hierarchical SSM name starting with "/", got ${JSON.stringify(signingKeyParameter)}`);
  }
  if ((params.get("iotEndpoint") ?? "") === "") {
    const placeholder = "without it the functions get serverless.yml's placeholder endpoint, and every publish to IoT Core fails";
    const how =
      "pass --param iotEndpoint=https://<id>-ats.iot.<region>.amazonaws.com (aws iot describe-endpoint --endpoint-type iot:Data-ATS; docs/deploy.md)";
    if (stage !== "dev") refuse(`refused: stage ${JSON.stringify(stage)} needs the iotEndpoint parameter (${placeholder}); ${how}`);
    process.stderr.write(
      `package: WARNING: no iotEndpoint parameter: every publish of this dev stack will fail (${placeholder}); ${how}\n`,
    );
  }
}

checkParams(process.argv.slice(2));
const sizes = await bundle();
for (const [name, bytes] of Object.entries(sizes)) {
  process.stderr.write(`bundled ${name}: ${(bytes / 1024).toFixed(0)} KiB\n`);
}
process.exitCode = packageWithOsls(process.argv.slice(2));

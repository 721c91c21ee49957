#!/usr/bin/env node
/**
 * `npm run package:agent [-- --out DIR]`: the `mam` command for an agent's machine,
 * as one npm tarball with nothing to fetch: `dist/agent/mam-agent-<version>.tgz`
 * (or in DIR). Install it with `npm install -g ./mam-agent-<version>.tgz` (it has no
 * dependencies, so that works offline), on Node >= 20.19. docs/agents.md, "Installing
 * `mam` where the agent runs".
 *
 * The agent install is API mode only (`--api URL`/MAM_API_URL with a token): the
 * CLI's sources bundled by esbuild (ESM, node20, minified, code splitting on, so a
 * dynamic import stays a chunk loaded on first use), with the service's modules left
 * out. Where the CLI imports the data-dir mode, `mam serve`, `mam migrate --table`'s
 * AWS SDK or @mam/local (SQLite through the native better-sqlite3, aedes, level) —
 * every such import is dynamic (packages/cli/src/data-dir-mode.ts) — the bundle
 * holds one small module that refuses instead: the import rejects with a MamError
 * (`input.invalid`, exit 1) naming the agent install, and the command prints it as
 * it prints any refusal. The build fails if any of those is imported statically (it
 * would refuse every command) or if anything of theirs is bundled anyway.
 */
import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { ESM_REQUIRE_BANNER, zodEnglishOnly } from "./lambda-bundle.mjs";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** What the agent's `mam` says, and exits 1 with, when asked for anything but API mode. */
export const AGENT_INSTALL_REFUSAL =
  "this mam is the agent install: API mode only (--api URL or MAM_API_URL, with --token or MAM_TOKEN); " +
  "run --data-dir, serve and migrate on the service's machine";

/**
 * The service's modules, as the CLI's sources name them: each resolves, in the agent
 * bundle, to the refusing module. `importer` is the directory the import is written in.
 */
const SERVICE_ONLY = [
  { filter: /^@mam\/local$/ },
  { filter: /^@mam\/aws(\/.*)?$/ },
  { filter: /^@aws-sdk\// },
  { filter: /^\.\/(embedded-backend|embedded-service|serve)\.ts$/, importer: join(ROOT, "packages", "cli", "src") },
];

/** Inputs that must not be in the bundle at all: the service's code and native modules. */
const NOT_BUNDLED =
  /(^|\/)packages\/(aws|local)\/src\/(?!data-dir-paths\.ts$)|node_modules\/(better-sqlite3|classic-level|level|aedes[^/]*|mqtt|@aws-sdk|@smithy|@hono\/node-server)\//;

const REFUSED = "refused";
const ENTRY = "packages/cli/src/main.ts";

const serviceOnly = {
  name: "agent-install-service-only",
  setup(b) {
    for (const { filter, importer } of SERVICE_ONLY) {
      b.onResolve({ filter }, (args) =>
        importer === undefined || args.resolveDir === importer ? { path: REFUSED, namespace: "agent-install" } : undefined,
      );
    }
    b.onLoad({ filter: /.*/, namespace: "agent-install" }, () => ({
      contents: `import { MamError } from "@mam/core";\nthrow new MamError("input.invalid", ${JSON.stringify(AGENT_INSTALL_REFUSAL)});\n`,
      resolveDir: join(ROOT, "packages", "cli", "src"),
      loader: "js",
    }));
  },
};

/** Refuse a bundle that would refuse every command, or that carries the service's code. */
function checkBundle(metafile) {
  const problems = [];
  for (const [input, { imports }] of Object.entries(metafile.inputs)) {
    if (NOT_BUNDLED.test(input)) problems.push(`${input} is bundled: the agent install carries none of the service's modules`);
    for (const i of imports) {
      if (i.path === `agent-install:${REFUSED}` && i.kind !== "dynamic-import")
        problems.push(`${input} imports a service module statically (${i.original ?? i.path}): every command would be refused`);
    }
  }
  if (problems.length > 0) throw new Error(`the agent bundle is wrong:\n  ${problems.join("\n  ")}`);
}

/** The license text of every package the bundle carries code of: the tarball redistributes them. */
function thirdPartyLicenses(metafile) {
  // A package's directory: the input's path up to its last node_modules/<name>/.
  const dirs = new Set();
  for (const input of Object.keys(metafile.inputs)) {
    // A plugin's input is `<namespace>:<absolute path>`.
    const m = /^(?:[\w-]+:)?(.*node_modules\/(?:@[^/]+\/)?[^/@][^/]*)\//.exec(input);
    if (m) dirs.add(resolve(ROOT, m[1]));
  }
  const sections = [...dirs].sort().map((dir) => {
    const { version, license } = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    const file = readdirSync(dir).find((f) => /^(licen[cs]e|copying)(\.|$)/i.test(f));
    const text = file === undefined ? `(no license file; package.json says ${license})` : readFileSync(join(dir, file), "utf8").trim();
    return `## ${dir.slice(dir.lastIndexOf("node_modules/") + "node_modules/".length)} ${version} (${license})\n\n${text}\n`;
  });
  return `# Third-party code in this bundle\n\n${sections.join("\n")}`;
}

const run = (command, args, cwd) => {
  const r = spawnSync(command, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`${command} ${args.join(" ")} exited ${r.status}`);
  return r.stdout;
};

/**
 * Build the agent package into `outDir` (its staging directory `package/` and the
 * tarball beside it); returns where the tarball is and what a start loads.
 */
export async function packAgent({ outDir = join(ROOT, "dist", "agent") } = {}) {
  const { version } = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const stage = join(outDir, "package");
  rmSync(outDir, { recursive: true, force: true });
  mkdirSync(join(stage, "bin"), { recursive: true });
  const { metafile } = await build({
    absWorkingDir: ROOT,
    entryPoints: { main: ENTRY },
    outdir: join(stage, "lib"),
    outExtension: { ".js": ".mjs" },
    bundle: true,
    splitting: true,
    chunkNames: "chunks/[name]-[hash]",
    platform: "node",
    target: "node20",
    format: "esm",
    mainFields: ["module", "main"],
    minify: true,
    legalComments: "none",
    banner: { js: ESM_REQUIRE_BANNER },
    metafile: true,
    logLevel: "warning",
    plugins: [zodEnglishOnly, serviceOnly],
  });
  checkBundle(metafile);
  writeFileSync(join(stage, "THIRD-PARTY-LICENSES.md"), thirdPartyLicenses(metafile));
  writeFileSync(join(stage, "bin", "mam.js"), '#!/usr/bin/env node\nimport "../lib/main.mjs";\n');
  chmodSync(join(stage, "bin", "mam.js"), 0o755);
  const manifest = {
    name: "mam-agent",
    version,
    description: "The mam command for an agent's machine: API mode only (--api URL, MAM_API_URL). Built by npm run package:agent.",
    type: "module",
    bin: { mam: "bin/mam.js" },
    engines: { node: ">=20.19" },
  };
  writeFileSync(join(stage, "package.json"), `${JSON.stringify(manifest, null, 2)}\n`);
  writeFileSync(
    join(stage, "README.md"),
    `# mam-agent ${version}\n\nThe \`mam\` command where an agent runs: API mode only (\`--api URL\` or \`MAM_API_URL\`, with\n\`--token\` or \`MAM_TOKEN\`). No dependencies; Node >= 20.19. \`mam --help\` lists the commands.\nBuilt from the mam repository by \`npm run package:agent\`; see its docs/agents.md.\n`,
  );
  const [packed] = JSON.parse(run("npm", ["pack", "--json", "--offline", "--pack-destination", outDir], stage));
  // What every command loads: the entry and the chunks it imports statically; the rest loads on first use.
  const outputs = metafile.outputs;
  const loaded = new Set();
  const queue = Object.keys(outputs).filter((file) => outputs[file].entryPoint === ENTRY);
  for (let file = queue.pop(); file !== undefined; file = queue.pop()) {
    if (loaded.has(file)) continue;
    loaded.add(file);
    for (const i of outputs[file]?.imports ?? []) if (i.kind === "import-statement" && !i.external) queue.push(i.path);
  }
  const bytesOf = (files) => files.reduce((n, file) => n + (outputs[file]?.bytes ?? 0), 0);
  return {
    tarball: join(outDir, packed.filename),
    tarballBytes: packed.size,
    files: packed.files.map((f) => f.path),
    loadedBytes: bytesOf([...loaded]),
    lazyBytes: bytesOf(Object.keys(outputs).filter((file) => !loaded.has(file))),
  };
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf("--out");
  const outDir = at > 0 ? resolve(process.argv[at + 1] ?? "") : undefined;
  const packed = await packAgent(outDir === undefined ? {} : { outDir });
  const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
  console.log(`agent package: ${packed.tarball} (${kib(packed.tarballBytes)})`);
  console.log(
    `  a command loads ${kib(packed.loadedBytes)} (lib/main.mjs and its static chunks); ${kib(packed.lazyBytes)} more on first use; no dependencies`,
  );
  console.log("  install: npm install -g ./" + packed.tarball.split("/").pop() + "   (offline; Node >= 20.19)");
}

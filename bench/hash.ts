import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { open } from "node:fs/promises";
import { finalizeReport, REPORT_NAME, STAGED_REPORT_NAME, systemClock, verifyManifest } from "@mam/core";
import { FileReportStore } from "@mam/local";
import {
  collectGarbage,
  fixed,
  MiB,
  machineNote,
  measureRss,
  median,
  type RssGrowth,
  sizeFromEnv,
  tempDir,
  verdict,
} from "./support/measure.ts";

/**
 * Verifying a finalized report re-hashes the stored bytes every time (the manifest
 * never certifies itself), so verification is as fast as streaming SHA-256 through
 * the ReportStore. This measures mam's `verifyManifest` over a FileReportStore
 * against `openssl dgst -sha256` on the same file, both reading from the page cache.
 *
 * Goals: throughput >= 0.6x the baseline; RSS growth during verification <= 64 MiB
 * (the port promises `hash` never holds a whole object in memory).
 */

const SIZE = sizeFromEnv("MAM_BENCH_HASH_BYTES", process.env.MAM_BENCH_HASH_BYTES, 1024 * MiB);
const RUNS = 3;
const RATIO_GOAL = 0.6;
const RSS_GOAL = 64 * MiB;
const JOB_ID = "bench-hash";
const ATTEMPT_ID = 1;
const LOCATION = `reports/${JOB_ID}/${ATTEMPT_ID}`;
const WRITE_CHUNK = MiB;
const FALLBACK_CHUNK = 64 * MiB;

interface Timed {
  readonly seconds: number;
  readonly sha256: string;
}

/**
 * Deterministic report text: one MiB of pseudo-random lowercase words (xorshift32,
 * fixed seed), repeated, each copy stamped with its index so no two MiB are equal.
 */
async function* reportBody(size: number): AsyncGenerator<Uint8Array> {
  const block = Buffer.allocUnsafe(WRITE_CHUNK);
  let x = 0x9e3779b9;
  for (let i = 0; i < block.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const r = (x >>> 0) % 32;
    block[i] = r < 26 ? 0x61 + r : r < 31 ? 0x20 : 0x0a;
  }
  for (let offset = 0, index = 0; offset < size; offset += WRITE_CHUNK, index++) {
    const chunk = Buffer.from(block.subarray(0, Math.min(WRITE_CHUNK, size - offset)));
    chunk.write(`\n## chunk ${index}\n`.slice(0, chunk.length), "latin1");
    yield chunk;
  }
}

/** Read the whole file once and drop it, so every timed run reads from the page cache. */
async function warmPageCache(file: string): Promise<number> {
  const started = performance.now();
  const handle = await open(file, "r");
  try {
    const buffer = Buffer.allocUnsafe(8 * MiB);
    while ((await handle.read(buffer, 0, buffer.length, null)).bytesRead > 0) {
      // discard
    }
  } finally {
    await handle.close();
  }
  return (performance.now() - started) / 1000;
}

function opensslAvailable(): boolean {
  const probe = spawnSync("openssl", ["version"], { encoding: "utf8" });
  return probe.error === undefined && probe.status === 0;
}

/** Wall time of `openssl dgst -sha256 <file>`, spawn to exit. */
function opensslDigest(file: string): Promise<Timed> {
  const started = performance.now();
  const child = spawn("openssl", ["dgst", "-sha256", file], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (s: string) => {
    out += s;
  });
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => {
      const seconds = (performance.now() - started) / 1000;
      const sha256 = /([0-9a-f]{64})\s*$/.exec(out)?.[1];
      if (code !== 0 || sha256 === undefined) reject(new Error(`openssl dgst exited ${code}: ${out.trim()}`));
      else resolve({ seconds, sha256 });
    });
  });
}

/**
 * The fallback baseline: Node's own SHA-256 over one 64 MiB buffer, read in a plain
 * loop. The buffer is allocated (and touched) once, before any timing, so the
 * baseline pays for hashing and reading, not for faulting in fresh memory.
 */
function nodeDigestInto(buffer: Buffer): (file: string) => Promise<Timed> {
  return async (file) => {
    const started = performance.now();
    const handle = await open(file, "r");
    try {
      const hash = createHash("sha256");
      for (;;) {
        const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
        if (bytesRead === 0) break;
        hash.update(buffer.subarray(0, bytesRead));
      }
      return { seconds: (performance.now() - started) / 1000, sha256: hash.digest("hex") };
    } finally {
      await handle.close();
    }
  };
}

async function mamVerify(store: FileReportStore): Promise<Timed & { rss: RssGrowth }> {
  collectGarbage();
  const started = performance.now();
  const { result, rss } = await measureRss(() => verifyManifest(store, { location: LOCATION, jobId: JOB_ID, attemptId: ATTEMPT_ID }));
  const seconds = (performance.now() - started) / 1000;
  if (!result.ok) throw new Error(`verifyManifest refused the report: ${result.reason}`);
  return { seconds, sha256: result.manifest.sha256, rss };
}

const mibs = (seconds: number) => SIZE / MiB / seconds;

console.log(machineNote());
const tmp = await tempDir("mam-bench-hash-");
try {
  const store = new FileReportStore(tmp.dir);
  // The store describes its objects by mam-file:/// URIs; openssl and the page-cache
  // warm-up read the file itself.
  const file = store.pathOf(LOCATION, REPORT_NAME);
  console.log(`report: ${fixed(SIZE / MiB)} MiB at ${file} (${store.describe(LOCATION, REPORT_NAME)})`);

  let started = performance.now();
  await store.put(LOCATION, STAGED_REPORT_NAME, reportBody(SIZE));
  console.log(
    `staged ${STAGED_REPORT_NAME} (streamed in ${WRITE_CHUNK / MiB} MiB chunks, fsynced) in ${fixed((performance.now() - started) / 1000, 2)} s`,
  );
  started = performance.now();
  const { manifest } = await finalizeReport(store, systemClock, {
    location: LOCATION,
    jobId: JOB_ID,
    attemptId: ATTEMPT_ID,
    sideEffects: [],
  });
  console.log(`finalized (promote + hash + manifest) in ${fixed((performance.now() - started) / 1000, 2)} s; sha256 ${manifest.sha256}`);

  const warm = await warmPageCache(file);
  console.log(`page cache warmed: read once in ${fixed(warm, 2)} s (${fixed(mibs(warm))} MiB/s, read only)`);

  const useOpenssl = opensslAvailable();
  const baselineName = useOpenssl ? "openssl" : "node-crypto";
  if (useOpenssl) console.log("baseline: openssl dgst -sha256 <file> (spawned; wall time includes process start)");
  else console.log("baseline: openssl is not on PATH; falling back to Node's crypto SHA-256 over a 64 MiB-chunked read loop");
  const baseline = useOpenssl ? opensslDigest : nodeDigestInto(Buffer.alloc(FALLBACK_CHUNK));

  // Alternate the sides so drift (thermal, other load) does not favour one of them.
  const base: Timed[] = [];
  const mam: (Timed & { rss: RssGrowth })[] = [];
  for (let run = 1; run <= RUNS; run++) {
    const b = await baseline(file);
    const m = await mamVerify(store);
    for (const [who, t] of [
      [baselineName, b],
      ["mam", m],
    ] as const) {
      if (t.sha256 !== manifest.sha256) throw new Error(`${who} computed ${t.sha256}, the manifest says ${manifest.sha256}`);
    }
    base.push(b);
    mam.push(m);
    console.log(
      `run ${run}: ${baselineName} ${fixed(b.seconds, 3)} s (${fixed(mibs(b.seconds))} MiB/s); ` +
        `mam verifyManifest ${fixed(m.seconds, 3)} s (${fixed(mibs(m.seconds))} MiB/s), rss +${fixed(m.rss.growth / MiB)} MiB, ` +
        `${m.rss.minorPageFaults} minor page faults`,
    );
  }

  const baseRate = mibs(median(base.map((t) => t.seconds)));
  const mamRate = mibs(median(mam.map((t) => t.seconds)));
  const ratio = mamRate / baseRate;
  const worst = mam.reduce((a, b) => (b.rss.growth > a.rss.growth ? b : a)).rss;
  console.log(
    `median of ${RUNS}: ${baselineName} ${fixed(baseRate)} MiB/s; mam ${fixed(mamRate)} MiB/s; every digest agrees with the manifest`,
  );
  console.log(
    `rss during verification (worst run): ${fixed(worst.before / MiB)} -> peak ${fixed(worst.peak / MiB)} MiB sampled every 5 ms; ` +
      `process maxRSS ${fixed(worst.maxRssBefore / MiB)} -> ${fixed(worst.maxRssAfter / MiB)} MiB`,
  );
  console.log(machineNote().replace(/^machine: .*; load/, "at the end: load"));
  console.log(
    `hash: ratio ${ratio.toFixed(2)}x ${baselineName} (goal >= ${RATIO_GOAL}x) ${verdict(ratio >= RATIO_GOAL)}; ` +
      `rss +${fixed(worst.growth / MiB)} MiB (goal <= ${RSS_GOAL / MiB} MiB) ${verdict(worst.growth <= RSS_GOAL)}`,
  );
} finally {
  await tmp.dispose();
}

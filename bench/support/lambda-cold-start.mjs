/**
 * One Lambda cold start, as the Node runtime does it: load the bundle (ESM, every
 * module it holds is evaluated here), then invoke its `handler` once with a recorded
 * event. Plain JavaScript, run by plain `node` (no tsx, no loader hooks), so nothing
 * but Node and the bundle is loaded.
 *
 *   node bench/support/lambda-cold-start.mjs <bundle.mjs> <event.json>
 *
 * Prints one line `MAM_COLD_START {...}` with the response and the child's own
 * clock (performance.now(), milliseconds since the process started): when this
 * script began, when the import finished, when the handler answered; the CPU it used
 * until the answer (process.cpuUsage); and the
 * import's end on the monotonic clock, to split a `--cpu-prof` profile. Then exits at
 * once: a Lambda container is frozen after the answer, so open sockets (the SDK's
 * keep-alive to DynamoDB) must not keep this process alive.
 */
import { readFileSync, writeSync } from "node:fs";
import { pathToFileURL } from "node:url";

const started = performance.now();
const [bundle, eventFile] = process.argv.slice(2);
if (bundle === undefined || eventFile === undefined) {
  process.stderr.write("usage: lambda-cold-start.mjs <bundle.mjs> <event.json>\n");
  process.exit(2);
}
const event = JSON.parse(readFileSync(eventFile, "utf8"));
const deadline = Date.now() + 30_000;
const context = {
  callbackWaitsForEmptyEventLoop: true,
  functionName: "mam-bench-http",
  functionVersion: "$LATEST",
  invokedFunctionArn: "arn:aws:lambda:us-east-1:123456789012:function:mam-bench-http",
  memoryLimitInMB: "1024",
  awsRequestId: "bench-cold-start",
  logGroupName: "/aws/lambda/mam-bench-http",
  logStreamName: "bench",
  getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
  done: () => undefined,
  fail: () => undefined,
  succeed: () => undefined,
};

const { handler } = await import(pathToFileURL(bundle).href);
const imported = performance.now();
// The same instant on the monotonic clock a --cpu-prof profile is stamped with (microseconds).
const importedClockUs = Number(process.hrtime.bigint() / 1000n);
const response = await handler(event, context);
const answered = performance.now();
// CPU the process used from its start to the answer (user + system, ms): what a busy
// machine's waiting for a core does not inflate, unlike the wall-clock figures.
const { user, system } = process.cpuUsage();
const cpuMs = (user + system) / 1000;
// writeSync: the line is out before process.exit, whatever stdout is.
writeSync(1, `MAM_COLD_START ${JSON.stringify({ started, imported, answered, importedClockUs, cpuMs, response })}\n`);
process.exit(0);

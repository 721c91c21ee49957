/**
 * What `npm run offline` and the stream test read from serverless.yml: the stream
 * function's event source mapping and the sweep's schedule, so the stand-ins run as
 * configured for AWS, not as a copy of it. CloudFormation's short tags (`!Ref`,
 * `!GetAtt`, ...) are read as plain values; `${...}` variables are not resolved (the
 * settings read here are literals).
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { parse, type Tags } from "yaml";
import { mappingOfServerlessStreamEvent, type StreamEventSourceMapping } from "../peers/stream-poller.ts";

export const REPO_ROOT = path.resolve(import.meta.dirname, "..", "..");

/** serverless.yml writes CloudFormation's short tags in their scalar form only. */
const CFN_TAGS: Tags = ["Ref", "GetAtt", "Sub", "ImportValue"].map((name) => ({
  tag: `!${name}`,
  resolve: (value: string) => (name === "Ref" ? { Ref: value } : { [`Fn::${name}`]: value }),
}));

interface ServerlessFunction {
  readonly events?: readonly Readonly<Record<string, unknown>>[];
}

export function readServerlessYml(file = path.join(REPO_ROOT, "serverless.yml")): { functions: Record<string, ServerlessFunction> } {
  return parse(readFileSync(file, "utf8"), { customTags: CFN_TAGS }) as { functions: Record<string, ServerlessFunction> };
}

/** The `stream` event of the function (the stream publisher's, by default). */
export function streamMappingOf(functionName = "streamPublisher"): StreamEventSourceMapping {
  const events = readServerlessYml().functions[functionName]?.events ?? [];
  const stream = events.map((e) => e.stream).find((s) => typeof s === "object" && s !== null);
  if (stream === undefined) throw new Error(`serverless.yml: function ${functionName} has no stream event`);
  return mappingOfServerlessStreamEvent(stream as Record<string, unknown>);
}

/** The period of the function's `schedule: rate(N unit)` event, in milliseconds. */
export function scheduleRateMsOf(functionName = "recoverySweep"): number {
  const events = readServerlessYml().functions[functionName]?.events ?? [];
  const schedule = events.map((e) => e.schedule as { rate?: unknown } | undefined).find((s) => s !== undefined);
  const rate = schedule?.rate;
  const match = typeof rate === "string" ? /^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$/.exec(rate) : null;
  if (match === null) throw new Error(`serverless.yml: function ${functionName} has no schedule rate(N unit) (got ${String(rate)})`);
  const unit = { minute: 60_000, hour: 3_600_000, day: 86_400_000 }[(match[2] as string).replace(/s$/, "") as "minute" | "hour" | "day"];
  return Number(match[1]) * unit;
}

/**
 * Issue 19, part 7, for the Lambda roots: a function that cannot start (a bad
 * variable, a setting missing) writes one log line, `<function>_start_failed`, whose
 * message names what to change; the http function answers a problem document, the
 * stream and schedule functions fail the invocation (Lambda retries it) — and the
 * next invocation builds again. Nothing is contacted: every case fails before a client is used.
 */
import type { Context, DynamoDBStreamEvent, ScheduledEvent } from "aws-lambda";
import type { LambdaEvent } from "hono/aws-lambda";
import { describe, expect, it } from "vitest";
import {
  createFeedWriterHandler,
  createHttpHandler,
  createRecoverySweepHandler,
  createStreamPublisherHandler,
} from "../../functions/compose.ts";
import { lambdaFixture, memoryLog } from "./support.ts";

const BASE = {
  AWS_REGION: "us-east-1",
  MAM_TABLE_NAME: "mam-jobs",
  MAM_BUCKET_NAME: "mam-reports",
  MAM_IOT_ENDPOINT: "iot.invalid",
  MAM_TOKEN_SIGNING_KEY: "test-signing-key-0123456789abcdef-0123456789",
  AWS_ACCESS_KEY_ID: "x",
  AWS_SECRET_ACCESS_KEY: "x",
};

const context = { awsRequestId: "req-start-failure" } as Context;
const SCHEDULED = lambdaFixture<ScheduledEvent>("eventbridge-scheduled.json");
const STREAM = lambdaFixture<DynamoDBStreamEvent>("dynamodb-stream-noop-batch.json");

const FAILURES: readonly { readonly name: string; readonly env: Record<string, string | undefined>; readonly names: string }[] = [
  { name: "a bad variable", env: { MAM_SWEEP_MAX_FAILURES: "many" }, names: "MAM_SWEEP_MAX_FAILURES" },
  { name: "the table's name missing", env: { MAM_TABLE_NAME: undefined }, names: "MAM_TABLE_NAME" },
];

describe("issue 19: a Lambda root that cannot start says what to change, in one log line", () => {
  for (const { name, env, names } of FAILURES) {
    const fnEnv = { ...BASE, ...env };
    it(`stream publisher, feed writer and sweep, ${name}: the invocation fails, one ${names} line`, async () => {
      for (const [fn, invoke] of [
        ["stream", (log: (l: string) => void) => createStreamPublisherHandler(fnEnv, { log })(STREAM, context)],
        ["stream", (log: (l: string) => void) => createFeedWriterHandler(fnEnv, { log })(STREAM, context)],
        ["sweep", (log: (l: string) => void) => createRecoverySweepHandler(fnEnv, { log })(SCHEDULED, context)],
      ] as const) {
        const log = memoryLog();
        await expect(invoke(log.sink)).rejects.toMatchObject({ code: "config.invalid" });
        expect(log.entries(), fn).toHaveLength(1);
        expect(log.entries()[0]).toMatchObject({ event: `${fn}_start_failed`, code: "config.invalid" });
        expect(String(log.entries()[0]?.message)).toContain(names);
      }
    });

    it(`http, ${name}: a 500 problem document, the cause in one ${names} line, not in the answer`, async () => {
      const log = memoryLog();
      const h = createHttpHandler(fnEnv, { log: log.sink });
      const answer = await h(lambdaFixture<LambdaEvent>("http-api-v2-get-job.json"), context);
      expect(answer.statusCode).toBe(500);
      expect(JSON.parse(answer.body)).toMatchObject({ code: "config.invalid", request_id: context.awsRequestId });
      expect(answer.body).not.toContain(names);
      expect(log.entries()).toHaveLength(1);
      expect(log.entries()[0]).toMatchObject({ event: "http_start_failed", code: "config.invalid" });
      expect(String(log.entries()[0]?.message)).toContain(names);
      // Not remembered: the next invocation builds again, and fails again, saying so again.
      await h(lambdaFixture<LambdaEvent>("http-api-v2-get-job.json"), context);
      expect(log.entries()).toHaveLength(2);
    });
  }
});

/**
 * The environment the test support reads, parsed once (here) when a test file loads.
 *
 * - `MAM_DYNAMODB_PEER`: which DynamoDB engine the AWS-backend tests run on.
 *   `dynalite` (the default: in this process, fast, what `npm test` uses) or
 *   `dynamodb-local` (AWS's own DynamoDB Local on Java 17, one instance per test file:
 *   what `npm run test:aws-engine` uses).
 * - `MAM_TEST_BACKENDS`: `all` (the default) runs the suites written once for every
 *   backend on each of them; `aws` runs only their AWS backend (the aws-engine tier:
 *   the SQLite half already ran in `npm test` and would only double the tier's time).
 *
 * An empty value is the default; any other value is an error naming the variable.
 */
import { z } from "zod";

const TestEnv = z.object({
  MAM_DYNAMODB_PEER: z.enum(["dynalite", "dynamodb-local"]).default("dynalite"),
  MAM_TEST_BACKENDS: z.enum(["all", "aws"]).default("all"),
});
export type TestEnv = z.infer<typeof TestEnv>;

/** Parse the test environment; an unknown value throws, naming the variable and what it may be. */
export function parseTestEnv(env: Readonly<Record<string, string | undefined>>): TestEnv {
  const given = Object.fromEntries(Object.keys(TestEnv.shape).map((k) => [k, env[k] === "" ? undefined : env[k]]));
  const parsed = TestEnv.safeParse(given);
  if (parsed.success) return parsed.data;
  const problems = parsed.error.issues.map((issue) => {
    const name = String(issue.path[0]);
    const allowed = TestEnv.shape[name as keyof TestEnv].unwrap().options.map((o) => JSON.stringify(o));
    return `${name} must be ${allowed.join(" or ")}, got ${JSON.stringify(given[name])}`;
  });
  throw new Error(`the test environment is invalid: ${problems.join("; ")}`);
}

export const TEST_ENV: TestEnv = parseTestEnv(process.env);

/** Does this run include the suites' half on this backend? (`MAM_TEST_BACKENDS`) */
export function runsBackend(kind: "embedded" | "aws"): boolean {
  return TEST_ENV.MAM_TEST_BACKENDS === "all" || kind === "aws";
}

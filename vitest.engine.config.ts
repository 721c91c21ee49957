/**
 * `npm run test:aws-engine`: the suites that talk to DynamoDB, on AWS's own DynamoDB
 * Local (MAM_DYNAMODB_PEER=dynamodb-local, one instance per test file) and on their
 * AWS backend only (MAM_TEST_BACKENDS=aws: their SQLite half ran in `npm test`), plus
 * tests/engine/, the tests that need the real engine or AWS's tools (cfn-lint).
 * Needs Java 17 and cfn-lint; a missing one fails the tier, naming it.
 */
import { defineConfig } from "vitest/config";
import base from "./vitest.config.ts";

// Spread, not mergeConfig: mergeConfig concatenates arrays, and `include`/`exclude`
// here replace the default run's (which excludes tests/engine/).
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: [
      "tests/contract/aws.test.ts",
      "tests/seed/*.test.ts",
      "tests/api/aws.test.ts",
      "tests/api/observations-aws.test.ts",
      "tests/evidence/*.test.ts",
      "tests/api/properties.test.ts",
      "tests/costs/*.test.ts",
      "tests/races/*.test.ts",
      "tests/functions/*.test.ts",
      "tests/aws/dynamo-*.test.ts",
      "tests/upgrade/dynamodb.test.ts",
      "tests/engine/**/*.test.ts",
    ],
    // The `mam` CLI's seed tests run the embedded backend only: nothing of DynamoDB's.
    exclude: ["**/node_modules/**", "tests/seed/cli.test.ts"],
    env: { ...base.test?.env, MAM_DYNAMODB_PEER: "dynamodb-local", MAM_TEST_BACKENDS: "aws" },
    // DynamoDB Local answers in hundreds of milliseconds where dynalite takes tens.
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});

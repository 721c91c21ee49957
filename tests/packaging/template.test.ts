/**
 * `npm run package` (esbuild bundles + `osls package`), offline and without
 * credentials, and what the CloudFormation template it writes promises: the table
 * exactly as packages/aws defines it, a bucket nobody reaches without TLS or from
 * the public, the stream mapping's failure handling, the schedule, and one
 * least-privilege role per function.
 *
 * Packaging runs once per run of this file, into a temporary directory (osls clears
 * `.serverless/` as it starts; `.build/` is rebuilt, as `npm run package` does).
 */
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { DASHBOARD_FILES, DOCS_ASSETS } from "@mam/api";
import { JOB_TABLE_DEFINITION, RETIRED_TAG } from "@mam/aws";
import { parseConfig } from "@mam/core";
import type { Metafile } from "esbuild";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempDirSync } from "../support/temp-dir.ts";
import { holdPackagingLock, type Resource, runPackage, type Template } from "./package.ts";
import { zipEntries } from "./zip-entries.ts";

const ROOT = join(import.meta.dirname, "..", "..");

interface Statement {
  readonly Sid?: string;
  readonly Effect: "Allow" | "Deny";
  readonly Principal?: unknown;
  readonly Action: string | readonly string[];
  readonly Resource: unknown;
  readonly Condition?: Record<string, Record<string, unknown>>;
}
interface PolicyDocument {
  readonly Statement: readonly Statement[];
}

/** An intrinsic function as the string it evaluates to, with `<Ref>` / `<Resource.Attr>` standing for what only CloudFormation knows. */
function render(value: unknown): string {
  if (typeof value === "string") return value;
  const v = value as Record<string, unknown>;
  if (typeof v.Ref === "string") return `<${v.Ref}>`;
  const getAtt = v["Fn::GetAtt"];
  if (Array.isArray(getAtt)) return `<${getAtt.join(".")}>`;
  const join_ = v["Fn::Join"];
  if (Array.isArray(join_)) return (join_[1] as unknown[]).map(render).join(join_[0] as string);
  throw new Error(`cannot render ${JSON.stringify(value)}`);
}

const list = (v: unknown): string[] => (Array.isArray(v) ? v.map(render) : [render(v)]);
const actionsOf = (s: Statement): string[] => (typeof s.Action === "string" ? [s.Action] : [...s.Action]);

const ACCOUNT_ARN = (service: string): string => `arn:<AWS::Partition>:${service}:<AWS::Region>:<AWS::AccountId>`;
const IOT_MAM_TOPICS = `${ACCOUNT_ARN("iot")}:topic/mam/*`;

let outDir: string;
let template: Template;
let output: string;

let releasePackaging: (() => Promise<void>) | undefined;

// This file reads `.build/` after packaging: no other file may rebuild it meanwhile.
beforeAll(async () => {
  releasePackaging = await holdPackagingLock();
  outDir = tempDirSync("package").dir;
  ({ template, output } = runPackage(outDir, []));
}, 300_000);

afterAll(async () => {
  if (outDir !== undefined) rmSync(outDir, { recursive: true, force: true });
  await releasePackaging?.();
});

const resource = (logicalId: string): Resource => {
  const r = template.Resources[logicalId];
  if (r === undefined) throw new Error(`no resource ${logicalId}`);
  return r;
};
const ofType = (type: string): [string, Resource][] => Object.entries(template.Resources).filter(([, r]) => r.Type === type);

/** Every IAM statement the stack grants, with the role or policy it belongs to. */
function iamStatements(): { owner: string; statement: Statement }[] {
  const out: { owner: string; statement: Statement }[] = [];
  for (const [id, r] of Object.entries(template.Resources)) {
    const docs: PolicyDocument[] = [];
    if (r.Type === "AWS::IAM::Role") {
      for (const p of (r.Properties.Policies ?? []) as { PolicyDocument: PolicyDocument }[]) docs.push(p.PolicyDocument);
      expect(r.Properties.ManagedPolicyArns, `${id} attaches no managed policy`).toBeUndefined();
    }
    if (r.Type === "AWS::IAM::Policy" || r.Type === "AWS::IAM::ManagedPolicy") docs.push(r.Properties.PolicyDocument as PolicyDocument);
    for (const d of docs) for (const statement of d.Statement) out.push({ owner: id, statement });
  }
  return out;
}

/** The role a function runs as: its own role's ARN, by `!Sub "${Role.Arn}"` (serverless.yml says why not GetAtt). */
function roleOf(functionId: string): string {
  const role = resource(functionId).Properties.Role as { "Fn::Sub"?: unknown };
  const match = typeof role["Fn::Sub"] === "string" ? /^\$\{(\w+)\.Arn\}$/.exec(role["Fn::Sub"]) : null;
  expect(match, `${functionId}'s role is \${<Role>.Arn}`).not.toBeNull();
  return match![1]!;
}

/** A role's Allow statements as (action, resource) pairs. */
function grants(roleId: string): { action: string; resource: string; condition: unknown }[] {
  return iamStatements()
    .filter((s) => s.owner === roleId && s.statement.Effect === "Allow")
    .flatMap(({ statement }) =>
      actionsOf(statement).flatMap((action) =>
        list(statement.Resource).map((r) => ({ action, resource: r, condition: statement.Condition })),
      ),
    );
}

function actionsOn(roleId: string, resourceArn: string): string[] {
  return grants(roleId)
    .filter((g) => g.resource === resourceArn)
    .map((g) => g.action)
    .sort();
}

const FUNCTIONS = {
  http: { id: "HttpLambdaFunction", bundle: "http", logGroup: "HttpLogGroup" },
  streamPublisher: { id: "StreamPublisherLambdaFunction", bundle: "stream-publisher", logGroup: "StreamPublisherLogGroup" },
  feedWriter: { id: "FeedWriterLambdaFunction", bundle: "feed-writer", logGroup: "FeedWriterLogGroup" },
  recoverySweep: { id: "RecoverySweepLambdaFunction", bundle: "recovery-sweep", logGroup: "RecoverySweepLogGroup" },
} as const;

describe("npm run package", () => {
  it("bundles each entry point and packages offline, without credentials", () => {
    expect(output).toMatch(/Service packaged/);
    for (const f of Object.values(FUNCTIONS)) expect(output).toContain(`bundled ${f.bundle}:`);
  });

  it("each function's zip holds its own bundle (and the http one the docs assets and the dashboard's files), nothing else", () => {
    for (const [name, f] of Object.entries(FUNCTIONS)) {
      const entries = zipEntries(join(outDir, `${name}.zip`)).filter((e) => !e.endsWith("/"));
      const own = entries.filter((e) => e.startsWith(`.build/${f.bundle}/`));
      expect(own, name).toEqual(entries);
      expect(entries, name).toContain(`.build/${f.bundle}/${f.bundle}.mjs`);
      expect(
        entries.some((e) => e.includes("node_modules/@aws-sdk") || e.includes("/src/")),
        name,
      ).toBe(false);
    }
    const docs = zipEntries(join(outDir, "http.zip"))
      .filter((e) => e.startsWith(".build/http/node_modules/swagger-ui-dist/"))
      .map((e) => e.slice(".build/http/node_modules/swagger-ui-dist/".length));
    expect(docs.sort()).toEqual(["package.json", ...Object.keys(DOCS_ASSETS)].sort());
    expect(readdirSync(join(ROOT, ".build", "http", "node_modules", "swagger-ui-dist")).sort()).toEqual(docs.sort());
    const dashboard = zipEntries(join(outDir, "http.zip"))
      .filter((e) => e.startsWith(".build/http/node_modules/@mam/dashboard/"))
      .map((e) => e.slice(".build/http/node_modules/@mam/dashboard/".length));
    expect(dashboard.sort()).toEqual(["package.json", ...Object.keys(DASHBOARD_FILES).map((f) => `dist/${f}`)].sort());
  });

  it("each zip holds every chunk its bundle imports; the http cold start loads no SSM, S3 or IoT client and no Powertools Metrics (chunks of their own)", () => {
    for (const [name, f] of Object.entries(FUNCTIONS)) {
      const { outputs } = JSON.parse(readFileSync(join(ROOT, ".build", `${f.bundle}.meta.json`), "utf8")) as Metafile;
      const entries = new Set(zipEntries(join(outDir, `${name}.zip`)));
      for (const file of Object.keys(outputs)) expect(entries.has(file), `${name}: ${file}`).toBe(true);
      if (f.bundle !== "http") continue;
      // What a cold start loads: the entry and the chunks it imports statically.
      const main = Object.keys(outputs).find((file) => outputs[file]?.entryPoint === "functions/http.ts");
      const eager = new Set<string>();
      const queue = main === undefined ? [] : [main];
      for (let file = queue.pop(); file !== undefined; file = queue.pop()) {
        if (eager.has(file)) continue;
        eager.add(file);
        for (const i of outputs[file]?.imports ?? []) if (i.kind === "import-statement" && i.path in outputs) queue.push(i.path);
      }
      const loaded = [...eager].flatMap((file) => Object.keys(outputs[file]?.inputs ?? {}));
      expect(loaded).toContain("functions/compose.ts");
      for (const pkg of ["@aws-sdk/client-ssm", "@aws-sdk/client-s3", "@aws-sdk/client-iot-data-plane", "@aws-lambda-powertools/metrics"]) {
        expect(
          loaded.filter((input) => input.includes(`node_modules/${pkg}/`)),
          pkg,
        ).toEqual([]);
        const lazy = Object.keys(outputs).filter((file) =>
          Object.keys(outputs[file]?.inputs ?? {}).some((input) => input.includes(`node_modules/${pkg}/`)),
        );
        expect(lazy.length, pkg).toBeGreaterThan(0);
      }
    }
  });

  it("the bundles load on plain Node and answer: the http one serves /healthz and a docs asset", () => {
    const script = `
      const { handler } = await import(${JSON.stringify(join(ROOT, ".build", "http", "http.mjs"))});
      const event = (path) => ({ version: "2.0", routeKey: "ANY /{proxy+}", rawPath: path, rawQueryString: "",
        headers: { host: "example.execute-api.us-east-1.amazonaws.com" }, isBase64Encoded: false,
        requestContext: { http: { method: "GET", path, protocol: "HTTP/1.1", sourceIp: "203.0.113.1", userAgent: "t" },
          domainName: "example.execute-api.us-east-1.amazonaws.com", stage: "$default", requestId: "r", routeKey: "ANY /{proxy+}",
          accountId: "123456789012", apiId: "example", time: "", timeEpoch: 0 } });
      const health = await handler(event("/healthz"), {});
      const asset = await handler(event("/docs/assets/swagger-ui.css"), {});
      const others = await Promise.all(["stream-publisher", "recovery-sweep"].map(async (n) =>
        typeof (await import(${JSON.stringify(join(ROOT, ".build"))} + "/" + n + "/" + n + ".mjs")).handler));
      process.stdout.write(JSON.stringify({ health: [health.statusCode, health.body], asset: [asset.statusCode, asset.headers["content-type"]], others }));
    `;
    const run = spawnSync(process.execPath, ["--no-warnings", "--input-type=module", "-e", script], {
      encoding: "utf8",
      env: {
        PATH: process.env.PATH ?? "",
        AWS_REGION: "us-east-1",
        MAM_TABLE_NAME: "mam-dev-jobs",
        MAM_BUCKET_NAME: "mam-dev-reports",
        MAM_IOT_ENDPOINT: "example-ats.iot.us-east-1.amazonaws.com",
        MAM_TOKEN_SIGNING_KEY: "packaging-smoke-test-key-0123456789abcdef",
      },
      timeout: 30_000,
    });
    expect(run.status, run.stderr).toBe(0);
    const lastLine = run.stdout.trim().split("\n").at(-1) ?? "";
    expect(JSON.parse(lastLine)).toEqual({
      health: [200, JSON.stringify({ ok: true })],
      asset: [200, "text/css; charset=utf-8"],
      others: ["function", "function"],
    });
  });
});

describe("the CloudFormation template", () => {
  it("the job table: on demand, keys and indexes exactly as packages/aws defines them, stream of new and old images, PITR, SSE", () => {
    const table = resource("JobTable");
    expect(table.Type).toBe("AWS::DynamoDB::Table");
    const p = table.Properties;
    expect(p.BillingMode).toBe(JOB_TABLE_DEFINITION.BillingMode);
    expect(p.AttributeDefinitions).toEqual(JOB_TABLE_DEFINITION.AttributeDefinitions);
    expect(p.KeySchema).toEqual(JOB_TABLE_DEFINITION.KeySchema);
    expect(p.GlobalSecondaryIndexes).toEqual(JOB_TABLE_DEFINITION.GlobalSecondaryIndexes);
    expect(p.StreamSpecification).toEqual({ StreamViewType: "NEW_AND_OLD_IMAGES" });
    expect(p.PointInTimeRecoverySpecification).toEqual({ PointInTimeRecoveryEnabled: true });
    expect(p.SSESpecification).toEqual({ SSEEnabled: true });
    expect(table).toMatchObject({ DeletionPolicy: "Retain", UpdateReplacePolicy: "Retain" });
  });

  it("the report bucket: versioned, encrypted, public access blocked, TLS only", () => {
    const bucket = resource("ReportBucket").Properties;
    expect(bucket.VersioningConfiguration).toEqual({ Status: "Enabled" });
    const sse = (
      bucket.BucketEncryption as { ServerSideEncryptionConfiguration: { ServerSideEncryptionByDefault: { SSEAlgorithm: string } }[] }
    ).ServerSideEncryptionConfiguration;
    expect(["AES256", "aws:kms"]).toContain(sse[0]?.ServerSideEncryptionByDefault.SSEAlgorithm);
    expect(bucket.PublicAccessBlockConfiguration).toEqual({
      BlockPublicAcls: true,
      BlockPublicPolicy: true,
      IgnorePublicAcls: true,
      RestrictPublicBuckets: true,
    });

    const policies = ofType("AWS::S3::BucketPolicy").filter(([, r]) => render(r.Properties.Bucket) === "<ReportBucket>");
    expect(policies).toHaveLength(1);
    const statements = policies.flatMap(([, r]) => (r.Properties.PolicyDocument as PolicyDocument).Statement);
    const tlsOnly = statements.find(
      (s) => s.Effect === "Deny" && s.Condition?.Bool?.["aws:SecureTransport"] === "false" && actionsOf(s).includes("s3:*"),
    );
    expect(tlsOnly).toBeDefined();
    expect(list(tlsOnly?.Resource).sort()).toEqual(["<ReportBucket.Arn>", "<ReportBucket.Arn>/*"]);
  });

  it("the recovery sweep runs every 5 minutes", () => {
    const rules = ofType("AWS::Events::Rule").map(([, r]) => r.Properties);
    expect(rules).toEqual([
      expect.objectContaining({
        ScheduleExpression: "rate(5 minutes)",
        State: "ENABLED",
        Targets: [expect.objectContaining({ Arn: { "Fn::GetAtt": ["RecoverySweepLambdaFunction", "Arn"] } })],
      }),
    ]);
  });

  it("two stream mappings, each on the table's stream with partial batch failures, bisect, bounded retries and an SQS on-failure destination of its own", () => {
    const mappings = new Map(
      ofType("AWS::Lambda::EventSourceMapping").map(([, r]) => [
        (r.Properties.FunctionName as { "Fn::GetAtt": string[] })["Fn::GetAtt"][0],
        r.Properties,
      ]),
    );
    expect([...mappings.keys()].sort()).toEqual(["FeedWriterLambdaFunction", "StreamPublisherLambdaFunction"]);
    const expected = {
      StreamPublisherLambdaFunction: {
        retries: 5,
        queue: "StreamFailureQueue",
        // Only job items owing an intent invoke the publisher.
        filter: { dynamodb: { NewImage: { sk: { S: ["JOB"] }, pending_notification: { M: { id: { S: [{ exists: true }] } } } } } },
      },
      // Every job item's write invokes the feed writer; its own feed rows do not.
      FeedWriterLambdaFunction: { retries: 10, queue: "FeedFailureQueue", filter: { dynamodb: { Keys: { sk: { S: ["JOB"] } } } } },
    } as const;
    for (const [fn, want] of Object.entries(expected)) {
      const m = mappings.get(fn) ?? {};
      expect(m.EventSourceArn, fn).toEqual({ "Fn::GetAtt": ["JobTable", "StreamArn"] });
      expect(m.FunctionResponseTypes, fn).toEqual(["ReportBatchItemFailures"]);
      expect(m.BisectBatchOnFunctionError, fn).toBe(true);
      expect(m.MaximumRetryAttempts, fn).toBe(want.retries);
      const destination = (m.DestinationConfig as { OnFailure: { Destination: unknown } }).OnFailure.Destination;
      expect(destination, fn).toEqual({ "Fn::GetAtt": [want.queue, "Arn"] });
      expect(resource(want.queue).Type).toBe("AWS::SQS::Queue");
      const [filter] = (m.FilterCriteria as { Filters: { Pattern: string }[] }).Filters;
      expect(JSON.parse(filter?.Pattern ?? "{}"), fn).toEqual(want.filter);
    }
    // The sweep redrives the feed's queue.
    const sweepEnv = (resource("RecoverySweepLambdaFunction").Properties.Environment as { Variables: Record<string, unknown> }).Variables;
    expect(sweepEnv.MAM_FEED_FAILURE_QUEUE_URL).toEqual({ Ref: "FeedFailureQueue" });
  });

  it("the http function is behind an HTTP API on ANY / and ANY /{proxy+}", () => {
    const routes = ofType("AWS::ApiGatewayV2::Route").map(([, r]) => r.Properties.RouteKey);
    expect(routes.sort()).toEqual(["ANY /", "ANY /{proxy+}"]);
  });

  it("every function: nodejs22.x on arm64, its bundle as handler, the configuration the env schema accepts", () => {
    for (const f of Object.values(FUNCTIONS)) {
      const p = resource(f.id).Properties;
      expect(p).toMatchObject({ Runtime: "nodejs22.x", Architectures: ["arm64"], Handler: `.build/${f.bundle}/${f.bundle}.handler` });
      const env = (p.Environment as { Variables: Record<string, unknown> }).Variables;
      expect(env).toMatchObject({
        MAM_TABLE_NAME: { Ref: "JobTable" },
        MAM_BUCKET_NAME: { Ref: "ReportBucket" },
        MAM_IOT_ENDPOINT: expect.any(String),
        MAM_TOKEN_SIGNING_KEY_PARAMETER: "/mam/token-signing-key",
        MAM_AUTO_COMPLETE: "0",
      });
      // What CloudFormation fills in, then the one schema every function parses at start-up.
      const resolved = Object.fromEntries(
        Object.entries(env).map(([k, v]) => [k, typeof v === "string" ? v : `https://resolved.invalid/${k.toLowerCase()}`]),
      );
      const config = parseConfig({ ...resolved, AWS_REGION: "us-east-1" });
      expect(config.flags.autoComplete).toBe(false);
      expect(config.aws.tableName).toBeDefined();
    }
  });

  it("one role per function, each its own, and no default role shared by all", () => {
    const roles = Object.values(FUNCTIONS).map((f) => roleOf(f.id));
    expect(new Set(roles).size).toBe(Object.keys(FUNCTIONS).length);
    for (const r of roles) expect(resource(r).Type).toBe("AWS::IAM::Role");
    expect(template.Resources.IamRoleLambdaExecution).toBeUndefined();
  });

  it("no IAM statement allows anything on Resource '*', nor a service-wide action (dynamodb:*, s3:*, iot:*, ...)", () => {
    const statements = iamStatements();
    expect(statements.length).toBeGreaterThan(10);
    for (const { owner, statement } of statements) {
      if (statement.Effect !== "Allow") continue;
      const where = `${owner}/${statement.Sid ?? "?"}`;
      for (const r of list(statement.Resource)) expect(r, where).not.toBe("*");
      for (const a of actionsOf(statement)) expect(a, where).not.toMatch(/\*/);
      expect(actionsOf(statement), where).not.toContain("iot:DescribeEndpoint");
    }
  });

  it("IoT: publish only, only under mam/", () => {
    const iot = iamStatements().filter(({ statement }) => actionsOf(statement).some((a) => a.startsWith("iot")));
    expect(iot.map((s) => s.owner).sort()).toEqual(["HttpFunctionRole", "RecoverySweepFunctionRole", "StreamPublisherFunctionRole"]);
    for (const { statement } of iot) {
      expect(actionsOf(statement)).toEqual(["iot:Publish"]);
      expect(list(statement.Resource)).toEqual([IOT_MAM_TOPICS]);
    }
  });

  it("CloudWatch Logs: each role writes only to its own function's log group", () => {
    for (const f of Object.values(FUNCTIONS)) {
      const logs = grants(roleOf(f.id)).filter((g) => g.action.startsWith("logs:"));
      expect(logs.map((g) => g.action).sort()).toEqual(["logs:CreateLogStream", "logs:PutLogEvents"]);
      for (const g of logs) expect(g.resource).toBe(`<${f.logGroup}.Arn>`);
      expect(resource(f.logGroup).Type).toBe("AWS::Logs::LogGroup");
    }
  });

  it("the http role: items and indexes of the table, objects under reports/, publish, and the one signing-key parameter", () => {
    const role = roleOf(FUNCTIONS.http.id);
    const rw = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"];
    // DescribeTable: the storage step a function runs where it starts (the attention index is there).
    expect(actionsOn(role, "<JobTable.Arn>")).toEqual(["dynamodb:DescribeTable", ...rw]);
    expect(actionsOn(role, "<JobTable.Arn>/index/*")).toEqual(rw);
    expect(actionsOn(role, "<ReportBucket.Arn>/reports/*")).toEqual(["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]);
    // Only so that a missing report is a 404 (S3 answers 403 without it).
    expect(actionsOn(role, "<ReportBucket.Arn>")).toEqual(["s3:ListBucket"]);
    expect(actionsOn(role, IOT_MAM_TOPICS)).toEqual(["iot:Publish"]);
    expect(actionsOn(role, `${ACCOUNT_ARN("ssm")}:parameter/mam/token-signing-key`)).toEqual(["ssm:GetParameter"]);
    expect(grants(role).filter((g) => g.action.startsWith("kms:"))).toEqual([]);
    // Retiring a pinned copy nothing references: tagging the evidence keys, with the one tag key the lifecycle rule filters on.
    expect(actionsOn(role, "<ReportBucket.Arn>/reports/*/evidence/*")).toEqual(["s3:PutObjectTagging"]);
    expect(grants(role).find((g) => g.action === "s3:PutObjectTagging")?.condition).toEqual({
      "ForAllValues:StringEquals": { "s3:RequestObjectTagKeys": ["mam-retired"] },
    });
    const covered = new Set(grants(role).map((g) => g.resource));
    expect(covered.size).toBe(8); // the log group and the seven above: nothing else
  });

  it("retired pinned copies expire by a lifecycle rule filtered on their tag, noncurrent versions included; nothing else expires them", () => {
    const rules = (resource("ReportBucket").Properties.LifecycleConfiguration as { Rules: Record<string, unknown>[] }).Rules;
    const retired = rules.filter((r) => r.TagFilters !== undefined);
    expect(retired).toEqual([
      {
        Id: "expire-retired-pinned-copies",
        Status: "Enabled",
        TagFilters: [{ Key: RETIRED_TAG.Key, Value: RETIRED_TAG.Value }],
        ExpirationInDays: 7,
        NoncurrentVersionExpiration: { NoncurrentDays: 1 },
      },
    ]);
    // No rule expires current objects without the tag: a pinned copy in force is never expired.
    expect(rules.filter((r) => r.ExpirationInDays !== undefined || r.ExpirationDate !== undefined)).toEqual(retired);
  });

  it("no role may delete the write-once evidence a completion pins", () => {
    const denied = iamStatements().filter((s) => s.statement.Effect === "Deny");
    const http = denied.filter((s) => s.owner === roleOf(FUNCTIONS.http.id));
    expect(http.map((s) => [actionsOf(s.statement), list(s.statement.Resource)])).toEqual([
      [["s3:DeleteObject"], ["<ReportBucket.Arn>/reports/*/evidence/*"]],
    ]);
    // the stream publisher cannot touch report objects at all; the sweep only reads them (the gate re-hashes)
    expect(grants(roleOf(FUNCTIONS.streamPublisher.id)).filter((g) => g.action.startsWith("s3:"))).toEqual([]);
    const sweepS3 = grants(roleOf(FUNCTIONS.recoverySweep.id)).filter((g) => g.action.startsWith("s3:"));
    expect(sweepS3.map((g) => `${g.action} ${g.resource}`).sort()).toEqual([
      "s3:GetObject <ReportBucket.Arn>/reports/*",
      "s3:ListBucket <ReportBucket.Arn>",
    ]);
  });

  it("the stream functions read one item of the table: its schema version (pk SCHEMA), by a condition on the key", () => {
    for (const f of [FUNCTIONS.streamPublisher, FUNCTIONS.feedWriter]) {
      const reads = grants(roleOf(f.id)).filter((g) => g.action === "dynamodb:GetItem");
      expect(reads, f.id).toEqual([
        {
          action: "dynamodb:GetItem",
          resource: "<JobTable.Arn>",
          condition: { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["SCHEMA"] } },
        },
      ]);
    }
  });

  it("the feed writer updates one kind of item: the counter items of the counts per status (pk COUNTS, issue 22), by a condition on the key", () => {
    const updates = grants(roleOf(FUNCTIONS.feedWriter.id)).filter((g) => g.action === "dynamodb:UpdateItem");
    expect(updates).toEqual([
      {
        action: "dynamodb:UpdateItem",
        resource: "<JobTable.Arn>",
        condition: { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["COUNTS"] } },
      },
    ]);
  });

  it("the stream publisher role: read the stream, settle and log on the table, publish, send to its failure queue", () => {
    const role = roleOf(FUNCTIONS.streamPublisher.id);
    expect(actionsOn(role, "<JobTable.StreamArn>")).toEqual([
      "dynamodb:DescribeStream",
      "dynamodb:GetRecords",
      "dynamodb:GetShardIterator",
      "dynamodb:ListStreams",
    ]);
    // GetItem: the schema version item only (the test above); DescribeTable: the storage step where it starts.
    expect(actionsOn(role, "<JobTable.Arn>")).toEqual([
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
    ]);
    expect(actionsOn(role, IOT_MAM_TOPICS)).toEqual(["iot:Publish"]);
    expect(actionsOn(role, "<StreamFailureQueue.Arn>")).toEqual(["sqs:SendMessage"]);
    expect(grants(role).some((g) => g.resource.includes("ReportBucket") || g.action.startsWith("ssm:"))).toBe(false);
  });

  it("the recovery sweep role: query the owed, candidates' and attention indexes only, read items for the gate, settle, log, commit and mark on the table, read report objects, publish (issue 20: exactly what evaluating and marking need)", () => {
    const role = roleOf(FUNCTIONS.recoverySweep.id);
    expect(actionsOn(role, "<JobTable.Arn>/index/owed")).toEqual(["dynamodb:Query"]);
    // The due candidates: their partition of the overloaded feed-by-job index (packages/aws job-table.ts).
    expect(actionsOn(role, "<JobTable.Arn>/index/feed-by-job")).toEqual(["dynamodb:Query"]);
    expect(
      grants(role)
        .filter((g) => g.resource.startsWith("<JobTable.Arn>/index/"))
        .map((g) => g.resource)
        .sort(),
    ).toEqual(["<JobTable.Arn>/index/attention", "<JobTable.Arn>/index/feed-by-job", "<JobTable.Arn>/index/owed"]);
    // The jobs due for a look (stale, overdue).
    expect(actionsOn(role, "<JobTable.Arn>/index/attention")).toEqual(["dynamodb:Query"]);
    // GetItem: the schema version item, and the gate's reads (the latest dispatch); UpdateItem: settle, commit, clear or
    // set a mark; DescribeTable: the storage step a function runs where it starts.
    expect(actionsOn(role, "<JobTable.Arn>")).toEqual([
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
    ]);
    expect(actionsOn(role, "<ReportBucket.Arn>/reports/*")).toEqual(["s3:GetObject"]);
    expect(actionsOn(role, "<ReportBucket.Arn>")).toEqual(["s3:ListBucket"]);
    expect(actionsOn(role, IOT_MAM_TOPICS)).toEqual(["iot:Publish"]);
    expect(grants(role).some((g) => g.action === "dynamodb:Scan" || g.action.startsWith("ssm:") || g.action.startsWith("kms:"))).toBe(
      false,
    );
  });
});

describe("deploy-time params", () => {
  let other: Template;
  let otherOutput: string;
  let otherDir: string;

  beforeAll(() => {
    otherDir = tempDirSync("package").dir;
    ({ template: other, output: otherOutput } = runPackage(otherDir, [
      "--stage",
      "prod",
      "--region",
      "eu-west-1",
      "--param",
      "iotEndpoint=a1b2c3d4e5f6g7-ats.iot.eu-west-1.amazonaws.com",
      "--param",
      "signingKeyParameter=/prod/mam/token-signing-key",
      "--param",
      "autoComplete=1",
    ]));
  }, 300_000);

  afterAll(() => {
    if (otherDir !== undefined) rmSync(otherDir, { recursive: true, force: true });
  });

  it("set the IoT endpoint, the signing-key parameter (and the one ARN its role may read) and the auto-complete flag", () => {
    const fn = other.Resources.HttpLambdaFunction?.Properties ?? {};
    expect((fn.Environment as { Variables: Record<string, unknown> }).Variables).toMatchObject({
      MAM_IOT_ENDPOINT: "a1b2c3d4e5f6g7-ats.iot.eu-west-1.amazonaws.com",
      MAM_TOKEN_SIGNING_KEY_PARAMETER: "/prod/mam/token-signing-key",
      MAM_AUTO_COMPLETE: "1",
    });
    expect(fn.FunctionName).toBe("mam-prod-http");
    expect(other.Resources.JobTable?.Properties.TableName).toBe("mam-prod-jobs");
    const policies = (other.Resources.HttpFunctionRole?.Properties.Policies ?? []) as { PolicyDocument: PolicyDocument }[];
    const statements = policies.flatMap((p) => p.PolicyDocument.Statement);
    const ssm = statements.filter((s) => actionsOf(s).includes("ssm:GetParameter")).flatMap((s) => list(s.Resource));
    expect(ssm).toEqual([`${ACCOUNT_ARN("ssm")}:parameter/prod/mam/token-signing-key`]);
  });

  it("without iotEndpoint, the dev stage (the default) is packaged with a loud warning that every publish will fail", () => {
    const env = (resource("HttpLambdaFunction").Properties.Environment as { Variables: Record<string, unknown> }).Variables;
    expect(env.MAM_IOT_ENDPOINT).toBe("https://iot-data-endpoint-not-configured.invalid");
    expect(output).toMatch(
      /^package: WARNING: no iotEndpoint parameter: every publish of this dev stack will fail .*--param iotEndpoint=/m,
    );
    expect(otherOutput).not.toContain("WARNING");
  });

  it("without iotEndpoint, any other stage is refused with exit 1 before anything is packaged, naming the parameter and how to pass it", () => {
    const dir = tempDirSync("package").dir;
    try {
      for (const stage of [
        ["--stage", "prod"],
        ["-s", "staging"],
        ["--stage=prod", "--param", "iotEndpoint="],
      ]) {
        expect(() => runPackage(dir, stage)).toThrow(
          /failed \(1\):\s*package: refused: stage "\w+" needs the iotEndpoint parameter .*every publish to IoT Core fails\); pass --param iotEndpoint=https:\/\//,
        );
      }
      expect(readdirSync(dir)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a signing-key parameter name that would make a broken ARN is refused before anything is packaged", () => {
    const dir = tempDirSync("package").dir;
    try {
      expect(() => runPackage(dir, ["--param", "signingKeyParameter=no-leading-slash"])).toThrow(/hierarchical SSM name/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

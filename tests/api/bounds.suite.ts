import { randomUUID } from "node:crypto";
import { EVENT_PAGE_MAX_BYTES, FREE_FORM_MAX_BYTES, FREE_FORM_MAX_DEPTH, JSON_BODY_MAX_DEPTH } from "@mam/core";
import { afterEach, describe, expect, it } from "vitest";
import { maxFreeForm, nestedArrays, nestedArraysText } from "../support/free-form.ts";
import {
  CANDIDATE_DISPATCH,
  candidateScenario,
  type Harness,
  type HarnessOptions,
  makeHarness,
  type PortsFactory,
  type Res,
} from "./harness.ts";

/**
 * Bounded input at the edge (packages/core/src/bounds.ts): free-form values are
 * refused 400, naming the field and the limit, before any store is read or written;
 * nothing accepted can make a store fail later; event reads are paged by bytes.
 * Run over every adapter family, like routes.suite.ts.
 */
export function apiBoundsSuite(name: string, factory: PortsFactory): void {
  describe(`bounded input over ${name}`, () => {
    const cleanup: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const c of cleanup.splice(0).reverse()) await c();
    });
    const harness = (opts: HarnessOptions = {}) => makeHarness(factory, opts, cleanup);

    /** A registered job, claimed (running, transition_seq 1) unless told otherwise. */
    async function runningJob(h: Harness, over: Record<string, unknown> = {}): Promise<string> {
      const jobId = `job-${randomUUID().slice(0, 12)}`;
      const reg = await h.call("POST", "/v1/jobs", { token: h.operator, json: { job_id: jobId, prompt: "p", agent: "codex", ...over } });
      expect(reg.status, reg.text).toBe(201);
      const claim = await h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "claim", expected_seq: 0 },
      });
      expect(claim.status, claim.text).toBe(200);
      return jobId;
    }

    const raw = (h: Harness, method: string, path: string, text: string): Promise<Res> =>
      h.call(method, path, { token: h.operator, body: text, headers: { "content-type": "application/json" } });

    function expectRefused(res: Res, path: string, message: string | RegExp, code = "input.invalid"): void {
      expect(res.status, res.text).toBe(400);
      expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
      expect(res.body).toMatchObject({ status: 400, code, type: `https://mam.dev/problems/${code}` });
      expect(res.body.errors).toEqual([{ path, message: typeof message === "string" ? message : expect.stringMatching(message) }]);
    }

    /** The job as the store holds it and its whole event log: what a refusal must leave as it was. */
    async function fingerprint(h: Harness, jobId: string): Promise<unknown> {
      const record = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      const events = await h.call("GET", `/v1/jobs/${jobId}/events`, { token: h.operator });
      expect(record.status, record.text).toBe(200);
      expect(events.status, events.text).toBe(200);
      return { record: record.body, events: events.body };
    }

    async function progress(h: Harness, jobId: string, seq: number, value: unknown): Promise<Res> {
      return h.call("POST", `/v1/jobs/${jobId}/transitions`, {
        token: h.operator,
        json: { action: "progress", expected_seq: seq, fields: { progress: value } },
      });
    }

    async function cancel(h: Harness, jobId: string, seq: number): Promise<Res> {
      return h.call("POST", `/v1/jobs/${jobId}/transitions`, { token: h.operator, json: { action: "cancel", expected_seq: seq } });
    }

    it("deep progress is refused 400 naming body.fields.progress and the limit, and the job stays transitionable", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);

      const justOver = await progress(h, jobId, 1, { deep: nestedArrays(FREE_FORM_MAX_DEPTH) });
      expectRefused(justOver, "body.fields.progress", `nested deeper than ${FREE_FORM_MAX_DEPTH} levels`);
      // 999 levels: once past SQLite's JSON depth in the record, every later transition failed.
      const wedging = await progress(h, jobId, 1, { deep: nestedArrays(999) });
      expectRefused(wedging, "body", `the body is nested deeper than ${JSON_BODY_MAX_DEPTH} levels`);
      expect(await fingerprint(h, jobId)).toEqual(before);

      const ok = await progress(h, jobId, 1, { deep: nestedArrays(FREE_FORM_MAX_DEPTH - 1) });
      expect(ok.status, ok.text).toBe(200);
      const cancelled = await cancel(h, jobId, 2);
      expect(cancelled.status, cancelled.text).toBe(200);
      expect(cancelled.body).toMatchObject({ status: "cancelled", transition_seq: 3 });
    });

    it("a body nested 100,000 levels deep is 400 on every JSON route, never a 500, and a 1 MiB body of '[' too", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);
      const deep = nestedArraysText(100_000);
      const wrapped = (field: string) => `{${field}:${deep}}`;
      const bodies: [string, string, string][] = [
        ["POST", "/v1/jobs", deep],
        ["POST", "/v1/jobs", wrapped('"prompt":"p","agent":"codex","x"')],
        ["POST", `/v1/jobs/${jobId}/transitions`, `{"action":"progress","expected_seq":1,"fields":{"progress":{"a":${deep}}}}`],
        ["POST", `/v1/jobs/${jobId}/dispatches`, wrapped('"anchor"')],
        ["POST", `/v1/jobs/${jobId}/attempts/1/finalize`, wrapped('"side_effects"')],
        ["POST", `/v1/jobs/${jobId}/evaluations`, wrapped('"scenario"')],
        ["POST", `/v1/jobs/${jobId}/events`, `{"event":"completed","data":{"a":${deep}}}`],
        ["POST", "/v1/recovery-sweeps", deep],
        ["POST", `/v1/jobs/${jobId}/transitions`, "[".repeat(1024 * 1024)],
        ["POST", `/v1/jobs/${jobId}/transitions`, '{"a":'.repeat(200_000)],
      ];
      for (const [method, path, text] of bodies) {
        const res = await raw(h, method, path, text);
        expectRefused(res, "body", `the body is nested deeper than ${JSON_BODY_MAX_DEPTH} levels`);
      }
      expect(await fingerprint(h, jobId)).toEqual(before);
      expect(h.lines.filter((l) => l.includes('"status":500'))).toEqual([]);
      // Brackets inside strings are text, not nesting.
      const quoted = await progress(h, jobId, 1, { note: "[".repeat(5_000), escaped: '\\"[[[[{{' });
      expect(quoted.status, quoted.text).toBe(200);
    });

    it("event data over 16 KiB, or deeper than 16 levels, is 400 and nothing is committed: record unchanged, no event appended", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);
      const publish = (data: unknown) =>
        h.call("POST", `/v1/jobs/${jobId}/events`, { token: h.operator, json: { event: "completed", data } });

      const over = { ...maxFreeForm(FREE_FORM_MAX_BYTES.eventData), extra: "" };
      expectRefused(await publish(over), "body.data", `more than ${FREE_FORM_MAX_BYTES.eventData} bytes of JSON`);
      expectRefused(
        await publish({ deep: nestedArrays(FREE_FORM_MAX_DEPTH) }),
        "body.data",
        `nested deeper than ${FREE_FORM_MAX_DEPTH} levels`,
      );
      // Deep enough to fail the store's append after the commit (SQLite: past 1,000 levels with the entry's own).
      expectRefused(await publish({ deep: nestedArrays(998) }), "body", `the body is nested deeper than ${JSON_BODY_MAX_DEPTH} levels`);
      expect(await fingerprint(h, jobId)).toEqual(before);

      const atLimit = await publish(maxFreeForm(FREE_FORM_MAX_BYTES.eventData));
      expect(atLimit.status, atLimit.text).toBe(200);
      expect(atLimit.body.record).toMatchObject({ status: "completed", transition_seq: 2 });
    });

    it("numbers DynamoDB cannot store are refused 400 naming where they are: 1e126 and up, below 1e-130, 1e999", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);
      const outOfRange = /^a number out of the storable range/;
      expectRefused(await progress(h, jobId, 1, { big: 1e126 }), "body.fields.progress.big", outOfRange);
      expectRefused(await progress(h, jobId, 1, { list: [1, -1e126] }), "body.fields.progress.list.1", outOfRange);
      expectRefused(await progress(h, jobId, 1, { tiny: { t: 1e-131 } }), "body.fields.progress.tiny.t", outOfRange);
      const infinite = await raw(
        h,
        "POST",
        `/v1/jobs/${jobId}/transitions`,
        '{"action":"progress","expected_seq":1,"fields":{"progress":{"n":1e999}}}',
      );
      expectRefused(infinite, "body.fields.progress.n", "not a finite number");
      const inData = await raw(h, "POST", `/v1/jobs/${jobId}/events`, '{"event":"completed","data":{"n":-1e999}}');
      expectRefused(inData, "body.data.n", "not a finite number");
      expect(await fingerprint(h, jobId)).toEqual(before);

      const edges = { zero: 0, small: 1e-130, negSmall: -1e-130, large: 9.99999999999999e125, safe: 2 ** 53 + 2 };
      const ok = await progress(h, jobId, 1, edges);
      expect(ok.status, ok.text).toBe(200);
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.progress).toEqual(edges);
      expect((await cancel(h, jobId, 2)).status).toBe(200);
    });

    it("a __proto__ key is refused 400 naming it, at any depth, in progress and event data (zod's z.record dropped it silently)", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);
      const top = await raw(
        h,
        "POST",
        `/v1/jobs/${jobId}/transitions`,
        '{"action":"progress","expected_seq":1,"fields":{"progress":{"__proto__":{"x":1}}}}',
      );
      expectRefused(top, "body.fields.progress.__proto__", 'the key "__proto__" is not allowed');
      const nested = await raw(
        h,
        "POST",
        `/v1/jobs/${jobId}/transitions`,
        '{"action":"progress","expected_seq":1,"fields":{"progress":{"a":[{"__proto__":{"polluted":true}}]}}}',
      );
      expectRefused(nested, "body.fields.progress.a.0.__proto__", 'the key "__proto__" is not allowed');
      const inData = await raw(h, "POST", `/v1/jobs/${jobId}/events`, '{"event":"completed","data":{"__proto__":{"polluted":true}}}');
      expectRefused(inData, "body.data.__proto__", 'the key "__proto__" is not allowed');
      expect(({} as Record<string, unknown>).polluted).toBeUndefined();
      expect(await fingerprint(h, jobId)).toEqual(before);
    });

    it("a constructor key (DynamoDB's marshaller takes the object for a class instance) and an empty key are refused; prototype is kept", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const before = await fingerprint(h, jobId);
      expectRefused(
        await progress(h, jobId, 1, { a: { constructor: "x" } }),
        "body.fields.progress.a.constructor",
        'the key "constructor" is not allowed',
      );
      const inData = await h.call("POST", `/v1/jobs/${jobId}/events`, {
        token: h.operator,
        json: { event: "completed", data: { x: { constructor: { name: "Set" } } } },
      });
      expectRefused(inData, "body.data.x.constructor", 'the key "constructor" is not allowed');
      expectRefused(await progress(h, jobId, 1, { a: { "": 1 } }), "body.fields.progress.a", "an empty key cannot be stored");
      expect(await fingerprint(h, jobId)).toEqual(before);

      const kept = { prototype: { kept: true }, toString: "text", hasOwnProperty: 1 };
      const ok = await progress(h, jobId, 1, kept);
      expect(ok.status, ok.text).toBe(200);
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.progress).toEqual(kept);
      expect((await cancel(h, jobId, 2)).status).toBe(200);
    });

    it("a job with max-size progress, prompt and event data of max depth is readable and transitionable afterwards (cancel works)", async () => {
      const h = await harness();
      const prompt = "é".repeat(FREE_FORM_MAX_BYTES.prompt / 2);
      const jobId = await runningJob(h, { prompt });
      const value = maxFreeForm(FREE_FORM_MAX_BYTES.progress);
      const data = maxFreeForm(FREE_FORM_MAX_BYTES.eventData);

      const progressed = await progress(h, jobId, 1, value);
      expect(progressed.status, progressed.text).toBe(200);
      const published = await h.call("POST", `/v1/jobs/${jobId}/events`, { token: h.operator, json: { event: "progress", data } });
      expect(published.status, published.text).toBe(200);

      const read = await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator });
      expect(read.body).toMatchObject({ prompt, progress: value, status: "running", transition_seq: 3 });
      const log = await h.call("GET", `/v1/jobs/${jobId}/events`, { token: h.operator });
      expect(log.body.items.find((e: { event: string }) => e.event === "publish_event").data.data).toEqual(data);

      const cancelled = await cancel(h, jobId, 3);
      expect(cancelled.status, cancelled.text).toBe(200);
      expect(cancelled.body).toMatchObject({ status: "cancelled", progress: value });
      // The cancel's notification was delivered and settled: nothing is left owed.
      const sweep = await h.call("POST", "/v1/recovery-sweeps", { token: h.operator, json: {} });
      expect(sweep.status, sweep.text).toBe(200);
      expect((await h.call("GET", `/v1/jobs/${jobId}`, { token: h.operator })).body.pending_notification).toBeUndefined();

      // One byte more of each is refused.
      const other = await runningJob(h);
      expectRefused(
        await progress(h, other, 1, { ...value, z: "" }),
        "body.fields.progress",
        `more than ${FREE_FORM_MAX_BYTES.progress} bytes of JSON`,
      );
      const longPrompt = await h.call("POST", "/v1/jobs", { token: h.operator, json: { prompt: `${prompt}x`, agent: "codex" } });
      expectRefused(longPrompt, "body.prompt", `more than ${FREE_FORM_MAX_BYTES.prompt} bytes of UTF-8`);
    });

    it("a side-effect reference over 1 KiB of UTF-8 is 400 input.sideEffect, and nothing is finalized", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      await h.call("POST", `/v1/jobs/${jobId}/dispatches`, { token: h.operator, json: { ...CANDIDATE_DISPATCH } });
      const staged = await h.call("PUT", `/v1/jobs/${jobId}/attempts/1/report`, {
        token: h.operator,
        body: "# report\n",
        headers: { "content-type": "text/markdown" },
      });
      expect(staged.status, staged.text).toBe(201);
      // 600 characters, 1,200 bytes: the old limit counted characters.
      const res = await h.call("POST", `/v1/jobs/${jobId}/attempts/1/finalize`, {
        token: h.operator,
        json: { side_effects: [{ kind: "commit", reference: "é".repeat(600) }] },
      });
      expectRefused(
        res,
        "body.side_effects.0.reference",
        `more than ${FREE_FORM_MAX_BYTES.sideEffectReference} bytes of UTF-8`,
        "input.sideEffect",
      );
      const verification = await h.call("GET", `/v1/jobs/${jobId}/attempts/1/verification`, { token: h.operator });
      expect(verification.body).toMatchObject({ ok: false, manifest: null });
    });

    it("a scenario over 256 KiB or deeper than 16 levels is 400 before the gate, whatever the flags; a bounded one still reaches it", async () => {
      for (const env of [{}, { MAM_AUTO_COMPLETE: "1" }]) {
        const h = await harness({ env });
        const jobId = await runningJob(h, { auto_complete: true, agent: "claude-code" });
        const before = await fingerprint(h, jobId);
        const evaluate = (scenario: unknown) => h.call("POST", `/v1/jobs/${jobId}/evaluations`, { token: h.operator, json: { scenario } });
        const scenario = candidateScenario(jobId);
        const deep = await evaluate({ ...scenario, extra: nestedArrays(FREE_FORM_MAX_DEPTH) });
        expectRefused(deep, "body.scenario", `nested deeper than ${FREE_FORM_MAX_DEPTH} levels`);
        const large = await evaluate({ ...scenario, extra: "x".repeat(FREE_FORM_MAX_BYTES.scenario) });
        expectRefused(large, "body.scenario", `more than ${FREE_FORM_MAX_BYTES.scenario} bytes of JSON`);
        expect(await fingerprint(h, jobId)).toEqual(before);
        // Only size and depth: what the gate reads, it reads itself (a hold is a 200).
        const odd = await evaluate({ ...scenario, n: 1e-300, "": 1, extra: nestedArrays(FREE_FORM_MAX_DEPTH - 1) });
        expect(odd.status, odd.text).toBe(200);
        expect(odd.body.committed).toBe(false);
      }
    });

    it("GET events pages by bytes: each page within the budget, all events reachable through next_cursor; a bad cursor is 400 naming query.cursor", async () => {
      const h = await harness();
      const jobId = await runningJob(h);
      const data = maxFreeForm(FREE_FORM_MAX_BYTES.eventData);
      const total = 80;
      for (let i = 0; i < total; i++) {
        await h.deps.jobs.appendEvent({
          job_id: jobId,
          id: `e-${String(i).padStart(3, "0")}`,
          at: new Date(Date.parse("2026-11-20T10:20:00.000Z") + i).toISOString(),
          event: "progress",
          data: { i, data },
        });
      }
      const seen: string[] = [];
      const answers: number[] = [];
      let cursor: string | undefined;
      do {
        const res = await h.call("GET", `/v1/jobs/${jobId}/events${cursor === undefined ? "" : `?cursor=${encodeURIComponent(cursor)}`}`, {
          token: h.operator,
        });
        expect(res.status, res.text).toBe(200);
        expect(Buffer.byteLength(JSON.stringify(res.body.items))).toBeLessThanOrEqual(EVENT_PAGE_MAX_BYTES + res.body.items.length);
        answers.push(Buffer.byteLength(res.text));
        seen.push(...res.body.items.map((e: { id: string }) => e.id));
        cursor = res.body.next_cursor;
      } while (cursor !== undefined);
      console.log(
        `GET events: ${total} events of ~${FREE_FORM_MAX_BYTES.eventData} bytes of data in answers of ${answers.join(", ")} bytes`,
      );
      expect(answers.length).toBeGreaterThanOrEqual(2);
      for (const bytes of answers) expect(bytes).toBeLessThanOrEqual(EVENT_PAGE_MAX_BYTES + 4096);
      const expected = Array.from({ length: total }, (_, i) => `e-${String(i).padStart(3, "0")}`);
      // The claim's publish made log lines of its own, older than these.
      expect(seen.slice(-total)).toEqual(expected);

      const counted = await h.call("GET", `/v1/jobs/${jobId}/events?limit=2`, { token: h.operator });
      expect(counted.body.items).toHaveLength(2);
      expect(counted.body.next_cursor).toEqual(expect.any(String));

      for (const bad of ["not-a-cursor", Buffer.from('{"e":1}').toString("base64url")]) {
        const res = await h.call("GET", `/v1/jobs/${jobId}/events?cursor=${bad}`, { token: h.operator });
        expectRefused(res, "query.cursor", "not a cursor of this listing");
      }
    });
  });
}

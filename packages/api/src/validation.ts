import { type FieldIssue, MamError, zodIssues } from "@mam/core";
import { ZodError } from "zod";

/** Where a validated value came from, as Hono names it, and as a problem names its fields. */
const WHERE = { json: "body", query: "query", param: "path", header: "header" } as const;
type Target = keyof typeof WHERE;

/**
 * A validation failure as the problem every route answers with: 400, each bad field
 * named from the request (`body.fields.progress`, `query.limit`, `path.job_id`).
 * Problems that lie wholly inside `side_effects` are side-effect errors
 * (`input.sideEffect`, the code the CLI gives them too); a bad job id in the path is
 * `input.jobId`.
 */
export function invalidInput(error: ZodError, target: string): MamError {
  const where = target in WHERE ? WHERE[target as Target] : target;
  const issues = fieldIssues(error, where);
  const sideEffect = error.issues.every((i) => {
    const at = i.path.indexOf("side_effects");
    return at >= 0 && i.path.length > at + 1;
  });
  const code = sideEffect
    ? "input.sideEffect"
    : where === "path" && error.issues.some((i) => i.path[0] === "job_id")
      ? "input.jobId"
      : "input.invalid";
  return new MamError(code, `invalid ${where}: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`, { issues });
}

/**
 * The app's `defaultHook`: every validator of every route (path, query, headers,
 * body) ends here, and a failure is thrown as its problem (`app.onError` answers it).
 */
export function validationHook(result: { success: true } | { success: false; error: ZodError; target: string }): void {
  if (!result.success) throw invalidInput(result.error, result.target);
}

/**
 * core's `zodIssues`, except that an unknown field is named by its own path
 * (`body.extra`) rather than by the object that holds it.
 */
function fieldIssues(err: ZodError, where: string): FieldIssue[] {
  return err.issues.flatMap((i) => {
    if (i.code !== "unrecognized_keys") return zodIssues(new ZodError([i]), where);
    const at = [where, ...i.path.map(String)].join(".");
    return i.keys.map((k) => ({ path: `${at}.${k}`, message: "unknown field" }));
  });
}

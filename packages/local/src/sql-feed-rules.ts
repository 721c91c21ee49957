import {
  type ChangeNote,
  FEED_BEFORE_FIELDS,
  FEED_RULES,
  type FeedPredicate,
  type FeedRef,
  type FeedRule,
  type FeedValue,
  feedActorOf,
} from "@mam/core";
import { checkStatement, SQL_LIMITS, type SqlStatement, type SqlValue } from "./sql-driver.ts";

/**
 * Core's `FEED_RULES` compiled to SQLite-dialect SQL, for a store on the SQL driver
 * seam whose engine runs no JavaScript between the statements of a batch (D1): the
 * write's batch is its conditional `UPDATE jobs … SET feed_before = <capture>,
 * write_token = ?` and then these statements, one per rule, each inserting its row
 * only if the write that stamped the token committed and the rule's predicate holds
 * of the row it left. The tables they read and write:
 *
 *   jobs    (job_id TEXT PRIMARY KEY, doc TEXT, feed_before TEXT, write_token TEXT, …)
 *   changes (cursor INTEGER PRIMARY KEY AUTOINCREMENT, job_id, at, row)
 *
 * `jobs.doc` is the record after the write (JSON); `jobs.feed_before` the record
 * before it as the feed reads it: a JSON object of `FEED_BEFORE_FIELDS`, `null` for a
 * field the record did not have (`FEED_BEFORE_CAPTURE` computes it in the UPDATE); a
 * key the capture left out reads as the record after the write's (so a bookkeeping
 * write may capture `pending_notification` alone); and `feed_before IS NULL` says the
 * write created the record. The rows are the ones `changeRowsOf` makes of the same
 * write, in the same order (the cursor's AUTOINCREMENT is insert order, and the
 * statements run in rule order), and `changes.row` parses to the draft without its
 * `job_id`: absent keys left out, numbers numbers, strings strings. The property tests
 * hold both to it (tests/contract/sql-feed-rules.test.ts, tests/d1/).
 */

/**
 * The `feed_before` a write captures, as the right side of its UPDATE's assignment
 * (which reads the old row): `FEED_BEFORE_FIELDS` of the old `doc`, `null` where
 * absent.
 */
export const FEED_BEFORE_CAPTURE = `json_object(${FEED_BEFORE_FIELDS.map((field) => `'${field}', json_extract(doc, '$.${field}')`).join(", ")})`;

/** Where a bound parameter's value comes from, so a rule's SQL is compiled once and bound per write. */
type ParamSource =
  | { readonly from: "job" }
  | { readonly from: "token" }
  | { readonly from: "actor" }
  | { readonly from: "note"; readonly path: readonly string[] };

interface CompiledRule {
  readonly kind: FeedRule["kind"];
  readonly sql: string;
  readonly params: readonly ParamSource[];
}

const KEY = /^[a-z_][a-z0-9_]*$/;

function jsonPath(path: readonly string[]): string {
  for (const key of path)
    if (!KEY.test(key)) throw new Error(`feed rules: ${JSON.stringify(key)} is not a field name the SQL compiler takes`);
  return `'$.${path.join(".")}'`;
}

function sqlLiteral(value: string | number): string {
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new Error(`feed rules: ${value} is not a number SQL can hold`);
    return String(value);
  }
  return `'${value.replaceAll("'", "''")}'`;
}

/** Compiles values and predicates, collecting the parameters they bind in the order they appear in the text. */
class RuleCompiler {
  readonly params: ParamSource[] = [];

  ref(ref: FeedRef): string {
    switch (ref.side) {
      case "after":
        return `json_extract(jobs.doc, ${jsonPath(ref.path)})`;
      case "before": {
        // Captured (its key in feed_before, null meaning absent), else left alone by the write.
        const [field] = ref.path;
        return `(CASE WHEN json_type(jobs.feed_before, ${jsonPath([field])}) IS NULL THEN json_extract(jobs.doc, ${jsonPath(ref.path)}) ELSE json_extract(jobs.feed_before, ${jsonPath(ref.path)}) END)`;
      }
      case "note":
        this.params.push({ from: "note", path: ref.path });
        return "?";
      default:
        return ref satisfies never;
    }
  }

  value(value: FeedValue): string {
    switch (value.op) {
      case "ref":
        return this.ref(value);
      case "literal":
        return sqlLiteral(value.value);
      case "coalesce":
        return `coalesce(${this.value(value.values[0])}, ${this.value(value.values[1])})`;
      case "case": {
        const cases = value.cases.map((c) => `WHEN ${this.predicate(c.when)} THEN ${this.value(c.value)}`).join(" ");
        return `(CASE ${cases} ELSE ${this.value(value.else)} END)`;
      }
      case "nothing":
        return "NULL";
      default:
        return value satisfies never;
    }
  }

  /** Always 0 or 1, never NULL: `IS`/`IS NOT` for (in)equality, presence checked before `>`. */
  predicate(predicate: FeedPredicate): string {
    switch (predicate.op) {
      case "created":
        return "(jobs.feed_before IS NULL)";
      case "all":
        return predicate.of.length === 0 ? "1" : `(${predicate.of.map((p) => this.predicate(p)).join(" AND ")})`;
      case "any":
        return predicate.of.length === 0 ? "0" : `(${predicate.of.map((p) => this.predicate(p)).join(" OR ")})`;
      case "not":
        return `(NOT ${this.predicate(predicate.of)})`;
      case "present":
        return `(${this.value(predicate.value)} IS NOT NULL)`;
      case "absent":
        return `(${this.value(predicate.value)} IS NULL)`;
      case "eq":
        return `(${this.value(predicate.left)} IS ${this.value(predicate.right)})`;
      case "ne":
        return `(${this.value(predicate.left)} IS NOT ${this.value(predicate.right)})`;
      case "gt": {
        const left = this.value(predicate.left);
        const right = this.value(predicate.right);
        return `(${left} IS NOT NULL AND ${right} IS NOT NULL AND ${left} > ${right})`;
      }
      default:
        return predicate satisfies never;
    }
  }
}

/**
 * The row's JSON. `json_object` cannot leave a key out, so the object is merge-patched
 * onto `{}` (RFC 7396, `json_patch`): a key whose value is NULL, at any depth, is
 * dropped, and `data` with no key present stays `{}`.
 */
function compileRule(rule: FeedRule): CompiledRule {
  const compiler = new RuleCompiler();
  const members = [`'kind', ${sqlLiteral(rule.kind)}`, "'actor', json(?)"];
  compiler.params.push({ from: "actor" });
  if (rule.intent_id !== undefined) members.push(`'intent_id', ${compiler.value(rule.intent_id)}`);
  if (rule.data !== undefined) {
    const data = Object.entries(rule.data).map(([key, value]) => `${sqlLiteral(key)}, ${compiler.value(value)}`);
    members.push(`'data', json_object(${data.join(", ")})`);
  }
  const row = `json_patch('{}', json_object(${members.join(", ")}))`;
  compiler.params.push({ from: "job" }, { from: "token" });
  const where = compiler.predicate(rule.when);
  return {
    kind: rule.kind,
    sql:
      `SELECT jobs.job_id AS job_id, strftime('%Y-%m-%dT%H:%M:%fZ', 'now') AS at, ${row} AS row ` +
      // CASE, not AND: the rule's JSON is read only of the row this write stamped (SQLite
      // may evaluate AND's terms in any order, and another row's doc may be one its JSON
      // functions refuse, a legacy record past their depth).
      `FROM jobs WHERE jobs.job_id = ? AND CASE WHEN jobs.write_token = ? THEN ${where} ELSE 0 END`,
    params: compiler.params,
  };
}

const COMPILED: readonly CompiledRule[] = FEED_RULES.map(compileRule);

/**
 * What a write can be, by what it bumps (known before it runs): a create, a transition
 * (`transition_seq`), an evidence write (`evidence_seq` alone) or bookkeeping on the
 * intent (neither). The rules are exclusive by class (each names `created`,
 * `transition_seq` moved, or `evidence_seq` moved alone, or neither), so a write's
 * batch needs only its class's statements: the others' predicates cannot hold.
 */
export type FeedWriteClass = "create" | "transition" | "evidence" | "intent";

const CLASS_KINDS: Readonly<Record<FeedWriteClass, readonly string[]>> = {
  create: ["job.registered"],
  transition: ["report.finalized", "job.transitioned", "intent.superseded"],
  evidence: ["report.finalized", "dispatch.recorded", "report.upload_declared", "report.staged"],
  intent: ["intent.published", "intent.superseded", "intent.quarantined", "intent.failed", "intent.released"],
};

/**
 * Rules as the statements a batch runs: each rule's SELECT (`rule.sql`), numbered in
 * rule order, under one `INSERT … SELECT … FROM (… UNION ALL …) ORDER BY n`, so a
 * write's rows cost one statement however many rules its class has (a statement
 * stepped is most of a rule's cost), split only where the seam's parameter limit
 * or D1's compound-SELECT limit (`SQL_LIMITS.compoundSelectTerms`) would be passed. The order of the rows is the rules' order (`ORDER BY n`), which the
 * cursor's AUTOINCREMENT keeps.
 */
function mergeRules(rules: readonly CompiledRule[]): CompiledRule[] {
  const merged: CompiledRule[] = [];
  let group: CompiledRule[] = [];
  let params = 0;
  const flush = () => {
    if (group.length === 0) return;
    const selects = group.map((rule, n) => rule.sql.replace(/^SELECT /, `SELECT ${n} AS n, `));
    merged.push({
      kind: group[0]!.kind,
      sql: `INSERT INTO changes (job_id, at, row) SELECT job_id, at, row FROM (${selects.join(" UNION ALL ")}) ORDER BY n`,
      params: group.flatMap((rule) => rule.params),
    });
    group = [];
    params = 0;
  };
  for (const rule of rules) {
    if (params + rule.params.length > SQL_LIMITS.paramsPerStatement || group.length === SQL_LIMITS.compoundSelectTerms) flush();
    group.push(rule);
    params += rule.params.length;
  }
  flush();
  return merged;
}

const MERGED_ALL = mergeRules(COMPILED);
const COMPILED_BY_CLASS = Object.fromEntries(
  Object.entries(CLASS_KINDS).map(([writeClass, kinds]) => [writeClass, mergeRules(COMPILED.filter((rule) => kinds.includes(rule.kind)))]),
) as unknown as Record<FeedWriteClass, readonly CompiledRule[]>;

function noteParam(note: ChangeNote, path: readonly string[]): SqlValue {
  let at: unknown = note;
  for (const key of path) {
    if (at === null || typeof at !== "object") return null;
    at = (at as Record<string, unknown>)[key];
  }
  if (at === undefined || at === null) return null;
  if (typeof at === "string" || typeof at === "number") return at;
  // Only presence is asked of an object (`present(note.declared)`): its JSON is present.
  return JSON.stringify(at);
}

/**
 * The statements, in rule order, that insert the feed rows of the write that stamped
 * `writeToken` on job `jobId`'s row: one `INSERT INTO changes … SELECT … FROM jobs
 * WHERE jobs.job_id = ? AND jobs.write_token = ? AND <the rule>` per rule of
 * `FEED_RULES`, to run in the write's own batch after its UPDATE. A statement whose
 * token does not match (the write did not commit, or another write stamped the row
 * since) inserts nothing. The note's facts and actor are bound parameters; each
 * statement is within the seam's limits (`checkStatement`, which throws `MamError`
 * `store.unsupported` otherwise). Pure: no statement is run here.
 */
export function feedRowStatements(
  jobId: string,
  writeToken: string,
  note: ChangeNote | undefined,
  writeClass?: FeedWriteClass,
): SqlStatement[] {
  const actor = JSON.stringify(feedActorOf(note));
  const facts = note ?? {};
  const rules = writeClass === undefined ? MERGED_ALL : COMPILED_BY_CLASS[writeClass];
  return rules.map((rule, index) => {
    const params = rule.params.map((source): SqlValue => {
      switch (source.from) {
        case "job":
          return jobId;
        case "token":
          return writeToken;
        case "actor":
          return actor;
        case "note":
          return noteParam(facts, source.path);
        default:
          return source satisfies never;
      }
    });
    const statement = { sql: rule.sql, params };
    checkStatement("feed rules", statement, index);
    return statement;
  });
}

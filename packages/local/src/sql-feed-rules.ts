import {
  beforeFieldsOf,
  type ChangeNote,
  type FeedPins,
  type FeedPredicate,
  type FeedRef,
  type FeedRule,
  type FeedValue,
  type FeedWriteShape,
  feedActorOf,
  feedRulesOf,
  feedShapeKey,
  KeptByKey,
  SERVICE_ACTOR,
} from "@mam/core";
import { SQL_LIMITS, type SqlStatement, type SqlValue } from "./sql-driver.ts";

/**
 * Core's `FEED_RULES` compiled to SQLite-dialect SQL, for a store on the SQL driver
 * seam whose engine runs no JavaScript between the statements of a batch (D1): the
 * write's batch is its conditional `UPDATE jobs … SET feed_before = <capture>,
 * write_token = ?` and then these statements, each inserting its rows only if the
 * write that stamped the token committed and the rule's predicate holds of the row it
 * left. The tables they read and write:
 *
 *   jobs    (job_id TEXT PRIMARY KEY, status TEXT, transition_seq INTEGER, doc TEXT, feed_before TEXT, write_token TEXT, …)
 *   changes (cursor INTEGER PRIMARY KEY AUTOINCREMENT, job_id, at, row)
 *
 * What is compiled is the rules of the write's shape (core's `feedRulesOf`: a create,
 * a transition, an evidence write or bookkeeping, known from what the write bumps,
 * and the fields it leaves alone), folded by what the shape decides, so a
 * transition's statement neither re-derives in SQL that `transition_seq` moved nor
 * compares an owed intent the write did not touch. Compiled once per shape. `jobs.doc`
 * is the record after the write (JSON); `jobs.feed_before` what those rules read of
 * the record before it: a JSON object of the shape's before-fields
 * (`feedBeforeCapture`, computed in the UPDATE), `null` for a field the record did not have; `feed_before IS NULL` when the
 * write created the record. The rows are the ones `changeRowsOf` makes of the same
 * write, in the same order (the cursor's AUTOINCREMENT is insert order, and the
 * statements run in rule order), and `changes.row` parses to the draft without its
 * `job_id`: absent keys left out, numbers numbers, strings strings. The property tests
 * hold both to it, each generated write compiled by its shape
 * (tests/contract/sql-feed-rules.test.ts, tests/d1/).
 */

/**
 * The `feed_before` a write of `shape` captures, as the right side of its UPDATE's
 * assignment (which reads the old row): the fields of the old `doc` that the shape's
 * rules read (`beforeFieldsOf(feedRulesOf(shape))`), `null` where absent; `undefined`
 * when they read nothing of it (the write need not capture anything).
 */
export function feedBeforeCapture(shape: FeedWriteShape): string | undefined {
  return compiledFor(shape).capture;
}

function captureOf(fields: readonly string[]): string | undefined {
  if (fields.length === 0) return undefined;
  return `json_object(${fields.map((field) => `${sqlLiteral(field)}, json_extract(doc, ${jsonPath([field])})`).join(", ")})`;
}

/**
 * Top-level fields of the record after the write that `jobs` mirrors in columns of
 * the same type, NOT NULL (the store writes both in one statement), read there rather
 * than out of the doc's JSON.
 */
const MIRRORED: Readonly<Record<string, string>> = { status: "jobs.status", transition_seq: "jobs.transition_seq" };

/** Where a bound parameter's value comes from, so a rule's SQL is compiled once and bound per write. */
type ParamSource =
  | { readonly from: "job" }
  | { readonly from: "token" }
  | { readonly from: "actor" }
  | { readonly from: "note"; readonly path: readonly string[] }
  | { readonly from: "pinned"; readonly fact: keyof FeedPins };

/** One rule compiled: the row it inserts and when, each an SQL expression over `jobs` with the parameters it binds. */
interface CompiledRule {
  readonly kind: FeedRule["kind"];
  readonly row: CompiledPart;
  readonly when: CompiledPart;
}

interface CompiledPart {
  readonly sql: string;
  readonly params: readonly ParamSource[];
}

/** A shape's rules as one statement: its SQL and where each parameter comes from. */
interface CompiledStatement {
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
        return (ref.path.length === 1 ? MIRRORED[ref.path[0]] : undefined) ?? `json_extract(jobs.doc, ${jsonPath(ref.path)})`;
      case "before":
        // The class's capture holds every field its rules read (null meaning absent).
        return `json_extract(jobs.feed_before, ${jsonPath(ref.path)})`;
      case "note":
        this.params.push({ from: "note", path: ref.path });
        return "?";
      case "pinned":
        // What the write's condition pins of the old row, bound from the write itself.
        this.params.push({ from: "pinned", fact: ref.path[0] });
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

  /** Always 0 or 1, never NULL: `IS`/`IS NOT` for (in)equality, `>` coalesced to 0 where a side is NULL. */
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
        // Each side written once, so a side that binds a parameter binds it once: NULL
        // (a side absent) is false.
        return `coalesce(${this.value(predicate.left)} > ${this.value(predicate.right)}, 0)`;
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
  const rowCompiler = new RuleCompiler();
  const members = [`'kind', ${sqlLiteral(rule.kind)}`, "'actor', json(?)"];
  rowCompiler.params.push({ from: "actor" });
  // A key whose value is absent whatever the write (folded to `nothing`) is left out here.
  const present = (value: FeedValue | undefined): value is FeedValue => value !== undefined && value.op !== "nothing";
  let absentable = false;
  if (present(rule.intent_id)) {
    members.push(`'intent_id', ${rowCompiler.value(rule.intent_id)}`);
    absentable ||= mayBeAbsent(rule.intent_id);
  }
  if (rule.data !== undefined) {
    const data = Object.entries(rule.data).filter((entry): entry is [string, FeedValue] => present(entry[1]));
    members.push(`'data', json_object(${data.map(([key, value]) => `${sqlLiteral(key)}, ${rowCompiler.value(value)}`).join(", ")})`);
    absentable ||= data.some(([, value]) => mayBeAbsent(value));
  }
  const whenCompiler = new RuleCompiler();
  const when = whenCompiler.predicate(rule.when);
  const row = `json_object(${members.join(", ")})`;
  return {
    kind: rule.kind,
    // Merge-patched onto {} only where a key may be NULL, which the patch drops.
    row: { sql: absentable ? `json_patch('{}', ${row})` : row, params: rowCompiler.params },
    when: { sql: when, params: whenCompiler.params },
  };
}

/** Whether a value may read absent (SQL NULL): a literal or a mirrored column (NOT NULL in the layout) never does. */
function mayBeAbsent(value: FeedValue): boolean {
  switch (value.op) {
    case "literal":
      return false;
    case "nothing":
      return true;
    case "ref":
      // A pinned value is there whenever the write commits (its condition named it).
      if (value.side === "pinned") return false;
      return !(value.side === "after" && value.path.length === 1 && MIRRORED[value.path[0]] !== undefined);
    case "coalesce":
      return mayBeAbsent(value.values[0]) && mayBeAbsent(value.values[1]);
    case "case":
      return value.cases.some((c) => mayBeAbsent(c.value)) || mayBeAbsent(value.else);
    default:
      return value satisfies never;
  }
}

/**
 * A shape's rules as the statements a batch runs: as few as the seam's parameter
 * limit allows (one, for every class today), each reading the job's row once. Rules
 * of one statement are numbered by `json_each` of an array (not a compound SELECT,
 * which D1 bounds at five terms: `SQL_LIMITS.compoundSelectTerms`), each joined row
 * taking its rule's branch of a `CASE`:
 *
 *   INSERT INTO changes (job_id, at, row)
 *   SELECT jobs.job_id, <now>, CASE rule.key WHEN 0 THEN <row 0> WHEN 1 THEN <row 1> … END
 *   FROM jobs JOIN json_each('[0,1,…]') AS rule
 *   WHERE jobs.job_id = ? AND CASE WHEN jobs.write_token = ? THEN CASE rule.key WHEN 0 THEN <when 0> … END ELSE 0 END
 *   ORDER BY rule.key
 *
 * The rows are inserted in the rules' order (`ORDER BY rule.key`), which the
 * cursor's AUTOINCREMENT keeps. `CASE`, not `AND`, guards the token: the rules' JSON is
 * read only of the row this write stamped (SQLite may evaluate AND's terms in any
 * order, and another row's doc may be one its JSON functions refuse, a legacy record
 * past their depth).
 */
function mergeRules(rules: readonly CompiledRule[]): CompiledStatement[] {
  const merged: CompiledStatement[] = [];
  let group: CompiledRule[] = [];
  let params = 0;
  const paramsOf = (rule: CompiledRule) => rule.row.params.length + rule.when.params.length;
  const flush = () => {
    if (group.length === 0) return;
    const only = group.length === 1 ? group[0] : undefined;
    const row = only?.row.sql ?? `CASE rule.key ${group.map((r, n) => `WHEN ${n} THEN ${r.row.sql}`).join(" ")} END`;
    const when = only?.when.sql ?? `CASE rule.key ${group.map((r, n) => `WHEN ${n} THEN ${r.when.sql}`).join(" ")} ELSE 0 END`;
    const from = only === undefined ? `jobs JOIN json_each('[${group.map((_, n) => n).join(",")}]') AS rule` : "jobs";
    merged.push({
      sql:
        `INSERT INTO changes (job_id, at, row) SELECT jobs.job_id, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ${row} ` +
        `FROM ${from} WHERE jobs.job_id = ? AND CASE WHEN jobs.write_token = ? THEN ${when} ELSE 0 END` +
        (only === undefined ? " ORDER BY rule.key" : ""),
      params: [...group.flatMap((r) => r.row.params), { from: "job" }, { from: "token" }, ...group.flatMap((r) => r.when.params)],
    });
    group = [];
    params = 2;
  };
  params = 2;
  for (const rule of rules) {
    if (group.length > 0 && params + paramsOf(rule) > SQL_LIMITS.paramsPerStatement) flush();
    group.push(rule);
    params += paramsOf(rule);
  }
  flush();
  return merged;
}

/** A shape's rules (core's `feedRulesOf`) compiled and merged, and the capture they read. */
interface CompiledShape {
  readonly statements: readonly CompiledStatement[];
  readonly capture: string | undefined;
}

const COMPILED_SHAPES = new KeptByKey<string, CompiledShape>();

function compiledFor(shape: FeedWriteShape): CompiledShape {
  return COMPILED_SHAPES.get(feedShapeKey(shape), () => {
    const rules = feedRulesOf(shape);
    return { statements: mergeRules(rules.map(compileRule)), capture: captureOf(beforeFieldsOf(rules)) };
  });
}

/** The service's actor as JSON, the actor of most writes (the relay's settle among them). */
const SERVICE_ACTOR_JSON = JSON.stringify(SERVICE_ACTOR);

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
 * `writeToken` on job `jobId`'s row, a write of `shape` that captured
 * `feedBeforeCapture(shape)`: `INSERT INTO changes … SELECT … FROM jobs WHERE
 * jobs.job_id = ? AND jobs.write_token = ? AND <the rule>` for the shape's rules (a
 * few merged into one statement), to run in the write's own batch after its UPDATE;
 * `pinned`, what the write's conditions pin of the old row (core's `feedPinsOf`), which
 * the shape's rules may read instead of a capture. A statement whose
 * token does not match (the write did not commit, or another write stamped the row
 * since) inserts nothing. The note's facts and actor are bound parameters; the
 * driver holds each statement to the seam's limits (`checkStatement`) when it runs
 * the batch (tests/contract/sql-feed-rules.suite.ts holds every class's statement to them). Pure: no statement is run here.
 */
export function feedRowStatements(
  jobId: string,
  writeToken: string,
  note: ChangeNote | undefined,
  shape: FeedWriteShape,
  pinned: FeedPins = {},
): SqlStatement[] {
  const actorOf = feedActorOf(note);
  const actor = actorOf === SERVICE_ACTOR ? SERVICE_ACTOR_JSON : JSON.stringify(actorOf);
  const facts = note ?? {};
  const rules = compiledFor(shape).statements;
  return rules.map((rule) => {
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
        case "pinned": {
          const value = pinned[source.fact];
          // A shape that pins a value is a write that names it (feedPinsOf): core's bug otherwise.
          if (value === undefined) throw new Error(`feed rules: a write of this shape pins ${source.fact}, and none was given`);
          return value;
        }
        default:
          return source satisfies never;
      }
    });
    return { sql: rule.sql, params };
  });
}

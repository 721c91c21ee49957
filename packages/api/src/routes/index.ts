import type { Access } from "../access.ts";
import * as events from "./events.ts";
import * as feed from "./feed.ts";
import * as jobs from "./jobs.ts";
import * as meta from "./meta.ts";
import * as operations from "./operations.ts";
import * as reports from "./reports.ts";

/** A route module's declarations: its exports that are routes (`defineRoute`), not its registration function. */
type Declared<M> = Extract<M[keyof M], { readonly "x-mam-access": Access; readonly method: string; readonly path: string }>;
type Route =
  | Declared<typeof jobs>
  | Declared<typeof reports>
  | Declared<typeof events>
  | Declared<typeof feed>
  | Declared<typeof operations>
  | Declared<typeof meta>;

const isRoute = (x: unknown): x is Route => typeof x === "object" && x !== null && "x-mam-access" in x;

/**
 * Every route the app declares, found in the route modules' exports: a route is
 * added by its declaration and its handler, nothing else. What the tests hold the
 * served document and the access rules against.
 */
export const ROUTES: readonly Route[] = [jobs, reports, events, feed, operations, meta].flatMap((m) => Object.values(m).filter(isRoute));

type KeyOf<R> = R extends { method: infer M extends string; path: infer P extends string } ? `${Uppercase<M>} ${P}` : never;

/** `METHOD path`, in OpenAPI path syntax: `GET /v1/jobs/{job_id}`. */
export type RouteKey = KeyOf<Route>;
export type OperationId = Route["operationId"];
export type Method = Route["method"];

/** Who may call each route, as its declaration says (`x-mam-access`). */
export const ROUTE_PERMISSIONS = Object.fromEntries(
  ROUTES.map((r) => [`${r.method.toUpperCase()} ${r.path}`, r["x-mam-access"]]),
) as Readonly<Record<RouteKey, Access>>;

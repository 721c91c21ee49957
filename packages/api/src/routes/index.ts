import type { Access } from "../access.ts";
import { dryRunGateRoute, evaluateJobRoute, listEventsRoute, publishEventRoute } from "./events.ts";
import { listChangesRoute, streamChangesRoute } from "./feed.ts";
import { postHookEventRoute } from "./hooks.ts";
import {
  countJobsRoute,
  getDispatchRoute,
  getJobRoute,
  listJobsRoute,
  recordDispatchRoute,
  registerJobRoute,
  transitionJobRoute,
} from "./jobs.ts";
import { getAssetRoute, getDashboardRoute, getDocsAssetRoute, getDocsRoute, getHealthRoute, getOpenApiRoute } from "./meta.ts";
import { recordObservationRoute } from "./observations.ts";
import { releaseNotificationRoute, runRecoverySweepRoute, sendNotificationRoute } from "./operations.ts";
import { finalizeReportRoute, readReportRoute, requestUploadRoute, stageReportRoute, verifyReportRoute } from "./reports.ts";
import { getTokenRoute } from "./token.ts";

/**
 * Every route the app serves, each its declaration and its handler, in the order
 * they are registered (and so matched, and listed in the document). A route is
 * served when it is listed here; a test holds the route modules' exports to this list.
 */
export const ROUTES = [
  registerJobRoute,
  listJobsRoute,
  countJobsRoute,
  getJobRoute,
  transitionJobRoute,
  recordDispatchRoute,
  getDispatchRoute,
  stageReportRoute,
  readReportRoute,
  requestUploadRoute,
  finalizeReportRoute,
  verifyReportRoute,
  recordObservationRoute,
  postHookEventRoute,
  evaluateJobRoute,
  dryRunGateRoute,
  publishEventRoute,
  listEventsRoute,
  listChangesRoute,
  streamChangesRoute,
  runRecoverySweepRoute,
  releaseNotificationRoute,
  sendNotificationRoute,
  getOpenApiRoute,
  getDocsRoute,
  getDocsAssetRoute,
  getAssetRoute,
  getTokenRoute,
  getHealthRoute,
  getDashboardRoute,
] as const;

type Route = (typeof ROUTES)[number]["route"];
type KeyOf<R> = R extends { method: infer M extends string; path: infer P extends string } ? `${Uppercase<M>} ${P}` : never;

/** `METHOD path`, in OpenAPI path syntax: `GET /v1/jobs/{job_id}`. */
export type RouteKey = KeyOf<Route>;
export type OperationId = Route["operationId"];
export type Method = Route["method"];

/** Who may call each route, as its declaration says (`x-mam-access`). */
export const ROUTE_PERMISSIONS = Object.fromEntries(
  ROUTES.map(({ route }) => [`${route.method.toUpperCase()} ${route.path}`, route["x-mam-access"]]),
) as Readonly<Record<RouteKey, Access>>;

import type { Access } from "../access.ts";
import { evaluateJob, listEvents, publishEvent } from "./events.ts";
import { getJob, listJobs, recordDispatch, registerJob, transitionJob } from "./jobs.ts";
import { getAsset, getDashboard, getDocs, getDocsAsset, getHealth, getOpenApi } from "./meta.ts";
import { releaseNotification, runRecoverySweep } from "./operations.ts";
import { finalizeReport, stageReport, verifyReport } from "./reports.ts";

/** Every route the app declares (each module registers its own); what the tests and the document are checked against. */
export const ROUTES = [
  registerJob,
  listJobs,
  getJob,
  transitionJob,
  recordDispatch,
  stageReport,
  finalizeReport,
  verifyReport,
  evaluateJob,
  publishEvent,
  listEvents,
  runRecoverySweep,
  releaseNotification,
  getOpenApi,
  getDocs,
  getDocsAsset,
  getAsset,
  getHealth,
  getDashboard,
] as const;

type Route = (typeof ROUTES)[number];
type KeyOf<R> = R extends { method: infer M extends string; path: infer P extends string } ? `${Uppercase<M>} ${P}` : never;

/** `METHOD path`, in OpenAPI path syntax: `GET /v1/jobs/{job_id}`. */
export type RouteKey = KeyOf<Route>;
export type OperationId = Route["operationId"];
export type Method = Route["method"];

/** Who may call each route, as its declaration says (`x-mam-access`). */
export const ROUTE_PERMISSIONS = Object.fromEntries(
  ROUTES.map((r) => [`${r.method.toUpperCase()} ${r.path}`, r["x-mam-access"]]),
) as Readonly<Record<RouteKey, Access>>;

export { type Access, type AgentBinding, assertLatestAttempt, authorize, type PathParams } from "./access.ts";
export { type AppEnv, type AppOptions, createApp } from "./app.ts";
export { DASHBOARD_FILES } from "./dashboard.ts";
export { DOCS_ASSETS } from "./docs.ts";
export {
  HTTP_STATUS,
  PROBLEM_CONTENT_TYPE,
  type Problem,
  type ProblemCode,
  RETRY_AFTER_SECONDS,
  ROUTING_PROBLEMS,
  statusOf,
} from "./problem.ts";
export { type Method, type OperationId, ROUTE_PERMISSIONS, ROUTES, type RouteKey } from "./routes/index.ts";
export { type SlotBounds, StreamSlots } from "./routes/stream-slots.ts";
export { type AppSettings, appOptionsOf } from "./settings.ts";
export {
  createTokenService,
  type MintedAgentToken,
  type Principal,
  SCOPES,
  type Scope,
  ScopeSchema,
  TokenName,
  type TokenService,
  type TokenServiceOptions,
  verifySubscriberLogin,
} from "./tokens.ts";
export * from "./wire.ts";

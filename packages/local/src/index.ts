export { type BrokerChoice, brokerOf, type MqttLogin } from "./broker-choice.ts";
export { changeRelay, JobFlushQueue } from "./change-relay.ts";
export { type D1DatabaseLike, D1Driver, type D1PreparedStatementLike, type D1ResultLike } from "./d1-driver.ts";
export {
  type Credentials,
  dataDirDeps,
  migrateDataDir,
  openDataDir,
  openEmbeddedJobStore,
  readCredentials,
  secureDataDir,
} from "./data-dir.ts";
export { dataDirPaths } from "./data-dir-paths.ts";
export { statfsDiskSpace } from "./disk-space.ts";
export {
  CONNACK,
  DEFAULT_DRAIN_TIMEOUT_MS,
  DEFAULT_MAX_PACKET_BYTES,
  DEFAULT_MAX_QUEUED_BYTES_PER_SESSION,
  DEFAULT_MAX_QUEUED_PER_SESSION,
  DEFAULT_MAX_SESSIONS,
  DEFAULT_MAX_SESSIONS_PER_NAME,
  type EmbeddedBroker,
  type EmbeddedBrokerOptions,
  isLoopbackHost,
  startEmbeddedBroker,
} from "./embedded-broker.ts";
export { FILE_STORE_SCHEME, FileReportStore, type FileReportStoreOptions } from "./file-report-store.ts";
export { ensurePortsFree, type ListenTarget, listenOn, portRefusal } from "./listen.ts";
export { MqttPublisher, type MqttPublisherOptions } from "./mqtt-publisher.ts";
export { connectionCap, softOpenFileLimit } from "./open-files.ts";
export {
  checkStatement,
  SQL_LIMITS,
  SqlBatchError,
  type SqlDriver,
  type SqlResult,
  type SqlRow,
  type SqlStatement,
  type SqlValue,
  sql,
} from "./sql-driver.ts";
export { feedBeforeCapture, feedRowStatements } from "./sql-feed-rules.ts";
export { SqlJobStore, sqlStoreError } from "./sql-job-store.ts";
export { BetterSqliteDriver } from "./sqlite-driver.ts";
export { SqliteJobStore } from "./sqlite-job-store.ts";
export { migrateDatabaseFile, migrateSqlite, SQLITE_SCHEMA_VERSION, SQLITE_STEPS, sqliteSchemaVersion } from "./sqlite-migrations.ts";

export { DEFAULT_FEED_DELAY_MS, DynamoJobStore, type DynamoJobStoreOptions, recordFromConditionFailure } from "./dynamo-job-store.ts";
export { IOT_MAX_PAYLOAD_BYTES, IotPublisher, type IotPublisherOptions } from "./iot-publisher.ts";
export {
  COUNT_SHARDS,
  COUNTED,
  COUNTS_PK,
  countShardOf,
  type FeedWrite,
  feedWriteOfStreamRecord,
  isJobImage,
  JOB_ITEM_SK,
  jobItem,
  jobRecordOfAttributes,
  jobRecordOfItem,
  jobRecordOfNewImage,
  KEY_ATTRIBUTES,
  owedIntentIdOfImage,
} from "./job-item.ts";
export { createJobTable, JOB_TABLE_DEFINITION, JOB_TABLE_INDEX } from "./job-table.ts";
export { createS3Client, RETIRED_TAG, S3ReportStore, type S3ReportStoreOptions, s3ClientConfig } from "./s3-report-store.ts";
export { isNetworkFailure, isTransient, readSdkFailure, type SdkFailure, storeFailure } from "./sdk-errors.ts";
export {
  afterTableReady,
  markJobItemsCounted,
  migrateCommand,
  migrateJobTable,
  prepareJobTable,
  readTableVersion,
  TABLE_SCHEMA_VERSION,
  TABLE_STEPS,
  TABLE_VERSION_KEY,
  type TableMigrationOptions,
  type TableTarget,
} from "./table-migrations.ts";

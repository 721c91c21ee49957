/**
 * DynamoDB stream records in the two shapes mam meets them: as the Streams API returns
 * them (the SDK's `_Record`: dates, byte arrays) and as Lambda hands them to a function
 * (`DynamoDBRecord`: epoch seconds, base64), and the message Lambda sends to a stream
 * mapping's on-failure destination. Used by the feed's redrive (`feed-redrive.ts`),
 * which re-reads a failed range from the stream, and by our stream poller
 * (`scripts/peers/stream-poller.ts`), which stands in for Lambda's mapping.
 */
import type * as Streams from "@aws-sdk/client-dynamodb-streams";
import type * as Lambda from "aws-lambda";

/** The message Lambda sends to a stream's on-failure destination (SQS or SNS). */
export interface OnFailureMessage {
  readonly requestContext: {
    readonly requestId: string;
    readonly functionArn: string;
    readonly condition: "RetryAttemptsExhausted" | "RecordAgeExceeded";
    readonly approximateInvokeCount: number;
  };
  readonly responseContext: { readonly statusCode: number; readonly executedVersion: string; readonly functionError?: string };
  readonly version: "1.0";
  readonly timestamp: string;
  readonly DDBStreamBatchInfo: {
    readonly shardId: string;
    readonly startSequenceNumber: string;
    readonly endSequenceNumber: string;
    readonly approximateArrivalOfFirstRecord: string;
    readonly approximateArrivalOfLastRecord: string;
    readonly batchSize: number;
    readonly streamArn: string;
  };
}

/** A stream record as the SDK returns it -> the record Lambda hands the function (DynamoDB JSON, epoch seconds, base64 binaries). */
export function toLambdaRecord(record: Streams._Record, streamArn: string, region?: string): Lambda.DynamoDBRecord {
  const d = record.dynamodb ?? {};
  const image = (i: Record<string, Streams.AttributeValue> | undefined): Record<string, Lambda.AttributeValue> | undefined =>
    i === undefined ? undefined : Object.fromEntries(Object.entries(i).map(([k, v]) => [k, attribute(v)]));
  const created = d.ApproximateCreationDateTime;
  const keys = image(d.Keys);
  const newImage = image(d.NewImage);
  const oldImage = image(d.OldImage);
  return {
    eventID: record.eventID ?? "",
    eventName: record.eventName as Lambda.DynamoDBRecord["eventName"],
    eventVersion: record.eventVersion ?? "1.1",
    eventSource: "aws:dynamodb",
    awsRegion: region ?? record.awsRegion ?? "us-east-1",
    dynamodb: {
      ...(created === undefined ? {} : { ApproximateCreationDateTime: Math.floor(created.getTime() / 1000) }),
      ...(keys === undefined ? {} : { Keys: keys }),
      ...(newImage === undefined ? {} : { NewImage: newImage }),
      ...(oldImage === undefined ? {} : { OldImage: oldImage }),
      ...(d.SequenceNumber === undefined ? {} : { SequenceNumber: d.SequenceNumber }),
      ...(d.SizeBytes === undefined ? {} : { SizeBytes: d.SizeBytes }),
      ...(d.StreamViewType === undefined ? {} : { StreamViewType: d.StreamViewType }),
    },
    ...(record.userIdentity?.Type === undefined || record.userIdentity.PrincipalId === undefined
      ? {}
      : { userIdentity: { type: record.userIdentity.Type, principalId: record.userIdentity.PrincipalId } }),
    eventSourceARN: streamArn,
  };
}

const base64 = (b: Uint8Array): string => Buffer.from(b).toString("base64");

function attribute(v: Streams.AttributeValue): Lambda.AttributeValue {
  if (v.S !== undefined) return { S: v.S };
  if (v.N !== undefined) return { N: v.N };
  if (v.BOOL !== undefined) return { BOOL: v.BOOL };
  if (v.NULL !== undefined) return { NULL: v.NULL };
  if (v.B !== undefined) return { B: base64(v.B) };
  if (v.SS !== undefined) return { SS: v.SS };
  if (v.NS !== undefined) return { NS: v.NS };
  if (v.BS !== undefined) return { BS: v.BS.map(base64) };
  if (v.L !== undefined) return { L: v.L.map(attribute) };
  if (v.M !== undefined) return { M: Object.fromEntries(Object.entries(v.M).map(([k, x]) => [k, attribute(x)])) };
  throw new Error(`unknown attribute value ${JSON.stringify(Object.keys(v))}`);
}

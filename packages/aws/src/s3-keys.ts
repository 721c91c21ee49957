import { MamError } from "@mam/core";

// Object keys for the S3 report store, apart from the S3 client: the http function
// can describe a report's address without loading the S3 SDK, which it loads only
// on the first report operation.

/** A location is relative: `reports/<job>/<attempt>`, or any `a/b/c` of safe segments. */
const SEGMENT = /^[A-Za-z0-9_-]{1,128}$/;
/** A plain file name: no separators, not `.` or `..`. */
const NAME = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$/;
const MAX_LOCATION_SEGMENTS = 16;

export function objectKey(location: string, name: string): string {
  const segments = location.split("/");
  if (location.length === 0 || segments.length > MAX_LOCATION_SEGMENTS || !segments.every((s) => SEGMENT.test(s))) {
    throw new MamError(
      "report.location",
      `not a report location: ${JSON.stringify(location)} (relative segments of letters, digits, '_' and '-', e.g. reports/<job>/<attempt>)`,
    );
  }
  if (!NAME.test(name)) throw new MamError("report.location", `not a plain file name: ${JSON.stringify(name)}`);
  return `${location}/${name}`;
}

/** The absolute address of an object, as manifests record it. */
export function s3Uri(bucket: string, location: string, name: string): string {
  return `s3://${bucket}/${objectKey(location, name)}`;
}

/** DynamoDB stream batch -> the change feed's rows of each job item's write; partial batch failures by SequenceNumber. */
import { createFeedWriterHandler } from "./compose.ts";

export const handler = createFeedWriterHandler(process.env);

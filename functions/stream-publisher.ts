/** DynamoDB stream batch -> publish each committed intent; partial batch failures by SequenceNumber. */
import { createStreamPublisherHandler } from "./compose.ts";

export const handler = createStreamPublisherHandler(process.env);

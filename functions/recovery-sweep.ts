/** Scheduled (EventBridge): re-send every owed notification that is due; logs and returns {owed, sent, failed, quarantined, not_tried}, one more line per intent quarantined. */
import { createRecoverySweepHandler } from "./compose.ts";

export const handler = createRecoverySweepHandler(process.env);

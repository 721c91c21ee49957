/** Scheduled (EventBridge): re-send every owed notification; logs and returns {owed, sent, failed}. */
import { createRecoverySweepHandler } from "./compose.ts";

export const handler = createRecoverySweepHandler(process.env);

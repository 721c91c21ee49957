import { localPorts } from "../support/local-backend.ts";
import { apiQuotaSuite } from "./quota.suite.ts";

apiQuotaSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);

import { localPorts } from "../support/local-backend.ts";
import { apiLeaseSuite } from "./lease.suite.ts";

apiLeaseSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts, { feedRows: true });

import { localPorts } from "../support/local-backend.ts";
import { apiFeedSuite } from "./feed.suite.ts";

apiFeedSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);

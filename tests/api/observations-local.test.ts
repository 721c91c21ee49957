import { localPorts } from "../support/local-backend.ts";
import { apiObservationSuite } from "./observations.suite.ts";

apiObservationSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);

import { type LocalPorts, localPorts, pinnedFiles } from "../support/local-backend.ts";
import { apiPinnedCopiesSuite } from "./pins.suite.ts";

apiPinnedCopiesSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts, (ports, evidence) =>
  pinnedFiles(ports as unknown as LocalPorts, evidence),
);

import { type LocalPorts, localPorts, pinnedFiles } from "../support/local-backend.ts";
import { apiAttack17Suite } from "./attack-17.suite.ts";

apiAttack17Suite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts, (ports, evidence) =>
  pinnedFiles(ports as unknown as LocalPorts, evidence),
);

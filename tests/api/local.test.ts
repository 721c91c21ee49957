import { localPorts } from "../support/local-backend.ts";
import { apiBoundsSuite } from "./bounds.suite.ts";
import { apiFinalizeBodySuite } from "./finalize-body.suite.ts";
import { apiResentCompletionSuite } from "./resent.suite.ts";
import { apiRoutesSuite } from "./routes.suite.ts";
import { apiVerificationSuite } from "./verification.suite.ts";

apiRoutesSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
apiBoundsSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
apiResentCompletionSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
apiFinalizeBodySuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);
apiVerificationSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts);

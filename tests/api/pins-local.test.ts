import { readdir } from "node:fs/promises";
import path from "node:path";
import { type LocalPorts, localPorts } from "../support/local-backend.ts";
import type { ApiPorts } from "./harness.ts";
import { apiPinnedCopiesSuite } from "./pins.suite.ts";

/** The files under the attempt's evidence directory: the file store removes what it retires, so none is ever marked. */
async function pinnedFiles(ports: ApiPorts, evidence: string) {
  const dir = path.join((ports as unknown as LocalPorts).reportRoot, ...evidence.split("/"));
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => {
    if (e.code === "ENOENT") return [];
    throw e;
  });
  return names.map((name) => ({ name, retired: false }));
}

apiPinnedCopiesSuite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts, pinnedFiles);

import { readdir } from "node:fs/promises";
import path from "node:path";
import { type LocalPorts, localPorts } from "../support/local-backend.ts";
import { apiAttack17Suite } from "./attack-17.suite.ts";
import type { ApiPorts } from "./harness.ts";

async function pinnedFiles(ports: ApiPorts, evidence: string) {
  const dir = path.join((ports as unknown as LocalPorts).reportRoot, ...evidence.split("/"));
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => {
    if (e.code === "ENOENT") return [];
    throw e;
  });
  return names.map((name) => ({ name, retired: false }));
}

apiAttack17Suite("the local adapters (SQLite, files, embedded MQTT broker)", localPorts, pinnedFiles);

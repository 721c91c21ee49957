/** A racer with its own SQLite connection on the shared WAL file (see racer.ts). */
import { openEmbeddedJobStore } from "@mam/local";
import { runRacer } from "./racer.ts";

runRacer((target) => {
  if (target.backend !== "sqlite") throw new Error(`racer-sqlite got a ${target.backend} target`);
  // As a process on the data dir opens it (openDataDir): core's guard, the record cache, SQLite.
  return openEmbeddedJobStore(target.dbFile);
});

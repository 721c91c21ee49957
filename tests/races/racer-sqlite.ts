/** A racer with its own SQLite connection on the shared WAL file (see racer.ts). */
import { SqliteJobStore } from "@mam/local";
import { runRacer } from "./racer.ts";

runRacer((target) => {
  if (target.backend !== "sqlite") throw new Error(`racer-sqlite got a ${target.backend} target`);
  const store = new SqliteJobStore(target.dbFile);
  return { jobs: store, close: () => store.close() };
});

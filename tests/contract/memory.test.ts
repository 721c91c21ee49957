import { type AtomicWrite, MemoryJobStore, MemoryReportStore } from "@mam/core";
import { atomicWriteContract } from "./atomic-write.suite.ts";
import { jobStoreContract } from "./job-store.suite.ts";
import { reportStoreContract } from "./report-store.suite.ts";
import { statusCountsContract } from "./status-counts.suite.ts";

// Core's in-memory reference adapters: what tests/unit runs on must behave as the real stores do.

jobStoreContract("in memory (core's reference adapter)", async () => ({
  store: new MemoryJobStore(),
  close: async () => undefined,
}));

/** The memory store with its protected atomic write in reach of the suite. */
class AtomicMemoryJobStore extends MemoryJobStore {
  atomically(writes: readonly AtomicWrite[]) {
    return this.writeAtomically(writes);
  }
}

atomicWriteContract("in memory (core's reference adapter)", async () => {
  const store = new AtomicMemoryJobStore();
  return { store, atomically: (w) => store.atomically(w), close: async () => undefined };
});

reportStoreContract("in memory (core's reference adapter)", async () => ({
  store: new MemoryReportStore(),
  close: async () => undefined,
}));

statusCountsContract("in memory (core's reference adapter)", "exact", async () => ({
  store: new MemoryJobStore(),
  close: async () => undefined,
}));

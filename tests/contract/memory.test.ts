import { MemoryJobStore, MemoryReportStore } from "@mam/core";
import { jobStoreContract } from "./job-store.suite.ts";
import { reportStoreContract } from "./report-store.suite.ts";

// Core's in-memory reference adapters: what tests/unit runs on must behave as the real stores do.

jobStoreContract("in memory (core's reference adapter)", async () => ({
  store: new MemoryJobStore(),
  close: async () => undefined,
}));

reportStoreContract("in memory (core's reference adapter)", async () => ({
  store: new MemoryReportStore(),
  close: async () => undefined,
}));

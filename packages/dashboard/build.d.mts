/** packages/dashboard/build.mjs, as scripts and tests import it. */
export declare const DASHBOARD_FILES: readonly string[];
export declare function buildDashboard(outdir?: string): Promise<{ outdir: string; sizes: Record<string, number>; ms: number }>;

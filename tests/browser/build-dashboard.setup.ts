/** The browser tier tests the page built from the source as it is now. */
// @ts-expect-error: a plain ES module of the repo's, with no type declarations
import { buildDashboard } from "../../packages/dashboard/build.mjs";

export default async function setup(): Promise<void> {
  const { sizes, ms } = (await buildDashboard()) as { sizes: Record<string, number>; ms: number };
  console.log(`dashboard built in ${ms} ms: ${JSON.stringify(sizes)}`);
}

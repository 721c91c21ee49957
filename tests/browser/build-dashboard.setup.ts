/** The browser tier tests the page built from the source as it is now. */
import { buildDashboard } from "../../packages/dashboard/build.mjs";

export default async function setup(): Promise<void> {
  const { sizes, ms } = await buildDashboard();
  console.log(`dashboard built in ${ms} ms: ${JSON.stringify(sizes)}`);
}

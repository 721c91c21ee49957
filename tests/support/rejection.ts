/** What a promise rejected with; fails the test if it resolved. */
export async function rejection(p: Promise<unknown> | (() => unknown)): Promise<unknown> {
  try {
    await (typeof p === "function" ? p() : p);
  } catch (e) {
    return e;
  }
  throw new Error("expected a rejection, but it resolved");
}

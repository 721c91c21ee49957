/** core's KeptByKey: each value derived once, at most `capacity` kept, nothing kept of a derivation that throws. */
import { KeptByKey } from "@mam/core";
import { expect, it } from "vitest";

it("derives a key's value once, starts again at its capacity, and keeps nothing a derivation threw for", () => {
  const kept = new KeptByKey<string, number>(2);
  let derived = 0;
  const derive = () => ++derived;
  expect([kept.get("a", derive), kept.get("a", derive), kept.get("b", derive)]).toEqual([1, 1, 2]);
  expect(kept.get("c", derive)).toBe(3); // full: started again, holding c alone
  expect(kept.get("a", derive)).toBe(4);
  expect(() =>
    kept.get("bad", () => {
      throw new Error("refused");
    }),
  ).toThrow("refused");
  expect(kept.get("bad", () => 5)).toBe(5);
});

/** core's KeptByKey and KeptByParts: each value derived once, a bounded number kept, nothing kept of a derivation that throws. */
import { KeptByKey, KeptByParts } from "@mam/core";
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

it("KeptByParts: derives a key of parts once, tells runs apart by END, starts again at its capacity of maps, keeps nothing a derivation threw for", () => {
  const END = KeptByParts.END;
  const kept = new KeptByParts<number>(8);
  let derived = 0;
  const derive = () => ++derived;
  expect(kept.get(["a", END, "b"], derive)).toBe(1); // maps: the root, a, END, b
  expect(kept.get(["a", END, "b"], derive)).toBe(1);
  // The same parts in other runs, a prefix, a number for a string: other keys.
  expect(kept.get(["a", "b", END], derive)).toBe(2); // 6 maps
  expect(kept.get(["a", END], derive)).toBe(3); // no map more
  expect(kept.get([1, END], derive)).toBe(4); // 8 maps: full
  expect(kept.get([1, END], derive)).toBe(4);
  // A key needing a map more starts again, keeping only what it derives.
  expect(kept.get(["1", END], derive)).toBe(5);
  expect(kept.get(["a", END, "b"], derive)).toBe(6);
  expect(kept.get(["1", END], derive)).toBe(5);
  expect(() =>
    kept.get(["bad"], () => {
      throw new Error("refused");
    }),
  ).toThrow("refused");
  expect(kept.get(["bad"], () => 7)).toBe(7);
  // A key longer than the capacity is derived every time, never kept.
  const long = ["p", "q", "r", "s", "t", "u", "v", "w"];
  expect(kept.get(long, derive)).toBe(7);
  expect(kept.get(long, derive)).toBe(8);
});

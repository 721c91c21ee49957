/**
 * Values derived from a key, kept so that each is derived once: for the few dozen
 * forms a store's writes take (compiled SQL, folded feed rules, write shapes, checked
 * statements). At `capacity` it starts again, so keys made without end cost no more
 * memory than that; a value the derivation throws for is not kept.
 */
export class KeptByKey<K, V> {
  readonly #values = new Map<K, V>();
  readonly #capacity: number;

  constructor(capacity = 1024) {
    this.#capacity = capacity;
  }

  /** The value kept for `key`, or `derive()`'s, kept. */
  get(key: K, derive: () => V): V {
    let value = this.#values.get(key);
    if (value === undefined) {
      value = derive();
      if (this.#values.size >= this.#capacity) this.#values.clear();
      this.#values.set(key, value);
    }
    return value;
  }

  clear(): void {
    this.#values.clear();
  }
}

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

/**
 * Values derived from a key made of parts (strings, numbers, `KeptByParts.END`), kept
 * as `KeptByKey` keeps them, but looked up part by part through nested maps: a key
 * asked on a hot path is never concatenated into a new string and hashed whole. A
 * key's parts must say everything the value depends on, with `END` after each run of
 * parts whose length varies. At `capacity` maps it starts again; a value the
 * derivation throws for is not kept.
 */
export class KeptByParts<V> {
  /** A part no string or number equals: ends a run of parts of variable length. */
  static readonly END: unique symbol = Symbol("end");
  #root = new Map<unknown, unknown>();
  readonly #capacity: number;
  #maps = 1;

  constructor(capacity = 16_384) {
    this.#capacity = capacity;
  }

  /** The value kept for `parts`, or `derive()`'s, kept. */
  get(parts: readonly unknown[], derive: () => V): V {
    let node = this.#root;
    for (const part of parts) {
      let next = node.get(part) as Map<unknown, unknown> | undefined;
      if (next === undefined) {
        if (this.#maps >= this.#capacity) return this.#restart(parts, derive);
        next = new Map();
        this.#maps += 1;
        node.set(part, next);
      }
      node = next;
    }
    let value = node.get(VALUE) as V | undefined;
    if (value === undefined) {
      value = derive();
      node.set(VALUE, value);
    }
    return value;
  }

  #restart(parts: readonly unknown[], derive: () => V): V {
    if (parts.length >= this.#capacity) return derive();
    this.#root = new Map();
    this.#maps = 1;
    return this.get(parts, derive);
  }
}

const VALUE = Symbol("value");

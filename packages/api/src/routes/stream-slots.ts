import { MamError } from "@mam/core";
import type { Principal } from "../tokens.ts";

/** The bounds on open feed streams: in all, per principal, and the share kept for operator tokens. */
export interface SlotBounds {
  readonly maxStreams: number;
  readonly perAgent: number;
  readonly perOperator: number;
  readonly operatorReserve: number;
}

/** A slot held by one stream; `release()` gives it back (a second call does nothing). */
export interface StreamSlot {
  release(): void;
}

/**
 * The open streams of one process, counted in all and per principal: an agent by its
 * token's (job, attempt), so a re-minted token of the same attempt shares the bound;
 * an operator token by its id (`MAM_OPERATOR_TOKEN` by that name). Agents together
 * never take the last `operatorReserve` slots, so an operator can always watch.
 *
 *   take: per-principal bound reached -> 429 stream.tooMany (the caller holds them)
 *         process bound reached       -> undefined (the answer is "now": rows, retry:, end)
 */
export class StreamSlots {
  readonly #held = new Map<string, number>();
  #open = 0;
  #agents = 0;

  /** Open streams now (what the tests read back after a flood). */
  get open(): number {
    return this.#open;
  }

  /** A slot for `principal`, `undefined` when the process is full; throws `stream.tooMany` past its own bound. */
  take(principal: Principal, bounds: SlotBounds): StreamSlot | undefined {
    const key = principal.kind === "agent" ? `agent:${principal.jobId}:${principal.attemptId}` : `operator:${principal.tokenId}`;
    const held = this.#held.get(key) ?? 0;
    const bound = principal.kind === "agent" ? bounds.perAgent : bounds.perOperator;
    if (held >= bound) {
      const who =
        principal.kind === "agent"
          ? `this agent's job ${principal.jobId} attempt ${principal.attemptId} already holds ${held} open streams, the bound per agent attempt (MAM_FEED_STREAMS_PER_AGENT)`
          : `this operator token already holds ${held} open streams, the bound per operator token (MAM_FEED_STREAMS_PER_OPERATOR)`;
      throw new MamError("stream.tooMany", `${who}; close one first, or page GET /v1/events`, {
        details: { bound, held },
      });
    }
    if (this.#open >= bounds.maxStreams) return undefined;
    const agentShare = Math.max(0, bounds.maxStreams - bounds.operatorReserve);
    if (principal.kind === "agent" && this.#agents >= agentShare) return undefined;
    this.#held.set(key, held + 1);
    this.#open += 1;
    if (principal.kind === "agent") this.#agents += 1;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        const left = (this.#held.get(key) ?? 1) - 1;
        if (left === 0) this.#held.delete(key);
        else this.#held.set(key, left);
        this.#open -= 1;
        if (principal.kind === "agent") this.#agents -= 1;
      },
    };
  }
}

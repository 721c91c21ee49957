import net from "node:net";
import { MamError } from "@mam/core";

/** Where a listener binds, and the setting a person changes to move it. */
export interface ListenTarget {
  /** 0 picks a free port. */
  readonly port: number;
  readonly host: string;
  /** The variable (or option) that sets `port`, named in the refusal: `MAM_PORT`, `MAM_OFFLINE_MQTT_PORT`. */
  readonly setting?: string | undefined;
}

/** The one line a person reads when a port cannot be bound; `undefined` for errors that are not about the port. */
export function portRefusal(error: unknown, target: ListenTarget): string | undefined {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  const named = target.setting === undefined ? "" : ` (${target.setting})`;
  const fix = target.setting === undefined ? "choose a free port" : `set ${target.setting} to a free port`;
  switch (code) {
    case "EADDRINUSE":
      return `port ${target.port} is taken${named}; ${fix}`;
    case "EACCES":
      return `port ${target.port} on ${target.host} needs privileges this user does not have${named}; ${fix} above 1023`;
    default:
      return undefined;
  }
}

/**
 * Listen on `target` and resolve with the bound address. A port that is taken (or
 * privileged) rejects with `config.invalid` naming the port and the setting to
 * change, instead of the bare `listen EADDRINUSE` Node raises — or, on a server
 * with no "error" listener, the uncaught exception and stack trace it ends in.
 */
export function listenOn(server: net.Server, target: ListenTarget): Promise<net.AddressInfo> {
  return new Promise((resolve, reject) => {
    const onError = (error: Error) => {
      const refusal = portRefusal(error, target);
      reject(refusal === undefined ? error : new MamError("config.invalid", refusal, { cause: error }));
    };
    server.once("error", onError);
    server.listen(target.port, target.host, () => {
      server.off("error", onError);
      const address = server.address();
      if (address === null || typeof address === "string") {
        reject(new Error(`the listener on ${target.host}:${target.port} has no TCP address`));
        return;
      }
      resolve(address);
    });
  });
}

/**
 * Check, before anything starts, that each port can be bound now (by binding it and
 * letting go): for a script whose listeners belong to children it spawns, where a
 * taken port would otherwise surface late, after the slow pieces, in the child's
 * words. Port 0 needs no check. Rejects with the first refusal, as `listenOn` does.
 */
export async function ensurePortsFree(targets: readonly ListenTarget[]): Promise<void> {
  for (const target of targets) {
    if (target.port === 0) continue;
    const probe = net.createServer();
    await listenOn(probe, target);
    await new Promise<void>((resolve) => probe.close(() => resolve()));
  }
}

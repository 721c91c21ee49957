/** A JSON answer of a running service, read field by field. */
export interface ServiceAnswer {
  readonly status: number;
  readonly text: string;
  // biome-ignore lint/suspicious/noExplicitAny: JSON answers read field by field
  readonly body: Record<string, any>;
  readonly headers: Headers;
}

/**
 * The one way the in-process e2e tests call a running `mam serve` (`startService`):
 * `call(method, path, token, body?, type?)` — a string body is sent as it is, anything
 * else as JSON; the answer's text, its JSON (undefined when empty) and its headers.
 */
export function serviceCaller(baseUrl: () => string) {
  return async (method: string, url: string, token: string, body?: unknown, type = "application/json"): Promise<ServiceAnswer> => {
    const res = await fetch(new URL(url, baseUrl()), {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": type }) },
      ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, text, body: (text === "" ? undefined : JSON.parse(text)) as ServiceAnswer["body"], headers: res.headers };
  };
}

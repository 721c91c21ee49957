import { render } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import { type Api, ApiError, apiOf, ok, STATUSES, type Status, type TokenInfo } from "./api.ts";
import { type FeedMode, type FeedState, LiveFeed } from "./feed.ts";
import { JobView } from "./job.tsx";
import { ListView } from "./list.tsx";
import { DryRuns, type Session } from "./session.ts";
import { Time, useTick } from "./ui.tsx";

/**
 * The dashboard: sign in with a token (kept in sessionStorage, gone with the tab),
 * then the job list (`#/`) or one job's story (`#/jobs/<id>`), kept live by the
 * change feed. Every value from the API is rendered as text by Preact (never as
 * HTML): nothing a prompt, report or event holds can run.
 */
const TOKEN_KEY = "mam.token";
const MARKS = ["stale", "overdue", "quarantined", "due"] as const;

/** `stream` on mam serve; `poll` where the service says its responses cannot stream (AWS). */
const FEED_MODE: FeedMode = document.querySelector('meta[name="mam-feed"]')?.getAttribute("content") === "poll" ? "poll" : "stream";

type Mark = (typeof MARKS)[number];
type Route = { view: "list"; status: Status | ""; mark: Mark | "" } | { view: "job"; jobId: string };

function routeOf(hash: string): Route {
  const job = /^#\/jobs\/([^?]+)/.exec(hash);
  if (job?.[1] !== undefined) return { view: "job", jobId: decoded(job[1]) };
  const params = new URLSearchParams(hash.split("?")[1] ?? "");
  const status = params.get("status") ?? "";
  const mark = params.get("mark") ?? "";
  return {
    view: "list",
    status: (STATUSES as readonly string[]).includes(status) ? (status as Status) : "",
    mark: (MARKS as readonly string[]).includes(mark) ? (mark as Mark) : "",
  };
}

/** A hash's part decoded; one whose percent-encoding is malformed stays as typed (the page shows it, the API refuses it). */
function decoded(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

function useRoute(): Route {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return routeOf(hash);
}

function App() {
  const [token, setToken] = useState<string | null>(sessionStorage.getItem(TOKEN_KEY));
  const [info, setInfo] = useState<TokenInfo | undefined>(undefined);
  const [notice, setNotice] = useState<string>("");
  const [said, setSaid] = useState("");
  /** Bumped by "Try again": asks the service again who the token is. */
  const [asked, setAsked] = useState(0);

  const signOut = (why: string) => {
    sessionStorage.removeItem(TOKEN_KEY);
    setToken(null);
    setInfo(undefined);
    setNotice(why);
  };

  const api = useMemo<Api | undefined>(
    () => (token === null ? undefined : apiOf(token, () => signOut("The token expired or was refused: sign in again."))),
    [token],
  );

  // Who the token is: its scopes decide which actions the page offers.
  useEffect(() => {
    if (api === undefined) return;
    let gone = false;
    ok(api.GET("/v1/token"))
      .then((i) => {
        if (gone) return;
        if (i.kind !== "operator") signOut("That is an agent's token: sign in with an operator token (mam token create --scope read).");
        else if (!i.scopes.includes("read")) signOut("That token has no read scope: the page needs one (mam token create --scope read).");
        else setInfo(i);
      })
      .catch((e) => {
        if (gone) return;
        if (e instanceof ApiError && (e.status === 401 || e.status === 403)) signOut(`The token was refused: ${e.message}`);
        else setNotice(`The service could not say who this token is: ${e instanceof Error ? e.message : String(e)}`);
      });
    return () => {
      gone = true;
    };
  }, [api, asked]);

  const session = useMemo<Session | undefined>(() => {
    if (api === undefined || token === null || info === undefined) return undefined;
    const feed = new LiveFeed(api, token, FEED_MODE, () => signOut("The token expired or was refused: sign in again."));
    return { api, token, info, feed, dryRuns: new DryRuns(api), say: setSaid };
  }, [api, token, info]);

  useEffect(() => {
    if (session === undefined) return;
    session.feed.start();
    (window as unknown as { mamDashboard?: unknown }).mamDashboard = { dryRuns: session.dryRuns };
    return () => session.feed.stop();
  }, [session]);

  return (
    <>
      {/* A button, not a link to "#main": the hash is the route, and following it would leave a job's page or drop the filters. */}
      <button type="button" class="skip" onClick={() => document.getElementById("main")?.focus()}>
        Skip to the content
      </button>
      <header>
        <h1>
          <a href="#/">mam</a> <span class="muted">jobs</span>
        </h1>
        {session !== undefined ? <FeedIndicator session={session} /> : null}
        {info !== undefined && info.kind === "operator" ? (
          <p class="who">
            {info.name ?? "operator token"} · {info.scopes.join(", ")}
            {info.expires_at !== undefined ? (
              <>
                {" "}
                · expires <Time iso={info.expires_at} />
              </>
            ) : null}{" "}
            <button type="button" onClick={() => signOut("Signed out: the token was forgotten.")}>
              Sign out
            </button>
          </p>
        ) : null}
      </header>
      <main id="main" tabIndex={-1}>
        {token === null ? (
          <SignIn
            notice={notice}
            onToken={(t) => {
              sessionStorage.setItem(TOKEN_KEY, t);
              setNotice("");
              setToken(t);
            }}
          />
        ) : session === undefined ? (
          notice === "" ? (
            <p aria-busy="true">Signing in…</p>
          ) : (
            <div class="signin">
              <p class="error" role="alert">
                {notice}
              </p>
              <div class="row">
                <button
                  type="button"
                  onClick={() => {
                    setNotice("");
                    setAsked((n) => n + 1);
                  }}
                >
                  Try again
                </button>
                <button type="button" onClick={() => signOut("")}>
                  Sign out
                </button>
              </div>
            </div>
          )
        ) : (
          <Routed session={session} />
        )}
        <p class="said" role="status" aria-live="polite">
          {said}
        </p>
      </main>
    </>
  );
}

function Routed({ session }: { session: Session }) {
  const route = useRoute();
  return route.view === "job" ? (
    // Keyed by the job: nothing one job's page read (dispatches, a report's text, a verification) is shown for another.
    <JobView key={route.jobId} session={session} jobId={route.jobId} />
  ) : (
    <ListView session={session} statusFilter={route.status} markFilter={route.mark} />
  );
}

function SignIn({ notice, onToken }: { notice: string; onToken: (token: string) => void }) {
  const [value, setValue] = useState("");
  return (
    <form
      class="signin"
      onSubmit={(e) => {
        e.preventDefault();
        const t = value.trim();
        if (t !== "") onToken(t);
      }}
    >
      <h2>Sign in</h2>
      <p>
        Paste a read token: <code>mam token create --scope read --ttl 8h --name dashboard</code> prints one. It stays in this tab only
        (sessionStorage) and is sent in the Authorization header, never in a URL.
      </p>
      <label for="token">Token</label>
      <input id="token" type="password" autoComplete="off" required value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      <button type="submit">Sign in</button>
      {notice !== "" ? (
        <p class="error" role="alert">
          {notice}
        </p>
      ) : null}
    </form>
  );
}

/** Whether the page is following the feed: live and caught up, catching up, or down and retrying. */
function FeedIndicator({ session }: { session: Session }) {
  const [state, setState] = useState<FeedState>(session.feed.state);
  useEffect(() => session.feed.onState(setState), [session]);
  useTick(1000);
  let text: string;
  let tone: string;
  if (state.kind === "connecting") {
    text = "Connecting to the feed…";
    tone = "warn";
  } else if (state.kind === "down") {
    const s = Math.max(0, Math.ceil((state.retryAt - Date.now()) / 1000));
    text = `Updates stopped: ${state.reason}. Retrying in ${s} s`;
    tone = "bad";
  } else if (session.feed.mode === "poll") {
    text = "Live: updates every 10 s, up to 40 s late";
    tone = "ok";
  } else {
    text = state.caughtUp ? "Live: caught up" : "Live: catching up…";
    tone = state.caughtUp ? "ok" : "warn";
  }
  return (
    <p
      class={`feed feed-${tone}`}
      id="feed-state"
      data-state={state.kind === "live" && state.caughtUp ? "caught-up" : state.kind}
      role="status"
    >
      {text}
    </p>
  );
}

const root = document.getElementById("app");
if (root !== null) {
  root.textContent = "";
  render(<App />, root);
}

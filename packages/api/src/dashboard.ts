/**
 * The dashboard shell: a page, its script and its stylesheet, all served by the app
 * itself (no external asset) to anyone. It holds no data of its own: it asks for a
 * token, keeps it in sessionStorage (gone with the tab), and reads `GET /v1/jobs`
 * with it. Every value from the API is written with textContent, never as HTML. No
 * script or style is inline, so the page's CSP allows only the app's own
 * (`script-src 'self'`): a value that slipped into the HTML could not run.
 */
export const DASHBOARD_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mam — jobs</title>
<link rel="stylesheet" href="assets/dashboard.css">
</head>
<body>
<header>
  <h1>mam — jobs</h1>
  <a href="docs">API docs</a>
  <button id="signout" type="button" hidden>Forget token</button>
</header>
<main>
  <form id="login" hidden>
    <label for="token">Bearer token (an operator token with the read scope)</label>
    <input id="token" type="password" autocomplete="off" size="48" required>
    <button type="submit">Use token</button>
  </form>
  <section id="jobs" hidden>
    <div class="bar">
      <label for="status">Status</label>
      <select id="status">
        <option value="">all</option>
        <option>pending</option><option>running</option><option>completed</option><option>error</option><option>cancelled</option>
      </select>
      <button id="refresh" type="button">Refresh</button>
      <button id="prev" type="button" disabled>&larr; Newer</button>
      <button id="next" type="button" disabled>Older &rarr;</button>
      <span id="page"></span>
    </div>
    <table>
      <thead><tr><th>job_id</th><th>agent</th><th>status</th><th>transition_seq</th><th>updated_at</th><th>owed notification</th></tr></thead>
      <tbody id="rows"></tbody>
    </table>
  </section>
  <p id="message" role="status"></p>
</main>
<script src="assets/dashboard.js"></script>
</body>
</html>
`;

/** The dashboard's script and stylesheet (`/assets/<name>`): the only files served there. */
export const DASHBOARD_ASSETS: Readonly<Record<string, { readonly body: string; readonly contentType: string }>> = {
  "dashboard.js": {
    contentType: "text/javascript; charset=utf-8",
    body: `(function () {
  "use strict";
  var KEY = "mam.token";
  var PAGE_SIZE = 50;
  var $ = function (id) { return document.getElementById(id); };
  // cursors[i] is the cursor that fetched page i (undefined for the first page).
  var cursors = [undefined];
  var page = 0;
  var nextCursor;

  function token() { return sessionStorage.getItem(KEY); }
  function say(text) { $("message").textContent = text || ""; }
  function showLogin(reason) {
    $("login").hidden = false; $("jobs").hidden = true; $("signout").hidden = true;
    say(reason);
  }
  function showJobs() { $("login").hidden = true; $("jobs").hidden = false; $("signout").hidden = false; }

  function cell(row, text, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function render(items) {
    var body = $("rows");
    body.textContent = "";
    items.forEach(function (job) {
      var tr = document.createElement("tr");
      cell(tr, job.job_id, "mono");
      cell(tr, job.agent);
      var st = cell(tr, "");
      var badge = document.createElement("span");
      badge.className = "status status-" + String(job.status).replace(/[^a-z]/g, "");
      badge.textContent = job.status;
      st.appendChild(badge);
      cell(tr, String(job.transition_seq));
      cell(tr, job.updated_at, "mono");
      var owed = job.pending_notification;
      cell(tr, owed ? owed.event + " (seq " + owed.seq + ", since " + owed.created_at + ")" : "", owed ? "owed" : "");
      body.appendChild(tr);
    });
    if (items.length === 0) {
      var tr = document.createElement("tr");
      var td = cell(tr, "no jobs");
      td.colSpan = 6;
      body.appendChild(tr);
    }
  }

  function load() {
    var t = token();
    if (!t) { showLogin(""); return; }
    showJobs();
    var params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    var status = $("status").value;
    if (status) params.set("status", status);
    var cursor = cursors[page];
    if (cursor) params.set("cursor", cursor);
    say("loading…");
    fetch("v1/jobs?" + params.toString(), { headers: { Authorization: "Bearer " + t, Accept: "application/json" } })
      .then(function (res) {
        return res.json().then(function (body) { return { res: res, body: body }; }, function () { return { res: res, body: {} }; });
      })
      .then(function (r) {
        if (r.res.status === 401) { sessionStorage.removeItem(KEY); showLogin("token refused: " + (r.body.detail || r.res.status)); return; }
        if (!r.res.ok) { say((r.body.title || "error") + ": " + (r.body.detail || r.res.status)); return; }
        nextCursor = r.body.next_cursor;
        render(r.body.items || []);
        $("prev").disabled = page === 0;
        $("next").disabled = !nextCursor;
        $("page").textContent = "page " + (page + 1);
        say("");
      })
      .catch(function (e) { say("could not reach the API: " + e.message); });
  }

  function restart() { cursors = [undefined]; page = 0; load(); }

  $("login").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(KEY, t);
    $("token").value = "";
    restart();
  });
  $("signout").addEventListener("click", function () { sessionStorage.removeItem(KEY); showLogin("token forgotten"); });
  $("status").addEventListener("change", restart);
  $("refresh").addEventListener("click", load);
  $("next").addEventListener("click", function () {
    if (!nextCursor) return;
    cursors[page + 1] = nextCursor; page += 1; load();
  });
  $("prev").addEventListener("click", function () { if (page > 0) { page -= 1; load(); } });
  load();
})();
`,
  },
  "dashboard.css": {
    contentType: "text/css; charset=utf-8",
    body: `:root { font-family: system-ui, sans-serif; color: #1d2330; background: #f6f7f9; }
body { margin: 0; }
header { display: flex; align-items: center; gap: 1rem; padding: .75rem 1.25rem; background: #1d2330; color: #fff; }
header h1 { font-size: 1.1rem; margin: 0; flex: 1; }
header a { color: #cfd6e4; }
main { padding: 1rem 1.25rem; }
form, .bar { display: flex; gap: .5rem; align-items: center; flex-wrap: wrap; margin-bottom: 1rem; }
input, select, button { font: inherit; padding: .35rem .6rem; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .4rem .6rem; border-bottom: 1px solid #e3e6ec; font-size: .9rem; }
th { background: #eef0f4; }
td.mono { font-family: ui-monospace, monospace; }
.status { padding: .1rem .45rem; border-radius: .6rem; background: #e3e6ec; }
.status-running { background: #dbeafe; } .status-completed { background: #dcfce7; }
.status-error { background: #fee2e2; } .status-cancelled { background: #f3f4f6; }
.owed { color: #b45309; }
#message { color: #b91c1c; min-height: 1.2em; }
[hidden] { display: none !important; }
`,
  },
};

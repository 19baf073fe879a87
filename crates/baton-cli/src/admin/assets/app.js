// The baton dashboard: reads and steers through /api/v1 with the token kept
// in sessionStorage (or given once as #token=… in the address). Refreshes
// every few seconds. No libraries, no build step.
"use strict";

const REFRESH_MS = 3000;
const $ = (id) => document.getElementById(id);
let tasksBefore = null; // the cursor of the page shown (null: newest)
let nextBefore = null;
let timer = null;

(function tokenFromHash() {
  const m = location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (m) {
    sessionStorage.setItem("batonToken", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

function token() { return sessionStorage.getItem("batonToken") || ""; }

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // A pause or resume records that it came from this page.
  if (method !== "GET") headers["X-Baton-Source"] = "dashboard";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  if (!r.ok) {
    const msg = data && data.error ? data.error + (data.field ? " (" + data.field + ")" : "") : "HTTP " + r.status;
    throw new ApiError(r.status, msg);
  }
  return data;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(state) { return el("span", { class: "state " + state }, state); }

function when(ts) {
  if (!ts) return "–";
  return ts.replace("T", " ").replace(/\.\d+/, "");
}

function ago(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function showError(msg) {
  const e = $("error");
  if (msg) { e.textContent = msg; e.hidden = false; } else { e.hidden = true; e.textContent = ""; }
}

async function act(method, path, body, what) {
  try {
    const r = await api(method, path, body);
    showError("");
    $("status").textContent = what + ": done";
    await refresh();
    return r;
  } catch (e) {
    showError(what + ": " + e.message);
    return null;
  }
}

// Pause or resume a job or queue, asking for an optional note (recorded
// with the change, shown in the tables); cancelling the prompt does nothing.
function toggle(kind, name, verb) {
  const note = window.prompt(verb + " " + kind + " " + name + ": note (optional)", "");
  if (note === null) return null;
  const body = note.trim() ? { note: note.trim() } : {};
  const base = kind === "job" ? "/api/v1/jobs/" : "/api/v1/queues/";
  return act("POST", base + encodeURIComponent(name) + "/" + verb, body, verb + " " + kind + " " + name);
}

// The last pause or resume of a job or queue: "note" — by, at.
function pauseNote(c) {
  if (!c) return null;
  const parts = [];
  if (c.note) parts.push("\u201c" + c.note + "\u201d");
  parts.push([c.by, when(c.at)].filter(Boolean).join(", "));
  return el("div", { class: "muted note", title: (c.note || "") + "\n" + (c.by || "") + " " + c.at }, parts.join(" \u2014 "));
}

// The next fire times in the job's zone, one a line (DST marked).
function nextFires(j) {
  if (!j.next_fires || !j.next_fires.length) return el("span", { class: "muted" }, "–");
  const box = el("div", { class: "fires" });
  for (const f of j.next_fires) {
    box.append(el("div", { class: "mono", title: "UTC " + f.at }, f.local.replace("T", " ") + " " + f.zone + (f.dst ? " (DST)" : "")));
  }
  return box;
}

function replaceRows(tbody, rows, empty, cols) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "muted", colSpan: cols }, empty))]));
}

async function renderJobs() {
  const jobs = await api("GET", "/api/v1/jobs");
  const runs = await Promise.all(jobs.map((j) =>
    api("GET", "/api/v1/tasks?limit=20&job=" + encodeURIComponent(j.name)).then((p) => p.tasks)));
  const rows = jobs.map((j, i) => {
    const marks = el("span", { class: "marks" });
    for (const t of runs[i].slice().reverse()) {
      marks.append(el("span", { class: "mark " + t.state, title: "task " + t.id + " " + (t.slot || "") + " " + t.state + (t.last_error ? ": " + t.last_error : "") }));
    }
    const last = j.last_run;
    return el("tr", { "data-job": j.name },
      el("td", {}, el("strong", {}, j.name), el("br"),
        el("span", { class: "muted", "data-source": j.name },
          j.source === "store" ? "store v" + j.version + (j.config_differs ? " (config differs)" : "") : (j.source || ""))),
      el("td", { class: "mono" }, j.schedule || "–"),
      el("td", { class: "mono", "data-policies": j.name },
        "overlap " + (j.overlap || "–"), el("br"), "misfire " + (j.misfire || "–")),
      el("td", { "data-next": j.name }, nextFires(j)),
      el("td", { class: "mono" }, when(j.last_slot)),
      el("td", {}, marks),
      el("td", { "data-pause": j.name },
        j.paused ? badge("paused") : (last ? badge(last.state) : el("span", { class: "muted" }, "no run yet")),
        pauseNote(j.pause_change)),
      el("td", {},
        j.paused
          ? el("button", { onclick: () => toggle("job", j.name, "resume") }, "Resume")
          : el("button", { onclick: () => toggle("job", j.name, "pause") }, "Pause"),
        " ",
        el("button", { "data-trigger": j.name, onclick: () => act("POST", "/api/v1/jobs/" + encodeURIComponent(j.name) + "/trigger", {}, "trigger " + j.name) }, "Trigger")));
  });
  replaceRows($("jobs-body"), rows, "no jobs", 8);
  // The backfill form's job list, keeping the choice across refreshes.
  const pick = $("backfill-job");
  const chosen = pick.value;
  const names = jobs.filter((j) => j.schedule).map((j) => j.name);
  if (names.join("\n") !== Array.from(pick.options, (o) => o.value).join("\n")) {
    pick.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(chosen)) pick.value = chosen;
  }
}

// Backfill a range of a job's past slots (POST /api/v1/jobs/{name}/backfill):
// the answer's counts, or the error naming the field.
async function backfill(ev) {
  ev.preventDefault();
  const job = $("backfill-job").value;
  const dry = $("backfill-dry").checked;
  const body = { from: $("backfill-from").value.trim(), to: $("backfill-to").value.trim(), dry_run: dry };
  const r = await act("POST", "/api/v1/jobs/" + encodeURIComponent(job) + "/backfill", body,
    (dry ? "dry run of a backfill of " : "backfill of ") + job);
  $("backfill-result").textContent = r === null ? "" : dry
    ? r.slots + " slots: " + r.would_enqueue + " would be enqueued, " + r.left_alone + " left alone (dry run: nothing enqueued)"
    : r.slots + " slots: " + r.enqueued + " enqueued, " + r.left_alone + " left alone";
}

async function renderQueues() {
  const queues = await api("GET", "/api/v1/queues");
  const rows = queues.map((q) => el("tr", { "data-queue": q.queue },
    el("td", {}, el("strong", {}, q.queue)),
    el("td", { class: "num" }, q.pending), el("td", { class: "num" }, q.running),
    el("td", { class: "num" }, q.succeeded), el("td", { class: "num" }, q.failed),
    el("td", { class: "num" }, q.cancelled), el("td", { class: "num" }, ago(q.oldest_pending_ms)),
    el("td", { class: "num" }, q.finished_last_hour),
    el("td", {}, q.paused ? badge("paused") : el("span", { class: "muted" }, "claiming"),
      pauseNote(q.pause_change)),
    el("td", { class: "limits" }, q.limits
      ? el("span", { title: "declared by " + q.limits.declared_by + " at " + q.limits.declared_at }, q.limits.summary)
      : el("span", { class: "muted" }, "none"),
      " ", el("button", { "data-queue-keys": q.queue, onclick: () => showKeys(q.queue) }, "Keys")),
    el("td", {},
      q.paused
        ? el("button", { "data-queue-resume": q.queue, onclick: () => toggle("queue", q.queue, "resume") }, "Resume")
        : el("button", { "data-queue-pause": q.queue, onclick: () => toggle("queue", q.queue, "pause") }, "Pause"))));
  replaceRows($("queues-body"), rows, "no tasks yet", 11);
  if (keysQueue) await showKeys(keysQueue);
}

// Keep a <select>'s options in step with `values` (the first option, "every
// …", stays), keeping the choice.
function syncOptions(select, values) {
  const chosen = select.value;
  const have = Array.from(select.options).slice(1).map((o) => o.value);
  if (have.join("\n") === values.join("\n")) return;
  select.replaceChildren(select.options[0], ...values.map((v) => el("option", { value: v }, v)));
  select.value = values.includes(chosen) ? chosen : "";
}

function ms(v) {
  if (v === null || v === undefined) return "-";
  return v < 1000 ? v + " ms" : v < 60000 ? (v / 1000).toFixed(1) + " s" : Math.round(v / 1000) + " s";
}

// The charts from the store's rollup (GET /api/v1/stats/series): the same
// on every instance and after a restart.
async function renderCharts() {
  const q = new URLSearchParams({ range: $("c-range").value });
  if ($("c-queue").value) q.set("queue", $("c-queue").value);
  if ($("c-kind").value) q.set("kind", $("c-kind").value);
  if ($("c-job").value) q.set("job", $("c-job").value);
  const s = await api("GET", "/api/v1/stats/series?" + q.toString());
  syncOptions($("c-queue"), [...new Set(s.series.map((x) => x.queue))].sort());
  syncOptions($("c-kind"), [...new Set(s.series.map((x) => x.kind))].sort());
  syncOptions($("c-job"), [...new Set(s.series.map((x) => x.job).filter((j) => j))].sort());
  const t = s.totals;
  const totals = $("chart-totals");
  totals.dataset.succeeded = t.succeeded;
  totals.dataset.failed = t.failed;
  totals.dataset.dead = t.dead;
  totals.textContent = t.succeeded + " succeeded, " + t.failed + " failed attempts (" + t.dead + " dead), " +
    t.cancelled + " cancelled; wait " + ms(t.wait_avg_ms) + " average (max " + ms(t.wait_max_ms) + "), run " +
    ms(t.run_avg_ms) + " average (max " + ms(t.run_max_ms) + ") — per " + (s.step_secs >= 3600 ? "hour" : s.step_secs / 60 + " min");
  drawSeries($("chart-throughput"), s.points, [
    { key: "succeeded", color: "--ok", bars: true },
    { key: "failed", color: "--warn", bars: true },
    { key: "dead", color: "--bad", bars: true },
    { key: "cancelled", color: "--muted", bars: true },
  ], String);
  drawSeries($("chart-latency"), s.points, [
    { key: "wait_avg_ms", color: "--warn" },
    { key: "run_avg_ms", color: "--run" },
  ], ms);
}

// One chart of `points`: bars side by side per bucket, or lines; the
// largest value and the range's ends labelled.
function drawSeries(c, points, lines, label) {
  if (c.clientWidth > 0) { c.width = c.clientWidth; c.height = c.clientHeight; }
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  const css = (v) => getComputedStyle(document.documentElement).getPropertyValue(v).trim();
  const val = (p, k) => p[k] === null || p[k] === undefined ? 0 : p[k];
  const max = Math.max(1, ...points.flatMap((p) => lines.map((l) => val(p, l.key))));
  c.dataset.max = max;
  c.dataset.points = points.length;
  const n = Math.max(1, points.length);
  const slot = (w - 2 * pad) / n;
  const x = (i) => pad + slot * (i + 0.5);
  const y = (v) => h - pad - (v * (h - 2 * pad)) / max;
  const bars = lines.filter((l) => l.bars);
  const bw = Math.max(1, slot / Math.max(1, bars.length) - 1);
  bars.forEach((l, j) => {
    ctx.fillStyle = css(l.color);
    points.forEach((p, i) => {
      const v = val(p, l.key);
      if (v > 0) ctx.fillRect(x(i) - slot / 2 + j * bw, y(v), bw, h - pad - y(v));
    });
  });
  for (const l of lines.filter((l) => !l.bars)) {
    ctx.strokeStyle = css(l.color);
    ctx.lineWidth = 2;
    ctx.beginPath();
    let open = false;
    points.forEach((p, i) => {
      if (p[l.key] === null || p[l.key] === undefined) { open = false; return; }
      if (open) ctx.lineTo(x(i), y(p[l.key])); else ctx.moveTo(x(i), y(p[l.key]));
      open = true;
      ctx.fillStyle = css(l.color);
      ctx.fillRect(x(i) - 1.5, y(p[l.key]) - 1.5, 3, 3);
    });
    ctx.stroke();
  }
  ctx.fillStyle = css("--muted");
  ctx.fillText(label(max), 2, pad - 6);
  ctx.fillText("0", 2, h - pad);
  if (points.length) {
    ctx.fillText(when(points[0].at), pad, h - 6);
    const last = when(points[points.length - 1].at);
    ctx.fillText(last, w - pad - ctx.measureText(last).width, h - 6);
  }
}

// The task filters and search terms, by API name (state last: a bulk
// retry leaves it out).
const SEARCH = ["queue", "job", "kind", "key", "text", "since", "until"];
function searchTerms(withState) {
  const terms = {};
  for (const key of withState ? SEARCH.concat(["state"]) : SEARCH) {
    const v = $("f-" + key).value.trim();
    if (v) terms[key] = v;
  }
  return terms;
}
function taskQuery() {
  const q = new URLSearchParams(Object.assign({ limit: "50" }, searchTerms(true)));
  if (tasksBefore !== null) q.set("before", String(tasksBefore));
  return q.toString();
}

async function renderTasks() {
  const page = await api("GET", "/api/v1/tasks?" + taskQuery());
  nextBefore = page.next_before;
  $("older").hidden = nextBefore === null;
  $("newer").hidden = tasksBefore === null;
  const rows = page.tasks.map((t) => {
    const what = t.payload && Array.isArray(t.payload.argv) ? t.payload.argv.join(" ") : t.kind;
    const buttons = [];
    if (t.state === "failed" || t.state === "cancelled") {
      buttons.push(el("button", { "data-retry": t.id, onclick: () => act("POST", "/api/v1/tasks/" + t.id + "/retry", {}, "retry task " + t.id) }, "Retry"));
    }
    if (t.state === "pending" || t.state === "running") {
      buttons.push(el("button", { "data-cancel": t.id, onclick: () => act("POST", "/api/v1/tasks/" + t.id + "/cancel", {}, "cancel task " + t.id) }, "Cancel"));
    }
    if (t.state !== "running") {
      buttons.push(el("button", { "data-delete": t.id, onclick: () => {
        if (confirm("Delete task " + t.id + " (" + t.state + ")? This cannot be undone.")) {
          act("DELETE", "/api/v1/tasks/" + t.id, undefined, "delete task " + t.id);
        }
      } }, "Delete"));
    }
    return el("tr", { "data-task": t.id },
      el("td", { class: "num mono" }, el("button", { class: "link", "data-open": t.id, title: "open task " + t.id, onclick: () => openTask(t.id) }, t.id)),
      el("td", { class: "task-state" }, badge(t.state)),
      el("td", {}, t.queue),
      el("td", { class: "mono" }, what + (t.job && t.slot ? " @ " + when(t.slot) : "") + (t.unique && !t.job ? " · key " + t.unique.text : "")),
      el("td", { class: "num" }, t.attempt + "/" + t.max_attempts),
      el("td", { class: "mono" }, when(t.run_at)),
      el("td", { class: "err" }, t.last_error || ""),
      el("td", {}, ...buttons));
  });
  replaceRows($("tasks-body"), rows, "no tasks match", 8);
}

// One task in the dialog: its fields, payload, every failed attempt (with
// its worker, start, end and error — a command's stderr tail is in it) and
// a timeline from enqueue to now.
function took(from, to) {
  if (!from || !to) return "–";
  const ms = Date.parse(to) - Date.parse(from);
  return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(1) + " s";
}
function taskTimeline(t) {
  const ev = [[t.created_at, "enqueued"]];
  for (const e of t.errors || []) {
    if (e.started_at) ev.push([e.started_at, "attempt " + e.attempt + " started" + (e.worker ? " on " + e.worker : "")]);
    ev.push([e.at, "attempt " + e.attempt + " failed"]);
  }
  const failedLast = (t.errors || []).some((e) => e.attempt === t.attempt && e.started_at === t.started_at);
  if (t.started_at && !failedLast) ev.push([t.started_at, "attempt " + t.attempt + " started" + (t.worker ? " on " + t.worker : "")]);
  if (t.finished_at) ev.push([t.finished_at, t.state]);
  ev.sort((a, b) => Date.parse(a[0]) - Date.parse(b[0]));
  return el("ol", { class: "timeline" }, ...ev.map(([at, what]) => el("li", {}, el("span", { class: "mono" }, when(at)), " ", what)));
}
async function openTask(id) {
  let t;
  try { t = await api("GET", "/api/v1/tasks/" + id); } catch (e) { showError("task " + id + ": " + e.message); return; }
  $("task-title").replaceChildren("Task " + t.id + " ", badge(t.state));
  const field = (name, value) => value === null || value === undefined || value === "" ? [] : [el("dt", {}, name), el("dd", {}, value)];
  const dl = el("dl", {},
    ...field("queue", t.queue), ...field("kind", t.kind),
    ...field("attempt", t.attempt + " of " + t.max_attempts), ...field("priority", t.priority),
    ...field("created", when(t.created_at)), ...field("run at", when(t.run_at)),
    ...field("started", t.started_at && when(t.started_at)), ...field("finished", t.finished_at && when(t.finished_at)),
    ...field("lease until", t.lease_until && when(t.lease_until)), ...field("worker", t.worker),
    ...field("unique key", t.unique && t.unique.text), ...field("concurrency key", t.concurrency_key),
    ...field("made by", t.job ? "job " + t.job + (t.slot ? " @ " + when(t.slot) : "") : null),
    ...field("trace", t.traceparent), ...field("last error", t.last_error),
    ...field("progress", t.progress === null || t.progress === undefined ? null : JSON.stringify(t.progress)));
  const attempts = (t.errors || []).map((e) => el("tr", { "data-attempt": e.attempt },
    el("td", { class: "num" }, e.attempt), el("td", {}, e.worker || "–"),
    el("td", { class: "mono" }, when(e.started_at)), el("td", { class: "mono" }, when(e.at)),
    el("td", { class: "num" }, took(e.started_at, e.at)), el("td", { class: "err" }, el("pre", {}, e.error))));
  const tbody = el("tbody", {});
  replaceRows(tbody, attempts, "no failed attempts", 6);
  $("task-body").replaceChildren(dl,
    el("h3", {}, "Payload"), el("pre", { class: "payload" }, JSON.stringify(t.payload, null, 2)),
    el("h3", {}, "Failed attempts"),
    el("table", {}, el("thead", {}, el("tr", {}, ...["#", "Worker", "Started", "Failed at", "Took", "Error"].map((h) => el("th", {}, h)))), tbody),
    el("h3", {}, "Timeline"), taskTimeline(t));
  if (!$("task-dialog").open) $("task-dialog").showModal();
}
$("task-close").addEventListener("click", () => $("task-dialog").close());

async function renderLocks() {
  const locks = await api("GET", "/api/v1/locks");
  const rows = locks.map((l) => el("tr", { "data-lock": l.name },
    el("td", {}, el("strong", {}, l.name)),
    el("td", { class: "mono" }, l.holder),
    el("td", { class: "num mono" }, l.token),
    el("td", { class: "mono" }, when(l.locked_at)),
    el("td", { class: "mono" }, when(l.lock_until)),
    el("td", {}, badge(l.state)),
    el("td", {}, l.state === "held"
      ? el("button", { onclick: () => {
          if (confirm("Force-release lock " + l.name + " (token " + l.token + ")? Its holder is told to stop (within 5 s) and the lock is free 30 s from now at the latest.")) {
            act("POST", "/api/v1/locks/" + encodeURIComponent(l.name) + "/release", { token: l.token }, "release " + l.name);
          }
        } }, "Release")
      : null)));
  replaceRows($("locks-body"), rows, "no locks", 7);
  // Who held what, when: the newest releases from the store.
  const hist = await api("GET", "/api/v1/locks/history?limit=20");
  replaceRows($("lock-history-body"), hist.records.map((r) => el("tr", { "data-lock-release": r.name + "#" + r.token },
    el("td", {}, r.name), el("td", { class: "mono" }, r.holder), el("td", { class: "num mono" }, r.token),
    el("td", { class: "mono" }, when(r.acquired_at)), el("td", { class: "mono" }, when(r.released_at)),
    el("td", { class: "num" }, ms(r.held_ms)))), "no releases in the last day", 6);
}

// The audit log's newest records: who did what, from where, how it ended.
async function renderAudit() {
  const page = await api("GET", "/api/v1/audit?limit=20");
  const rows = page.records.map((r) => el("tr", { "data-audit": r.id },
    el("td", { class: "mono" }, when(r.at)), el("td", {}, r.actor), el("td", {}, r.source),
    el("td", { class: "mono" }, r.action), el("td", {}, r.target), el("td", {}, r.outcome)));
  replaceRows($("audit-body"), rows, "no operator actions recorded yet", 6);
}

async function refresh() {
  clearTimeout(timer);
  try {
    await Promise.all([renderJobs(), renderQueues(), renderCharts(), renderTasks(), renderLocks(), renderAudit()]);
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    showError("");
    timer = setTimeout(refresh, REFRESH_MS);
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      showError(e.message + " — enter the admin token above.");
      $("status").textContent = "needs a token";
      $("token").focus();
      return; // no polling until a token is given
    }
    showError(e.message);
    $("status").textContent = "error";
    timer = setTimeout(refresh, REFRESH_MS * 2);
  }
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("batonToken", $("token").value);
  $("token").value = "";
  refresh();
});
$("task-filter").addEventListener("submit", (ev) => { ev.preventDefault(); tasksBefore = null; refresh(); });
$("backfill-form").addEventListener("submit", backfill);
for (const id of ["c-range", "c-queue", "c-kind", "c-job"]) $(id).addEventListener("change", () => renderCharts().catch((e) => showError("charts: " + e.message)));
$("older").addEventListener("click", () => { tasksBefore = nextBefore; refresh(); });
$("newer").addEventListener("click", () => { tasksBefore = null; refresh(); });
function scope(body) {
  const parts = Object.entries(body).map(([k, v]) => k + " " + v);
  return parts.length ? " matching " + parts.join(", ") : "";
}
$("retry-failed").addEventListener("click", () => {
  const body = searchTerms(false);
  if (confirm("Retry every failed task" + scope(body) + "?")) {
    act("POST", "/api/v1/tasks/retry-failed", body, "retry failed tasks");
  }
});
$("delete-finished").addEventListener("click", async () => {
  const body = searchTerms(true);
  try {
    const dry = await api("POST", "/api/v1/tasks/delete", body);
    if (confirm("Delete " + dry.matched + " finished task(s)" + scope(body) + "? This cannot be undone.")) {
      act("POST", "/api/v1/tasks/delete", Object.assign({ confirm: true }, body), "delete finished tasks");
    }
  } catch (e) {
    showError("delete finished tasks: " + e.message);
  }
});

refresh();

// The load of one queue's concurrency keys, below the queues (refreshed
// with them while shown).
let keysQueue = null;
async function showKeys(queue) {
  keysQueue = queue;
  const k = await api("GET", "/api/v1/queues/" + encodeURIComponent(queue) + "/keys?limit=20");
  const cap = k.per_key_max_running;
  const rows = k.keys.map((x) => el("tr", { "data-key": x.key },
    el("td", {}, x.key), el("td", { class: "num" }, x.running), el("td", { class: "num" }, x.pending),
    el("td", {}, cap != null && x.running >= cap ? badge("at cap") : ""),
    // Under a rate per key: its starts in the current window against the
    // rate's max, and when its next start is allowed.
    el("td", { class: "num", "data-window": x.rate ? x.rate.started_in_window : "" },
      x.rate ? x.rate.started_in_window + "/" + x.rate.max : "-"),
    el("td", { "data-next": x.rate && x.rate.next_start_at ? x.rate.next_start_at : "" },
      !x.rate ? "-" : x.rate.next_start_at ? when(x.rate.next_start_at) : "now")));
  $("keys-title").textContent = "Keys of " + queue + ": " + k.keys_running + " running, " + k.keys_pending +
    " pending" + (cap != null ? " (per-key cap " + cap + ")" : " (no per-key cap declared)") +
    (k.per_key_rate ? "; rate per key " + k.per_key_rate + ", " + k.keys_rate_held + " held back" : "") +
    (k.truncated ? "; pending counted over the first 10000 pending tasks" : "");
  replaceRows($("keys-body"), rows, "no task of this queue has a concurrency key", 6);
  $("keys").hidden = false;
}

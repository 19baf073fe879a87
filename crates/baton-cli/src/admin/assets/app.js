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
      el("td", {}, el("strong", {}, j.name)),
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
  const [queues, history] = await Promise.all([api("GET", "/api/v1/queues"), api("GET", "/api/v1/queues/history")]);
  const rows = queues.map((q) => el("tr", { "data-queue": q.queue },
    el("td", {}, el("strong", {}, q.queue)),
    el("td", { class: "num" }, q.pending), el("td", { class: "num" }, q.running),
    el("td", { class: "num" }, q.succeeded), el("td", { class: "num" }, q.failed),
    el("td", { class: "num" }, q.cancelled), el("td", { class: "num" }, ago(q.oldest_pending_ms)),
    el("td", { class: "num" }, q.finished_last_hour),
    el("td", {}, q.paused ? badge("paused") : el("span", { class: "muted" }, "claiming"),
      pauseNote(q.pause_change)),
    el("td", {},
      q.paused
        ? el("button", { "data-queue-resume": q.queue, onclick: () => toggle("queue", q.queue, "resume") }, "Resume")
        : el("button", { "data-queue-pause": q.queue, onclick: () => toggle("queue", q.queue, "pause") }, "Pause"))));
  replaceRows($("queues-body"), rows, "no tasks yet", 10);
  drawChart(history.samples);
}

// Pending depth (line) and tasks finished per sample (bars), all queues.
function drawChart(samples) {
  const c = $("chart");
  // Draw at the size the page gives it (a phone's is narrower), so the
  // text is not squeezed.
  if (c.clientWidth > 0) { c.width = c.clientWidth; c.height = c.clientHeight; }
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height, pad = 24;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  // The page's colours (light or dark, as the system says).
  const css = (v) => getComputedStyle(document.documentElement).getPropertyValue(v).trim();
  ctx.fillStyle = css("--muted");
  if (samples.length < 2) {
    ctx.fillText("collecting samples (one every 30 s)…", pad, h / 2);
    return;
  }
  const sum = (s, k) => Object.values(s.queues).reduce((a, q) => a + q[k], 0);
  const pending = samples.map((s) => sum(s, "pending"));
  const done = samples.map((s, i) => i === 0 ? 0 : Math.max(0, sum(s, "finished") - sum(samples[i - 1], "finished")));
  const max = Math.max(1, ...pending, ...done);
  const x = (i) => pad + (i * (w - 2 * pad)) / (samples.length - 1);
  const y = (v) => h - pad - (v * (h - 2 * pad)) / max;
  const bw = Math.max(2, (w - 2 * pad) / samples.length - 2);
  ctx.fillStyle = css("--ok");
  done.forEach((v, i) => { if (v > 0) ctx.fillRect(x(i) - bw / 2, y(v), bw, h - pad - y(v)); });
  ctx.strokeStyle = css("--warn");
  ctx.lineWidth = 2;
  ctx.beginPath();
  pending.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
  ctx.stroke();
  ctx.fillStyle = css("--muted");
  ctx.fillText(String(max), 2, pad);
  ctx.fillText("0", 2, h - pad);
  ctx.fillText(when(samples[0].at), pad, h - 6);
  const last = when(samples[samples.length - 1].at);
  ctx.fillText(last, w - pad - ctx.measureText(last).width, h - 6);
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
    await Promise.all([renderJobs(), renderQueues(), renderTasks(), renderLocks(), renderAudit()]);
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

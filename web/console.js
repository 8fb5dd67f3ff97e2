// Calve console: a page per resource behind the hash (#overview, #tables, #table/NAME,
// #pipelines, #pipeline/NAME, #dlq, #tokens, #try).
// Everything an event, a name or a reason holds is set as text, never as HTML; the page's
// Content-Security-Policy allows no inline script. The token lives in sessionStorage (this tab).
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "calve-token";

// JSON numbers past 2^53 (Iceberg snapshot ids) lose their last digits as JavaScript numbers:
// keep such an integer as its exact source text (JSON.parse's reviver sees it in context.source).
function parseExact(text) {
  return JSON.parse(text, (_key, value, context) =>
    typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source) ? context.source : value);
}

class ApiError extends Error {
  constructor(status, body) {
    const hint = status === 401 ? " Sign in with a valid token." : status === 403 ? " This token's scopes do not allow it." : "";
    super(`${status}: ${body.detail || "the request failed"}${hint}`);
    this.status = status;
    this.errors = body.errors || [];  // [{field, error}] of a 422
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) };
  let body = options.body;
  if (body !== undefined && typeof body !== "string") { body = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
  if (options.contentType) headers["Content-Type"] = options.contentType;
  const answer = await fetch(path, { method: options.method || "GET", headers, body });
  const text = answer.status === 204 ? "{}" : await answer.text();
  let parsed;
  try { parsed = parseExact(text); } catch { parsed = { detail: text || answer.statusText }; }
  if (!answer.ok) throw new ApiError(answer.status, parsed);
  return parsed;
}

function button(text, onClick) {
  const b = el("button", text);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// "3 min ago" (or "in 2 s", for a clock ahead of this one).
function ago(ms) {
  const seconds = Math.round((Date.now() - ms) / 1000);
  const size = Math.abs(seconds);
  const [n, unit] = size < 60 ? [size, "s"] : size < 3600 ? [Math.round(size / 60), "min"]
    : size < 86400 ? [Math.round(size / 3600), "h"] : [Math.round(size / 86400), "d"];
  return seconds >= 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}

// A time as people read it, in this browser's zone, with how long ago.
function when(ms) {
  if (ms === null || ms === undefined) return "never";
  const date = new Date(ms);
  const text = date.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return `${text} (${ago(ms)})`;
}

function plural(n, word) { return `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`; }

// The table's health as sentences a person reads at a glance, worst first.
function healthSentences(health) {
  const { data_files: files, small_files: small, snapshots, manifests } = health;
  const lines = [];
  if (!files) lines.push("No data files yet.");
  else if (small === files && files > 1) lines.push(`${plural(files, "data file")}, all small: compaction will merge them.`);
  else if (small > 1) lines.push(`${plural(files, "data file")}, ${small} of them small: compaction will merge those.`);
  else lines.push(`${plural(files, "data file")} of ${bytes(health.avg_file_bytes)} on average: no compaction needed.`);
  lines.push(`${plural(snapshots, "snapshot")} kept` + (health.oldest_snapshot_ms ? `, the oldest from ${ago(health.oldest_snapshot_ms)}.` : "."));
  lines.push(`${plural(manifests, "manifest")}; table metadata ${bytes(health.metadata_bytes)}.`);
  return lines;
}

function show(value) {
  if (value === null || value === undefined) return "∅";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

// A table of rows; `actions(row, index)`, when given, fills a last cell with buttons or boxes.
function grid(rows, actions) {
  if (!rows.length) return el("p", "none");
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  Object.keys(rows[0]).forEach((k) => head.appendChild(el("th", k)));
  if (actions) head.appendChild(el("th", ""));
  const body = table.createTBody();
  rows.forEach((row, index) => {
    const tr = body.insertRow();
    Object.values(row).forEach((v) => tr.appendChild(el("td", show(v))));
    if (actions) { const td = el("td"); td.append(...actions(row, index)); tr.appendChild(td); }
  });
  const scroll = el("div", undefined, "scroll");  // a wide table scrolls by itself, not the page
  scroll.appendChild(table);
  return scroll;
}

function facts(pairs) {
  const dl = el("dl", undefined, "facts");
  Object.entries(pairs).forEach(([k, v]) => { dl.appendChild(el("dt", k)); dl.appendChild(el("dd", show(v))); });
  return dl;
}

function page(title) {
  // A fresh element each time: a page still waiting for its answer (the user moved on) fills the
  // element it was given, which is no longer in the document, never the page now shown.
  const old = $("view");
  const view = old.cloneNode(false);
  view.appendChild(el("h2", title));
  old.replaceWith(view);
  // A table's or pipeline's own page is under its list (#table/x under #tables).
  const section = location.hash.replace(/^#(table|pipeline)\//, "#$1s/").split("/")[0];
  document.querySelectorAll("#nav a").forEach((a) => {
    const here = section === a.getAttribute("href");
    a.classList.toggle("current", here);
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  });
  return view;
}

function fail(view, error) {
  view.appendChild(el("p", error.message, "err"));
}

// -- overview: the tenant's counters sampled every 2 s, drawn as rates over the last 5 minutes --

const SAMPLE_MS = 2000;
const KEEP_SAMPLES = 150;
const DLQ_TABLE = "_calve_dlq";
let samples = [];
let sampler = null;

const sum = (values) => Object.values(values || {}).reduce((a, b) => a + b, 0);
const committedRows = (stats) => sum(stats.committed) - ((stats.committed || {})[DLQ_TABLE] || 0);

// Each chart: its title, and its value between two samples (a rate per second, or a level).
const CHARTS = [
  ["Events received /s", (a, b, dt) => (sum(b.received) - sum(a.received)) / dt],
  ["Events committed /s", (a, b, dt) => (committedRows(b) - committedRows(a)) / dt],
  ["Backlog (events)", (_a, b) => b.backlog_events],
  ["wait=true latency p50 (s)", (a, b) => quantile(0.5, a, b)],
  ["wait=true latency p99 (s)", (a, b) => quantile(0.99, a, b)],
  ["DLQ events /s", (a, b, dt) => (((b.committed || {})[DLQ_TABLE] || 0) - ((a.committed || {})[DLQ_TABLE] || 0)) / dt],
  ["Commit failures /s", (a, b, dt) => (sum(b.commit_failures) - sum(a.commit_failures)) / dt],
  ["Refused requests /s", (a, b, dt) => (sum(b.refused) - sum(a.refused)) / dt],
];

// The q-quantile of the wait=true latencies between two samples, from their histogram buckets
// (cumulative counts by upper bound), interpolated within a bucket as Prometheus's
// histogram_quantile does; null when nothing was acknowledged in between.
function quantile(q, a, b) {
  const bound = (le) => (le === "+Inf" ? Infinity : Number(le));
  const les = Object.keys(b.wait_buckets || {}).sort((x, y) => bound(x) - bound(y));
  const counts = les.map((le) => b.wait_buckets[le] - ((a.wait_buckets || {})[le] || 0));
  const total = counts.length ? counts[counts.length - 1] : 0;
  if (!(total > 0)) return null;
  const rank = q * total;
  const i = counts.findIndex((count) => count >= rank);
  const lower = i > 0 ? bound(les[i - 1]) : 0;
  if (!Number.isFinite(bound(les[i]))) return lower;  // beyond the largest bound: say the bound
  const below = i > 0 ? counts[i - 1] : 0;
  return lower + (bound(les[i]) - lower) * (rank - below) / Math.max(counts[i] - below, 1e-9);
}

function sparkline(title, points) {
  const figure = el("figure", undefined, "chart");
  const values = points.filter((v) => v !== null && Number.isFinite(v));
  const max = values.length ? Math.max(...values) : 0;
  const latest = values.length ? values[values.length - 1] : 0;
  figure.dataset.title = title;
  figure.dataset.max = String(max);
  figure.dataset.latest = String(latest);
  const round = (v) => (v >= 100 ? Math.round(v).toLocaleString() : Number(v.toFixed(2)).toLocaleString());
  // The top of the scale: a round number at or above the largest value, so the axis reads at a glance.
  const top = max > 0 ? niceCeiling(max) : 1;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${KEEP_SAMPLES} 40`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${title}: now ${round(latest)}, max ${round(max)}`);
  const y = (v) => 40 - (v === null ? 0 : v) * (40 / top);
  for (const level of [0.5, 1]) {
    const rule = document.createElementNS(ns, "line");
    rule.setAttribute("x1", "0"); rule.setAttribute("x2", String(KEEP_SAMPLES));
    rule.setAttribute("y1", String(y(top * level))); rule.setAttribute("y2", String(y(top * level)));
    rule.setAttribute("class", "rule");
    svg.appendChild(rule);
  }
  const xs = points.map((_v, i) => i + KEEP_SAMPLES - points.length);
  if (points.length) {
    const area = document.createElementNS(ns, "polygon");
    area.setAttribute("points", [`${xs[0]},40`, ...points.map((v, i) => `${xs[i]},${y(v)}`), `${xs[xs.length - 1]},40`].join(" "));
    svg.appendChild(area);
  }
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((v, i) => `${xs[i]},${y(v)}`).join(" "));
  svg.appendChild(line);
  const caption = el("figcaption");
  caption.append(el("span", title, "chart-title"), el("span", round(latest), "chart-now"));
  const yAxis = el("div", undefined, "chart-y");
  yAxis.append(el("span", round(top)), el("span", round(top / 2)), el("span", "0"));
  const plot = el("div", undefined, "chart-plot");
  plot.append(yAxis, svg);
  const minutes = (KEEP_SAMPLES * SAMPLE_MS) / 60000;
  const xAxis = el("div", undefined, "chart-x");
  xAxis.append(el("span", `${minutes} min ago`), el("span", `max ${round(max)}`), el("span", "now"));
  figure.append(caption, plot, xAxis);
  return figure;
}

// The smallest of 1, 2, 2.5, 5 times a power of ten at or above v.
function niceCeiling(v) {
  const power = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((c) => c >= v);
}

function drawOverview(view) {
  const charts = el("div"); charts.id = "overview-charts";
  const pairs = samples.slice(1).map((b, i) => [samples[i], b, Math.max(0.001, b.at - samples[i].at)]);
  CHARTS.forEach(([title, value]) => charts.appendChild(sparkline(title, pairs.map(([a, b, dt]) => value(a, b, dt)))));
  const last = samples[samples.length - 1];
  const before = samples.length > 1 ? samples[samples.length - 2] : last;
  const dt = Math.max(0.001, last.at - before.at);
  const tables = grid(Object.keys(last.committed || {}).sort().map((table) => ({
    table,
    "committed /s": (((last.committed[table] || 0) - ((before.committed || {})[table] || 0)) / dt).toFixed(1),
    "committed since start": last.committed[table],
    "commit failures": (last.commit_failures || {})[table] || 0,
  })));
  const old = $("overview-body");
  const body = el("div"); body.id = "overview-body";
  body.append(charts, el("h2", "Per table"), tables);
  if (old) old.replaceWith(body); else view.appendChild(body);
}

async function overviewPage() {
  const view = page("Overview");
  view.appendChild(el("p", `Every ${SAMPLE_MS / 1000} s, the last ${(KEEP_SAMPLES * SAMPLE_MS) / 60000} minutes (counters since the processes started; the page keeps what it has seen).`));
  const tick = async () => {
    try {
      samples.push(await api("/v1/stats"));
      samples = samples.slice(-KEEP_SAMPLES);
      if (location.hash === "#overview") drawOverview(view);
    } catch (e) { stopSampling(); fail(view, e); }
  };
  await tick();
  sampler = setInterval(tick, SAMPLE_MS);
}

function stopSampling() {
  if (sampler !== null) { clearInterval(sampler); sampler = null; }
}

async function tablesPage() {
  const view = page("Tables");
  try {
    const { tables, described } = await api("/v1/tables?describe=true");
    if (!tables.length) { view.appendChild(el("p", "No tables yet: POST events to /logs.")); return; }
    const known = Object.fromEntries(described.map((d) => [d.name, d]));
    const table = el("table", undefined, "list");
    const head = table.createTHead().insertRow();
    ["table", "rows", "size", "data files", "last commit"].forEach((title) => head.appendChild(el("th", title)));
    const body = table.createTBody();
    tables.forEach((name) => {
      const d = known[name] || {};
      const tr = body.insertRow();
      const link = el("a", name); link.href = "#table/" + encodeURIComponent(name);
      const cell = el("td"); cell.appendChild(link); tr.appendChild(cell);
      [show(d.rows), d.bytes == null ? "∅" : bytes(d.bytes), show(d.data_files),
       when(d.last_commit_ms)].forEach((v) => tr.appendChild(el("td", v)));
    });
    const scroll = el("div", undefined, "scroll");
    scroll.appendChild(table);
    view.appendChild(scroll);
    if (described.length < tables.length) view.appendChild(el("p", `Sizes of the first ${described.length} of ${tables.length} tables.`));
  } catch (e) { fail(view, e); }
}

async function tablePage(name) {
  const view = page(`Table ${name}`);
  view.appendChild(el("p", "loading…"));
  try {
    const path = "/v1/tables/" + encodeURIComponent(name);
    const info = await api(path);
    view.lastChild.remove();
    const { upkeep, ...health } = info.health;
    const summary = el("div"); summary.id = "table-health";
    healthSentences(health).forEach((line) => summary.appendChild(el("p", line)));
    view.appendChild(summary);
    view.appendChild(facts({
      location: info.location, "current snapshot": info.current_snapshot_id ?? "none",
      "data files": `${health.data_files.toLocaleString()} (${health.small_files.toLocaleString()} small), ${bytes(health.avg_file_bytes)} on average`,
      "delete files": `${health.delete_files.toLocaleString()}, deleting ${health.deleted_rows.toLocaleString()} rows (${(100 * health.deleted_share).toFixed(1)}% of the data files' rows)`,
      "oldest snapshot": when(health.oldest_snapshot_ms), metadata: bytes(health.metadata_bytes),
    }));
    view.appendChild(el("h2", "Schema"));
    view.appendChild(grid(info.schema.fields.map((f) => ({ id: f.id, name: f.name, type: typeName(f.type), required: f.required }))));
    view.appendChild(el("h2", "Partition spec"));
    view.appendChild(grid(info.partition_spec.fields.map((f) => ({ name: f.name, source_id: f["source-id"], transform: f.transform }))));
    view.appendChild(el("h2", "Recent snapshots"));
    view.appendChild(snapshotTimeline(info.snapshots));
    view.appendChild(grid(info.snapshots.map((x) => ({
      snapshot_id: x.snapshot_id, time: when(x.timestamp_ms), operation: x.summary.operation,
      added_records: x.summary["added-records"], registered_files: x.summary["calve.registered-files"],
      watermark: x.summary["calve.watermark"], fence: x.summary["calve.fence"] }))));
    view.appendChild(el("h2", "Files registered from elsewhere (latest 20)"));
    const { registrations } = await api(path + "/files?limit=20");
    const registered = grid(registrations.map((r) => ({ path: r.path, rows: r.rows, bytes: bytes(r.bytes), when: when(r.at * 1000), receipt: r.receipt })));
    registered.id = "table-registrations";
    view.appendChild(registrations.length ? registered : el("p", "None: POST Parquet files to " + path + "/files to register them."));
    view.appendChild(el("h2", "Upkeep"));
    view.appendChild(grid(Object.entries(upkeep || {}).map(([task, { at_ms: at, ...run }]) => ({ task, when: when(at), ...run }))));
    view.appendChild(el("h2", "Rows (first 50)"));
    view.appendChild(rowsPreview(path));
  } catch (e) { view.replaceChildren(el("h2", `Table ${name}`)); fail(view, e); }
}

// The first 50 rows, or the first 50 that match a filter (the API checks it and names what is wrong).
// An Iceberg type as the pipeline definitions spell it (`map<string, string>`), not as JSON.
function typeName(type) {
  if (typeof type === "string") return type;
  if (type.type === "map") return `map<${typeName(type.key)}, ${typeName(type.value)}>`;
  if (type.type === "list") return `list<${typeName(type.element)}>`;
  if (type.type === "struct") return `struct<${type.fields.map((f) => `${f.name}: ${typeName(f.type)}`).join(", ")}>`;
  return JSON.stringify(type);
}

// The snapshots on a time axis, oldest left: a mark each, coloured by operation, its summary in
// a tooltip; the table below has the same snapshots in full.
function snapshotTimeline(snapshots) {
  const figure = el("figure", undefined, "chart"); figure.id = "snapshot-timeline";
  if (!snapshots.length) return figure;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 1000 30");
  svg.setAttribute("preserveAspectRatio", "none");
  const times = snapshots.map((x) => x.timestamp_ms);
  const first = Math.min(...times), span = Math.max(1, Math.max(...times) - first);
  snapshots.forEach((x) => {
    const mark = document.createElementNS(ns, "rect");
    mark.setAttribute("x", String(5 + ((x.timestamp_ms - first) / span) * 985));
    mark.setAttribute("y", "4"); mark.setAttribute("width", "5"); mark.setAttribute("height", "22");
    mark.setAttribute("class", "op-" + (x.summary.operation || "other"));
    const tip = document.createElementNS(ns, "title");
    tip.textContent = `${x.snapshot_id} ${when(x.timestamp_ms)} ${x.summary.operation}: ` +
      `+${x.summary["added-records"] || 0} −${x.summary["deleted-records"] || 0} records`;
    mark.appendChild(tip);
    svg.appendChild(mark);
  });
  figure.append(el("figcaption", `${plural(snapshots.length, "snapshot")}, from ${ago(first)} to ${ago(first + span)}: ` +
    "append (blue), overwrite (orange: row changes, compaction), delete (red)"), svg);
  return figure;
}

function rowsPreview(path) {
  const box = el("div");
  const form = el("form"); form.id = "row-filter";
  const input = el("input"); input.name = "filter"; input.size = 60;
  input.placeholder = "level = 'error' and status >= 500";
  const apply = el("button", "Filter"); apply.type = "submit";
  form.append(input, " ", apply);
  const rows = el("div"); rows.id = "rows";
  const load = async () => {
    rows.replaceChildren(el("p", "loading…"));
    const filter = input.value.trim();
    try {
      const preview = await api(path + "/rows?limit=50" + (filter ? "&filter=" + encodeURIComponent(filter) : ""));
      rows.replaceChildren(...(preview.note ? [el("p", preview.note)] : []), grid(preview.rows));
    } catch (e) { rows.replaceChildren(); fail(rows, e); }
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
  box.append(form, rows);
  load();
  return box;
}

const NEW_PIPELINE = `name: orders
source: {http: {path: /orders}}
sinks:
  - table: orders
    auto_create: true
    schema:
      columns:
        - {name: id, type: string, required: true}
        - {name: amount, type: double}
`;

async function pipelinesPage() {
  const view = page("Pipelines");
  view.appendChild(el("p", "Click a pipeline to edit it, or write a new one below."));
  try {
    const { pipelines } = await api("/v1/pipelines");
    view.appendChild(grid(pipelines.map((p) => ({
      name: p.name, version: p.builtin ? "built-in" : p.version, path: p.path,
      processors: (p.definition.processors || []).length, routes: Object.keys(p.definition.routes || {}).join(", "),
      tables: p.definition.sinks.map((s) => s.table).join(", ") })), (row) => {
      const edit = el("a", "edit"); edit.href = "#pipeline/" + encodeURIComponent(row.name);
      return [edit];
    }));
  } catch (e) { fail(view, e); return; }
  view.appendChild(el("h2", "New pipeline"));
  view.appendChild(editor(NEW_PIPELINE, (text) => api("/v1/pipelines", { method: "POST", body: text, contentType: "application/yaml" })));
}

// A definition in a text box (YAML or JSON), saved by `save(text)`; a 422's field errors are
// listed under the box, each naming its field.
function editor(text, save) {
  const box = el("div");
  const area = el("textarea");
  area.id = "definition"; area.rows = 16; area.cols = 80; area.spellcheck = false; area.value = text;
  const problems = el("ul", undefined, "err"); problems.id = "definition-errors";
  const outcome = el("p"); outcome.id = "definition-outcome";
  const saveButton = button("Save", async () => {
    problems.replaceChildren(); outcome.textContent = "saving…"; outcome.className = "";
    try {
      const saved = await save(area.value);
      outcome.textContent = `saved ${saved.name} version ${saved.version}; its path is ${saved.path}`;
    } catch (e) {
      outcome.textContent = e.message; outcome.className = "err";
      e.errors.forEach((problem) => problems.appendChild(el("li", `${problem.field}: ${problem.error}`)));
    }
  });
  saveButton.id = "save-definition";
  box.append(area, el("br"), saveButton, outcome, problems);
  return box;
}

// Two versions of a pipeline compared: the server's unified diff, each line as text.
function versionsDiff(name, current) {
  const box = el("div"); box.id = "pipeline-versions";
  const pick = (label, chosen) => {
    const select = el("select"); select.name = label;
    for (let v = 1; v <= current; v++) {
      const option = el("option", `version ${v}`); option.value = String(v); option.selected = v === chosen; select.appendChild(option);
    }
    return select;
  };
  const older = pick("from", current - 1);
  const newer = pick("to", current);
  const shown = el("pre"); shown.id = "pipeline-diff";
  const compare = button("Compare", async () => {
    try {
      const { diff } = await api(`/v1/pipelines/${encodeURIComponent(name)}/diff?from=${older.value}&to=${newer.value}`);
      shown.replaceChildren(...(diff ? diff.split("\n") : ["(no difference)"]).map((line) => {
        const kind = line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
        return el("span", line + "\n", kind);
      }));
    } catch (e) { shown.replaceChildren(); fail(box, e); }
  });
  compare.id = "compare-versions";
  box.append(el("h2", "Versions"), older, " → ", newer, compare, shown);
  return box;
}

async function pipelinePage(name) {
  const view = page(`Pipeline ${name}`);
  try {
    const pipeline = await api("/v1/pipelines/" + encodeURIComponent(name));
    view.appendChild(facts({ version: pipeline.builtin ? "built-in" : pipeline.version, path: pipeline.path }));
    view.appendChild(el("p", "Edit the definition (JSON is YAML too) and save a new version:"));
    view.appendChild(editor(JSON.stringify(pipeline.definition, null, 2),
      (text) => api("/v1/pipelines/" + encodeURIComponent(name), { method: "PUT", body: text, contentType: "application/yaml" })));
    if (!pipeline.builtin && pipeline.version > 1) view.appendChild(versionsDiff(name, pipeline.version));
    if (!pipeline.builtin) {
      view.appendChild(button("Delete this pipeline", async () => {
        if (!confirm(`Delete pipeline ${name}? Its path stops taking events; its versions stay readable.`)) return;
        try { await api("/v1/pipelines/" + encodeURIComponent(name), { method: "DELETE" }); location.hash = "#pipelines"; } catch (e) { fail(view, e); }
      }));
    }
  } catch (e) { fail(view, e); }
}

let dlqFilter = { pipeline: "", table: "", reason: "" };

function filterQuery(filter) {
  return Object.entries(filter).filter(([, v]) => v).map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join("&");
}

// One dead letter whole: every field, and its event pretty-printed when it is JSON (as text:
// nothing in it is ever markup), with a replay of it alone.
function showDeadLetter(detail, entry) {
  let event = entry.event;
  try { event = JSON.stringify(parseExact(entry.event), null, 2); } catch { /* not JSON: shown as it came */ }
  const fields = el("dl", undefined, "facts");
  Object.entries(entry).filter(([key]) => key !== "event").forEach(([key, value]) => {
    fields.append(el("dt", key), el("dd", value === null || value === undefined ? "" : String(value)));
  });
  const outcome = el("p"); outcome.id = "dlq-entry-outcome";
  const replay = button("Replay this one", async () => {
    try {
      const answer = await api("/v1/dlq/replay", { method: "POST", body: { ids: [entry.dlq_id] } });
      outcome.textContent = `replayed ${answer.replayed}; waiting for the commit…`;
      const statuses = await Promise.all(Object.values(answer.receipts).map(followReceipt));
      outcome.textContent = `replayed ${answer.replayed}: receipt ${Object.values(answer.receipts).join(", ")} ${statuses.join(", ")}`;
    } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
  });
  detail.replaceChildren(el("h2", `Dead letter ${entry.dlq_id}`), fields, el("pre", event), replay, outcome);
  detail.scrollIntoView();
}

async function dlqPage() {
  const view = page("Dead letters");
  const form = el("form"); form.id = "dlq-filter";
  const inputs = Object.keys(dlqFilter).map((key) => {
    const input = el("input"); input.name = key; input.value = dlqFilter[key];
    input.placeholder = key === "reason" ? "reason contains" : key;
    form.append(input, " ");
    return input;
  });
  const apply = el("button", "Filter"); apply.type = "submit";
  form.appendChild(apply);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    inputs.forEach((input) => { dlqFilter[input.name] = input.value.trim(); });
    dlqPage();
  });
  view.appendChild(form);
  const query = filterQuery(dlqFilter);
  try {
    const { entries, next_cursor } = await api("/v1/dlq?limit=50" + (query ? "&" + query : ""));
    view.appendChild(el("p", `first ${entries.length}${next_cursor ? ", more exist" : ""}; tick entries and replay them through their pipeline's current version`));
    const boxes = [];
    view.appendChild(grid(entries.map((e) => ({
      failed_at: e.failed_at, pipeline: e.pipeline, table: e.table, reason: e.reason, event: e.event, receipt: e.receipt })), (_row, index) => {
      const box = el("input"); box.type = "checkbox"; box.value = entries[index].dlq_id; boxes.push(box);
      return [box, button("View", () => showDeadLetter(detail, entries[index]))];
    }));
    const detail = el("div"); detail.id = "dlq-entry";
    view.appendChild(detail);
    const outcome = el("p"); outcome.id = "replay-outcome";
    const replay = button("Replay selected", async () => {
      const ids = boxes.filter((b) => b.checked).map((b) => b.value);
      if (!ids.length) { outcome.textContent = "Tick the entries to replay first."; return; }
      try {
        const answer = await api("/v1/dlq/replay", { method: "POST", body: { ids } });
        outcome.textContent = `replayed ${answer.replayed}; waiting for the commit…`;
        const statuses = await Promise.all(Object.values(answer.receipts).map(followReceipt));
        outcome.textContent = `replayed ${answer.replayed}: receipt ${Object.values(answer.receipts).join(", ")} ${statuses.join(", ")}`;
      } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
    });
    replay.id = "replay";
    const matching = Object.fromEntries(Object.entries(dlqFilter).filter(([, v]) => v));
    const replayAll = button("Replay all matching", async () => {
      if (!query) { outcome.textContent = "Set a filter first: replaying needs at least one."; return; }
      try {
        const answer = await api("/v1/dlq/replay", { method: "POST", body: matching });
        outcome.textContent = `replayed ${answer.replayed}; waiting for the commit…`;
        const statuses = await Promise.all(Object.values(answer.receipts).map(followReceipt));
        outcome.textContent = `replayed ${answer.replayed}: ${statuses.join(", ") || "nothing to wait for"}`;
      } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
    });
    const purge = button("Purge matching", async () => {
      if (!query) { outcome.textContent = "Set a filter first (purging everything is DELETE /v1/dlq?all=true in the API)."; return; }
      if (!confirm("Delete every DLQ entry matching the filter? They cannot be replayed afterwards.")) return;
      try {
        const answer = await api("/v1/dlq?" + query, { method: "DELETE" });
        outcome.textContent = `purged ${answer.deleted}`;
        dlqPage();
      } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
    });
    purge.id = "purge";
    view.append(replay, replayAll, purge, outcome);
  } catch (e) { fail(view, e); }
}

// One tenant's limits: a value replaces the tenant's own, an empty field sets it back to the default.
function limitsForm(tenant) {
  const form = el("form"); form.id = "tenant-limits";
  form.appendChild(el("h2", `Limits of ${tenant.name}`));
  const fields = ["max_events_per_s", "max_bytes_per_s", "max_backlog_events"].map((key) => {
    const input = el("input"); input.name = key; input.type = "number"; input.min = "1";
    input.placeholder = `${key} (empty: default)`;
    if (tenant[key] !== null && tenant[key] !== undefined) input.value = String(tenant[key]);
    form.append(el("label", key), input, " ");
    return input;
  });
  const save = el("button", "Save"); save.type = "submit";
  const outcome = el("p"); outcome.id = "tenant-limits-outcome";
  form.append(save, button("Back", () => tenantsPage()), outcome);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = {};
    fields.forEach((input) => { body[input.name] = input.value ? Number(input.value) : null; });
    try {
      await api(`/v1/tenants/${encodeURIComponent(tenant.name)}`, { method: "PATCH", body });
      tenantsPage();
    } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
  });
  return form;
}

// The prefixes a tenant registers Parquet files written elsewhere from, one per line; saving
// replaces the grant (an empty box takes it back). Those configured at start are shown, not edited.
async function landingForm(tenant) {
  const form = el("form"); form.id = "tenant-landing";
  form.appendChild(el("h2", `Landing prefixes of ${tenant.name}`));
  const where = `/v1/tenants/${encodeURIComponent(tenant.name)}/landing-prefixes`;
  const outcome = el("p"); outcome.id = "tenant-landing-outcome";
  const box = el("textarea"); box.name = "prefixes"; box.rows = 5; box.cols = 70;
  box.placeholder = "s3://landing/acme/ (one per line)";
  try {
    const current = await api(where);
    box.value = current.granted.join("\n");
    if (current.configured.length) form.appendChild(el("p", `Configured at start (CALVE_LANDING_PREFIXES): ${current.configured.join(", ")}`));
  } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
  const save = el("button", "Save"); save.type = "submit";
  form.append(box, el("br"), save, button("Back", () => tenantsPage()), outcome);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const prefixes = box.value.split("\n").map((line) => line.trim()).filter((line) => line);
    try {
      const answer = await api(where, { method: "PUT", body: { prefixes } });
      box.value = answer.granted.join("\n");
      outcome.className = "";
      outcome.textContent = answer.granted.length ? `granted: ${answer.granted.join(", ")}` : "nothing granted";
    } catch (e) { outcome.textContent = e.message; outcome.className = "err"; }
  });
  return form;
}

// The tenants page's previous look: events per second are the counters' change since then.
let tenantsLook = null;

async function tenantsPage() {
  const view = page("Tenants (operator token)");
  try {
    const { tenants } = await api("/v1/tenants");
    const look = { at: Date.now(), counts: Object.fromEntries(tenants.map((t) => [t.name, [t.received_events, t.committed_events]])) };
    const before = tenantsLook && look.at - tenantsLook.at < 600_000 ? tenantsLook : null;
    tenantsLook = look;
    const rate = (name, which) => {
      const then = before && before.counts[name];
      if (!then) return "–";
      return Math.max(0, (look.counts[name][which] - then[which]) / Math.max(0.001, (look.at - before.at) / 1000)).toFixed(1);
    };
    view.appendChild(el("p", before
      ? `Events per second since the previous look, ${Math.round((look.at - before.at) / 1000)} s ago (counters since the processes started).`
      : "Refresh to see events per second (the change of each counter between two looks)."));
    view.appendChild(button("Refresh", () => tenantsPage()));
    view.lastChild.id = "tenants-refresh";
    view.appendChild(grid(tenants.map((t) => ({
      name: t.name, disabled: t.disabled, backlog_events: t.backlog_events, "received /s": rate(t.name, 0),
      "committed /s": rate(t.name, 1), received_events: t.received_events,
      committed_events: t.committed_events, max_events_per_s: t.max_events_per_s,
      max_bytes_per_s: t.max_bytes_per_s, max_backlog_events: t.max_backlog_events, created_at: t.created_at })), (row) => [
      button(row.disabled ? "Enable" : "Disable", async () => {
        if (!row.disabled && !confirm(`Disable tenant ${row.name}? Its tokens stop working at once.`)) return;
        try { await api(`/v1/tenants/${encodeURIComponent(row.name)}/${row.disabled ? "enable" : "disable"}`, { method: "POST" }); tenantsPage(); } catch (e) { fail(view, e); }
      }),
      button("Limits", () => view.replaceChildren(limitsForm(row))),
      button("Landing prefixes", async () => view.replaceChildren(await landingForm(row))),
    ]));
  } catch (e) { fail(view, e); return; }
  view.appendChild(el("h2", "New tenant"));
  const form = el("form"); form.id = "new-tenant";
  const fields = ["name", "max_events_per_s", "max_bytes_per_s", "max_backlog_events"].map((key) => {
    const input = el("input"); input.name = key; input.placeholder = key === "name" ? "name" : `${key} (empty: default)`;
    if (key !== "name") { input.type = "number"; input.min = "1"; }
    form.append(input, " ");
    return input;
  });
  const submit = el("button", "Create"); submit.type = "submit";
  form.appendChild(submit);
  const created = el("div"); created.id = "new-tenant-token";
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = {};
    fields.forEach((input) => { if (input.value) body[input.name] = input.name === "name" ? input.value.trim() : Number(input.value); });
    try {
      const answer = await api("/v1/tenants", { method: "POST", body });
      const shown = el("code", answer.admin_token); shown.id = "tenant-token-value";
      created.replaceChildren(el("p", `Tenant ${answer.tenant.name} created. Its first admin token, shown this once:`), shown,
        button("Copy", () => navigator.clipboard.writeText(answer.admin_token)));
    } catch (e) { created.replaceChildren(el("p", e.message, "err")); }
  });
  view.append(form, created);
}

// A receipt's status once it is settled (committed or failed), or after a minute of waiting.
async function followReceipt(id) {
  for (let i = 0; i < 60; i++) {
    const receipt = await api("/v1/receipts/" + encodeURIComponent(id));
    if (receipt.status === "committed" || receipt.status === "failed") return receipt.status;
    await sleep(1000);
  }
  return "still pending (look again at /v1/receipts/" + id + ")";
}

async function tokensPage() {
  const view = page("Tokens");
  const created = el("div"); created.id = "new-token";
  try {
    const { tokens } = await api("/v1/tokens");
    view.appendChild(grid(tokens.map((t) => ({
      id: t.id, prefix: t.prefix, scopes: t.scopes, pipelines: t.pipelines, label: t.label,
      expires_at: t.expires_at, last_used_at: t.last_used_at, revoked_at: t.revoked_at })), (row) => row.revoked_at ? [] : [
      button("Revoke", async () => {
        if (!confirm(`Revoke token ${row.prefix}…? Requests with it are refused at once.`)) return;
        try { await api("/v1/tokens/" + row.id, { method: "DELETE" }); tokensPage(); } catch (e) { fail(view, e); }
      }),
    ]));
  } catch (e) { fail(view, e); return; }
  view.appendChild(el("h2", "New token"));
  const form = el("form");
  const scopes = ["ingest", "read", "consume", "files", "admin"].map((scope) => {
    const box = el("input"); box.type = "checkbox"; box.value = scope; box.checked = scope === "ingest";
    const label = el("label"); label.append(box, " " + scope + " ");
    form.appendChild(label);
    return box;
  });
  const label = el("input"); label.placeholder = "label (who uses it)"; label.id = "token-label";
  const pipelines = el("input"); pipelines.placeholder = "pipelines (comma-separated; empty: all)";
  const days = el("input"); days.type = "number"; days.min = "1"; days.placeholder = "expires in days (empty: never)";
  form.append(label, " ", pipelines, " ", days, " ");
  const submit = el("button", "Create"); submit.type = "submit"; submit.id = "create-token";
  form.appendChild(submit);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { scopes: scopes.filter((b) => b.checked).map((b) => b.value), label: label.value };
    if (pipelines.value.trim()) body.pipelines = pipelines.value.split(",").map((p) => p.trim()).filter(Boolean);
    if (days.value) body.expires_in_s = Math.round(Number(days.value) * 86400);
    try {
      const token = await api("/v1/tokens", { method: "POST", body });
      const shown = el("code", token.token); shown.id = "token-value";
      created.replaceChildren(el("p", "The new token, shown this once: copy it now."), shown,
        button("Copy", () => navigator.clipboard.writeText(token.token)));
    } catch (e) { created.replaceChildren(el("p", e.message, "err")); }
  });
  view.append(form, created);
}

async function tryPage() {
  const view = page("Try it");
  view.appendChild(el("p", "Send events to a pipeline and see the answer once they are committed (wait=true)."));
  const select = el("select"); select.id = "try-path";
  try {
    const { pipelines } = await api("/v1/pipelines");
    pipelines.filter((p) => p.path).forEach((p) => { const o = el("option", `${p.path} (${p.name})`); o.value = p.path; select.appendChild(o); });
  } catch (e) { fail(view, e); return; }
  const area = el("textarea"); area.id = "try-events"; area.rows = 8; area.cols = 80;
  area.value = '{"id": "1", "msg": "hello"}\n{"id": "2", "msg": "world"}';
  const answer = el("pre"); answer.id = "try-answer";
  const send = button("Send", async () => {
    answer.textContent = "sending…";
    try {
      const result = await api(select.value + "?wait=true&timeout=60", { method: "POST", body: area.value, contentType: "application/x-ndjson" });
      answer.textContent = JSON.stringify(result, null, 2);
    } catch (e) { answer.textContent = e.message; }
  });
  send.id = "try-send";
  view.append(select, el("br"), area, el("br"), send, answer);
}

function route() {
  stopSampling();
  if (!sessionStorage.getItem(TOKEN_KEY)) return;
  const hash = decodeURIComponent(location.hash.slice(1));
  if (hash === "overview") return overviewPage();
  if (hash.startsWith("table/")) return tablePage(hash.slice("table/".length));
  if (hash.startsWith("pipeline/")) return pipelinePage(hash.slice("pipeline/".length));
  if (hash === "pipelines") return pipelinesPage();
  if (hash === "dlq") return dlqPage();
  if (hash === "tokens") return tokensPage();
  if (hash === "tenants") return tenantsPage();
  if (hash === "try") return tryPage();
  return tablesPage();
}

function signedIn(yes) {
  $("nav").hidden = !yes;
  $("signout").hidden = !yes;
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    signedIn(true);
    route();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    signedIn(false);
    $("view").replaceChildren(el("p", "Signed out."));
  });
  window.addEventListener("hashchange", route);
  // A reload keeps the tab's token and the page it was on.
  if (sessionStorage.getItem(TOKEN_KEY)) { signedIn(true); route(); }
});

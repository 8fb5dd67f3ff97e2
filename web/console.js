// Calve console: a page per resource behind the hash (#tables, #table/NAME, #pipelines, #dlq).
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

async function api(path) {
  const answer = await fetch(path, { headers: { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) } });
  const text = await answer.text();
  let body;
  try { body = parseExact(text); } catch { body = { detail: text || answer.statusText }; }
  if (!answer.ok) {
    const hint = answer.status === 401 ? " Sign in with a valid token." : answer.status === 403 ? " This token's scopes do not allow it." : "";
    throw new Error(`${answer.status}: ${body.detail || answer.statusText}.${hint}`);
  }
  return body;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function show(value) {
  if (value === null || value === undefined) return "∅";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function grid(rows) {
  if (!rows.length) return el("p", "none");
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  Object.keys(rows[0]).forEach((k) => head.appendChild(el("th", k)));
  const body = table.createTBody();
  rows.forEach((row) => { const tr = body.insertRow(); Object.values(row).forEach((v) => tr.appendChild(el("td", show(v)))); });
  return table;
}

function facts(pairs) {
  const dl = el("dl", undefined, "facts");
  Object.entries(pairs).forEach(([k, v]) => { dl.appendChild(el("dt", k)); dl.appendChild(el("dd", show(v))); });
  return dl;
}

function page(title) {
  const view = $("view");
  view.replaceChildren(el("h2", title));
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("current", location.hash.startsWith(a.getAttribute("href"))));
  return view;
}

function fail(view, error) {
  view.appendChild(el("p", error.message, "err"));
}

async function tablesPage() {
  const view = page("Tables");
  try {
    const { tables } = await api("/v1/tables");
    if (!tables.length) { view.appendChild(el("p", "No tables yet: POST events to /logs.")); return; }
    const list = el("div", undefined, "list");
    tables.forEach((name) => { const a = el("a", name); a.href = "#table/" + encodeURIComponent(name); list.appendChild(a); });
    view.appendChild(list);
  } catch (e) { fail(view, e); }
}

async function tablePage(name) {
  const view = page(`Table ${name}`);
  view.appendChild(el("p", "loading…"));
  try {
    const path = "/v1/tables/" + encodeURIComponent(name);
    const [info, preview] = await Promise.all([api(path), api(path + "/rows?limit=50")]);
    view.lastChild.remove();
    const { upkeep, ...health } = info.health;
    view.appendChild(facts({ location: info.location, current_snapshot_id: info.current_snapshot_id, ...health }));
    view.appendChild(el("h2", "Schema"));
    view.appendChild(grid(info.schema.fields.map((f) => ({ id: f.id, name: f.name, type: f.type, required: f.required }))));
    view.appendChild(el("h2", "Partition spec"));
    view.appendChild(grid(info.partition_spec.fields.map((f) => ({ name: f.name, source_id: f["source-id"], transform: f.transform }))));
    view.appendChild(el("h2", "Recent snapshots"));
    view.appendChild(grid(info.snapshots.map((x) => ({
      snapshot_id: x.snapshot_id, time: new Date(x.timestamp_ms).toISOString(), operation: x.summary.operation,
      added_records: x.summary["added-records"], watermark: x.summary["calve.watermark"], fence: x.summary["calve.fence"] }))));
    view.appendChild(el("h2", "Upkeep"));
    view.appendChild(grid(Object.entries(upkeep || {}).map(([task, run]) => ({ task, ...run }))));
    view.appendChild(el("h2", "Rows (first 50)"));
    view.appendChild(grid(preview.rows));
  } catch (e) { view.replaceChildren(el("h2", `Table ${name}`)); fail(view, e); }
}

async function pipelinesPage() {
  const view = page("Pipelines");
  try {
    const { pipelines } = await api("/v1/pipelines");
    view.appendChild(grid(pipelines.map((p) => ({
      name: p.name, version: p.builtin ? "built-in" : p.version, path: p.path,
      processors: (p.definition.processors || []).length, routes: Object.keys(p.definition.routes || {}).join(", "),
      tables: p.definition.sinks.map((s) => s.table).join(", ") }))));
    const details = el("details");
    details.append(el("summary", "definitions"), el("pre", pipelines.map((p) => JSON.stringify(p.definition, null, 2)).join("\n\n")));
    view.appendChild(details);
  } catch (e) { fail(view, e); }
}

async function dlqPage() {
  const view = page("Dead letters");
  try {
    const { entries, next_cursor } = await api("/v1/dlq?limit=50");
    view.appendChild(el("p", `first ${entries.length}${next_cursor ? ", more exist" : ""}`));
    view.appendChild(grid(entries.map((e) => ({
      failed_at: e.failed_at, pipeline: e.pipeline, table: e.table, reason: e.reason, event: e.event, receipt: e.receipt }))));
  } catch (e) { fail(view, e); }
}

function route() {
  if (!sessionStorage.getItem(TOKEN_KEY)) return;
  const hash = decodeURIComponent(location.hash.slice(1));
  if (hash.startsWith("table/")) return tablePage(hash.slice("table/".length));
  if (hash === "pipelines") return pipelinesPage();
  if (hash === "dlq") return dlqPage();
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

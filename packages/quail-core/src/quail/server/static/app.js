// The page of `quail serve`: write SQL, run / explain / cancel it, watch each model node's progress, read the rows
// (paged), the plan, the report, and a chart when the result is a label and a number per row. Plain JavaScript; the
// token (when the server asks for one) comes from the address's #token=… and is sent as a Bearer header.
"use strict";

const PAGE_ROWS = 50;
const CHART_ROWS = 40;
const $ = (id) => document.getElementById(id);
const state = { job: null, page: 0, total: 0, columns: [] };

function token() {
  const found = new URLSearchParams(location.hash.slice(1)).get("token");
  if (found) {
    sessionStorage.setItem("quail-token", found);
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("quail-token");
}
const TOKEN = token();

function headers(extra) {
  const all = Object.assign({ "Accept": "application/json" }, extra || {});
  if (TOKEN) all["Authorization"] = "Bearer " + TOKEN;
  return all;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const value = await response.json();
  if (!response.ok) throw Object.assign(new Error(value.error.message), { body: value.error });
  return value;
}

function statement() {
  return { sql: $("sql").value, dialect: $("dialect").value };
}

function setStatus(text) { $("status").textContent = text; }

function showError(error) {
  const box = $("error");
  const body = error.body || { kind: "Error", message: String(error.message || error) };
  let text = body.kind + ": " + body.message;
  box.textContent = text;
  box.hidden = false;
  box.dataset.kind = body.kind;
  if (body.line != null && body.column != null) {
    box.dataset.line = body.line;
    box.dataset.column = body.column;
    selectPosition(body.line, body.column);
  }
}

function clearError() {
  const box = $("error");
  box.hidden = true;
  box.textContent = "";
  delete box.dataset.line;
  delete box.dataset.column;
  delete box.dataset.kind;
}

function selectPosition(line, column) {
  const lines = $("sql").value.split("\n");
  let offset = 0;
  for (let i = 0; i < Math.min(line - 1, lines.length); i++) offset += lines[i].length + 1;
  offset += Math.max(0, column - 1);
  $("sql").focus();
  $("sql").setSelectionRange(offset, Math.min(offset + 1, $("sql").value.length));
}

function showTab(name) {
  for (const button of document.querySelectorAll(".tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== "tab-" + name;
}

// -- tables and the engine ---------------------------------------------------------------------------------------

async function loadServer() {
  try {
    const info = await api("GET", "/v1/info");
    $("engine").textContent = `${info.model} on ${info.backend} (${info.device}), compute ${info.compute}`;
    $("dialect").value = info.dialect;
    const listed = await api("GET", "/v1/tables");
    const list = $("tables");
    list.replaceChildren();
    for (const table of listed.tables) {
      const item = document.createElement("li");
      item.dataset.table = table.name;
      const name = document.createElement("div");
      name.className = "table-name";
      name.textContent = table.name;
      name.addEventListener("click", () => insert(table.name));
      item.append(name);
      for (const column of table.columns) {
        const chip = document.createElement("span");
        chip.className = "column";
        chip.textContent = column.name;
        chip.title = column.type || "";
        chip.addEventListener("click", () => insert(column.name));
        item.append(chip);
      }
      list.append(item);
    }
  } catch (error) {
    $("engine").textContent = "not connected";
    showError(error);
  }
}

function insert(text) {
  const area = $("sql");
  const start = area.selectionStart, end = area.selectionEnd;
  area.setRangeText(text, start, end, "end");
  area.focus();
}

// -- explain, run, cancel ----------------------------------------------------------------------------------------

async function explain() {
  clearError();
  setStatus("planning…");
  try {
    const plan = await api("POST", "/v1/explain", statement());
    $("plan").textContent = plan.explain;
    showTab("plan");
    setStatus("plan ready (nothing ran)");
  } catch (error) {
    setStatus("");
    showError(error);
  }
}

async function run() {
  clearError();
  $("progress").replaceChildren();
  $("results").replaceChildren();
  $("report").replaceChildren();
  $("rows-shown").textContent = "";
  setStatus("submitting…");
  let job;
  try {
    job = await api("POST", "/v1/queries", statement());
  } catch (error) {
    setStatus("");
    showError(error);
    return;
  }
  state.job = job.id;
  $("run").disabled = true;
  $("cancel").disabled = false;
  try {
    const last = await follow(job.id);
    await finish(last);
  } catch (error) {
    showError(error);
  } finally {
    $("run").disabled = false;
    $("cancel").disabled = true;
  }
}

async function cancel() {
  if (!state.job) return;
  $("cancel").disabled = true;
  setStatus("cancelling…");
  try {
    await api("POST", `/v1/queries/${state.job}/cancel`, {});
  } catch (error) {
    showError(error);
  }
}

// The job's server-sent events, read from a fetch (EventSource cannot send the token): each block a snapshot.
async function follow(id) {
  const response = await fetch(`/v1/queries/${id}/events`, { headers: headers({ "Accept": "text/event-stream" }) });
  if (!response.ok) {
    const value = await response.json();
    throw Object.assign(new Error(value.error.message), { body: value.error });
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let last = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      last = JSON.parse(data);
      showProgress(last);
    }
  }
  if (!last) throw new Error("the server closed the event stream before the query finished");
  return last;
}

function showProgress(snapshot) {
  const words = { queued: "queued", running: "running", finished: "finished", failed: "failed", cancelled: "cancelled" };
  let status = words[snapshot.state] || snapshot.state;
  if (snapshot.state === "queued" && snapshot.queue_position != null) status += ` (${snapshot.queue_position} ahead)`;
  setStatus(status);
  const box = $("progress");
  for (const node of snapshot.progress) {
    let row = box.querySelector(`[data-node="${CSS.escape(node.node)}"]`);
    if (!row) {
      row = document.createElement("div");
      row.className = "node";
      row.dataset.node = node.node;
      const label = document.createElement("span");
      label.textContent = node.description;
      const bar = document.createElement("progress");
      const count = document.createElement("span");
      count.className = "count";
      row.append(label, bar, count);
      box.append(row);
    }
    const bar = row.querySelector("progress");
    bar.max = Math.max(node.total, 1);
    bar.value = node.done;
    row.querySelector(".count").textContent = `${node.done} / ${node.total}`;
  }
}

async function finish(snapshot) {
  if (snapshot.state === "failed") {
    showError({ body: snapshot.error });
    return;
  }
  if (snapshot.state === "cancelled") {
    setStatus("cancelled");
    return;
  }
  $("plan").textContent = snapshot.explain;
  showReport(snapshot.report);
  state.total = snapshot.rows;
  state.page = 0;
  await showPage();
  const wall = snapshot.report.wall_s;
  setStatus(`finished: ${snapshot.rows} row(s) in ${wall.toFixed(2)} s`);
  showTab("results");
}

// -- rows, report, chart -----------------------------------------------------------------------------------------

async function showPage() {
  const offset = state.page * PAGE_ROWS;
  const page = await api("GET", `/v1/queries/${state.job}/result?format=json&offset=${offset}&limit=${PAGE_ROWS}`);
  state.columns = page.columns;
  const table = $("results");
  table.replaceChildren();
  const head = table.createTHead().insertRow();
  for (const column of page.columns) {
    const cell = document.createElement("th");
    cell.textContent = column.name;
    cell.title = column.type;
    head.append(cell);
  }
  const body = table.createTBody();
  for (const row of page.rows) {
    const line = body.insertRow();
    for (const value of row) {
      const cell = line.insertCell();
      cell.textContent = value === null ? "NULL" : (typeof value === "object" ? JSON.stringify(value) : String(value));
      if (typeof value === "number") cell.className = "number";
    }
  }
  const last = Math.min(offset + PAGE_ROWS, page.total);
  $("rows-shown").textContent = page.total ? `rows ${offset + 1}–${last} of ${page.total}` : "no rows";
  $("previous").disabled = state.page === 0;
  $("next").disabled = last >= page.total;
  if (state.page === 0) drawChart(page);
}

function showReport(report) {
  const list = $("report");
  list.replaceChildren();
  const minimum = report.minimum_tokens;
  const entries = [
    ["wall", seconds(report.wall_s)],
    ["engine boot", report.boot_kind ? `${report.boot_kind}${report.boot_s != null ? ", " + seconds(report.boot_s) : ""}` : "no model work"],
    ["estimated", seconds(report.estimated_seconds)],
    ["speed of light", seconds(report.sol_seconds)],
    ["fresh tokens", count(report.fresh_tokens)],
    ["cached tokens", count(report.cached_tokens)],
    ["minimum tokens", count(minimum)],
    ["fresh / minimum", minimum ? (report.fresh_tokens / minimum).toFixed(3) : "–"],
    ["answers", report.answers ? `${count(report.answers.stored)} stored, ${count(report.answers.computed)} computed` : "–"],
    ["backend", `${report.backend} · ${report.model} · ${report.device}`],
  ];
  for (const [name, value] of entries) {
    const term = document.createElement("dt");
    term.textContent = name;
    const detail = document.createElement("dd");
    detail.textContent = value;
    detail.dataset.key = name;
    list.append(term, detail);
  }
}

function seconds(value) { return value == null ? "–" : `${value.toFixed(value < 10 ? 2 : 1)} s`; }
function count(value) { return value == null ? "–" : value.toLocaleString("en"); }

const NUMERIC = /^(u?int\d+|double|float|halffloat|decimal)/;

function drawChart(page) {
  const chart = $("chart");
  const label = page.columns.findIndex((c) => !NUMERIC.test(c.type));
  const value = page.columns.length - 1 - [...page.columns].reverse().findIndex((c) => NUMERIC.test(c.type));
  if (label < 0 || value >= page.columns.length || page.total < 2 || page.total > CHART_ROWS) {
    chart.textContent = "A chart appears when the result has a label and a number per row (at most " + CHART_ROWS + " rows).";
    return;
  }
  const rows = page.rows;
  const top = Math.max(...rows.map((r) => Number(r[value]) || 0), 1e-9);
  const width = 640, bar = 18, gap = 6, left = 180;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", rows.length * (bar + gap) + 10);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${page.columns[value].name} by ${page.columns[label].name}`);
  rows.forEach((row, i) => {
    const y = i * (bar + gap) + 5;
    const number = Number(row[value]) || 0;
    const text = document.createElementNS(svg.namespaceURI, "text");
    text.setAttribute("x", left - 8);
    text.setAttribute("y", y + bar * 0.72);
    text.setAttribute("text-anchor", "end");
    text.textContent = String(row[label]).slice(0, 28);
    const rect = document.createElementNS(svg.namespaceURI, "rect");
    rect.setAttribute("x", left);
    rect.setAttribute("y", y);
    rect.setAttribute("height", bar);
    rect.setAttribute("width", Math.max(1, (width - left - 60) * number / top));
    rect.setAttribute("fill", "#2d6cdf");
    const amount = document.createElementNS(svg.namespaceURI, "text");
    amount.setAttribute("x", left + Math.max(1, (width - left - 60) * number / top) + 4);
    amount.setAttribute("y", y + bar * 0.72);
    amount.textContent = String(number);
    svg.append(text, rect, amount);
  });
  chart.replaceChildren(svg);
}

// -- wiring ------------------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("run").addEventListener("click", run);
  $("explain").addEventListener("click", explain);
  $("cancel").addEventListener("click", cancel);
  $("previous").addEventListener("click", () => { state.page -= 1; showPage().catch(showError); });
  $("next").addEventListener("click", () => { state.page += 1; showPage().catch(showError); });
  for (const button of document.querySelectorAll(".tabs button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  $("sql").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); run(); }
  });
  loadServer();
});

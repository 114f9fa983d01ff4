// specdeck's monitor (/ui/monitor): the server's last hour from /ui/api/series, then each new second
// from /ui/api/live, drawn with uPlot. The page computes no figure: it plots the server's columns as
// they come (bytes are shown as GiB by the axes; the data stay the server's). Uses app.js's api(),
// readEvents(), sleep() and banner() (same page, same key).
"use strict";

const MON = {
  model: null, cols: null, units: {}, gpus: 0, period: 1, keep: 3600, charts: new Map(), ctl: null,
  status: null, restarts: 0,
};
const GIB = 2 ** 30;
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0550ae", "#6e7781"];

// Each plot: its title, unit, and series (a column name, or a prefix ending in ":" for a column a
// drafter, a slot or a GPU adds); `dash`: a limit line.
function plots(gpus) {
  const out = [
    { id: "speed", title: "Speed", unit: "tokens/s", series: [
      { col: "generated_tokens_per_second", label: "generated" }, { col: "prompt_tokens_per_second", label: "prompt" }] },
    { id: "ttft", title: "Time to first token", unit: "s", series: [
      { col: "ttft_p50_seconds", label: "p50" }, { col: "ttft_p95_seconds", label: "p95" }] },
    { id: "tbt", title: "Time between tokens", unit: "s", series: [
      { col: "tbt_p50_seconds", label: "p50" }, { col: "tbt_p95_seconds", label: "p95" }] },
    { id: "acceptance", title: "Acceptance rate", unit: "0-1", series: [
      { col: "acceptance_rate", label: "all drafters" }, { prefix: "acceptance_rate:" }] },
    { id: "accepted_length", title: "Mean accepted length", unit: "tokens / verify", series: [{ prefix: "mean_accepted_length:" }] },
    { id: "tokens_per_decode", title: "Tokens per target decode", unit: "tokens", series: [
      { col: "tokens_per_decode", label: "tokens / decode" }] },
    { id: "drafting", title: "Drafted and accepted", unit: "tokens/s", series: [
      { col: "drafted_tokens_per_second", label: "drafted" }, { col: "accepted_tokens_per_second", label: "accepted" }] },
    { id: "requests", title: "Requests", unit: "requests", series: [
      { col: "requests_running", label: "running" }, { col: "requests_waiting", label: "waiting" },
      { col: "slots", label: "slots", dash: true }, { col: "queue_limit", label: "queue limit", dash: true }] },
    { id: "context", title: "Context per slot", unit: "tokens", series: [
      { prefix: "context_tokens:", label: "slot " }, { col: "context_limit_tokens", label: "limit", dash: true }] },
  ];
  for (let i = 0; i < gpus; i++) {
    out.push(
      { id: "gpu_memory:" + i, title: "GPU " + i + " memory", unit: "GiB", bytes: true, series: [
        { col: "gpu_memory_used_bytes:" + i, label: "used" }, { col: "gpu_memory_total_bytes:" + i, label: "total", dash: true },
        { col: "vram_planned_bytes", label: "plan", dash: true }] },
      { id: "gpu_temperature:" + i, title: "GPU " + i + " temperature", unit: "°C", series: [
        { col: "gpu_temperature_celsius:" + i, label: "temperature" },
        { col: "gpu_temperature_slowdown_celsius:" + i, label: "slowdown", dash: true }] },
      { id: "gpu_power:" + i, title: "GPU " + i + " power", unit: "W", series: [
        { col: "gpu_power_watts:" + i, label: "power" }, { col: "gpu_power_limit_watts:" + i, label: "limit", dash: true }] },
      { id: "gpu_utilization:" + i, title: "GPU " + i + " utilisation", unit: "0-1", series: [
        { col: "gpu_utilization_ratio:" + i, label: "busy" }] });
  }
  out.push(
    { id: "host_memory", title: "Host memory", unit: "GiB", bytes: true, series: [
      { col: "host_memory_used_bytes", label: "used" }, { col: "host_memory_total_bytes", label: "total", dash: true },
      { col: "process_rss_bytes", label: "specdeck" }] },
    { id: "host_cpu", title: "Host CPU", unit: "%", series: [{ col: "host_cpu_percent", label: "busy" }] });
  return out;
}

// the columns a plot draws, its prefixes expanded over the columns there are
function seriesOf(plot, cols) {
  const out = [];
  for (const s of plot.series) {
    if (s.col) { if (s.col in cols) out.push(s); continue; }
    for (const name of Object.keys(cols).filter((c) => c.startsWith(s.prefix)).sort()) {
      out.push({ col: name, label: (s.label || "") + name.slice(s.prefix.length) });
    }
  }
  return out;
}

function fmtValue(v, plot) {
  if (v === null || v === undefined) return "–";
  if (plot.bytes) return (v / GIB).toFixed(2);
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function lastValue(col) {
  const arr = MON.cols[col];
  for (let i = arr.length - 1; i >= 0 && i >= arr.length - 3; i--) if (arr[i] !== null) return arr[i];
  return null;
}

// -- the charts ------------------------------------------------------------------------------

function buildCharts() {
  for (const c of MON.charts.values()) c.uplot.destroy();
  MON.charts.clear();
  const grid = $("charts");
  grid.replaceChildren();
  if (!MON.gpus) {
    const d = document.createElement("div");
    d.className = "chart nogpu";
    d.dataset.testid = "no-gpu";
    d.textContent = "No GPU: NVML sees no card on this machine, so there is nothing to plot for its memory, " +
      "temperature, power or utilisation.";
    grid.append(d);
  }
  for (const plot of plots(MON.gpus)) {
    const series = seriesOf(plot, MON.cols);
    if (!series.length) continue;
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.testid = "chart-" + plot.id;
    const head = document.createElement("div");
    head.className = "chart-head";
    const title = document.createElement("b");
    title.textContent = plot.title + " (" + plot.unit + ")";
    const now = document.createElement("span");
    now.className = "now";
    now.dataset.testid = "now-" + plot.id;
    head.append(title, now);
    const area = document.createElement("div");
    box.append(head, area);
    grid.append(box);
    const opts = {
      width: Math.max(280, area.clientWidth || 420), height: 150, legend: { show: false }, cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: plot.unit === "0-1" ? { range: [0, 1] } : { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      axes: [{ stroke: "#8d96a0", grid: { stroke: "rgba(128,128,128,0.15)" } },
             { stroke: "#8d96a0", grid: { stroke: "rgba(128,128,128,0.15)" }, size: 52,
               values: (u, vals) => vals.map((v) => fmtValue(v, plot)) }],
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: (s.color = s.dash ? "#8d96a0" : COLORS[i % COLORS.length]), width: s.dash ? 1 : 1.5,
        dash: s.dash ? [6, 4] : undefined, points: { show: false }, spanGaps: false }))],
    };
    const u = new uPlot(opts, dataOf(series), area);
    MON.charts.set(plot.id, { plot, series, uplot: u, now });
  }
  refreshCharts();
}

function dataOf(series) {
  return [MON.cols.t, ...series.map((s) => MON.cols[s.col])];
}

function refreshCharts() {
  for (const c of MON.charts.values()) {
    c.uplot.setData(dataOf(c.series));
    c.now.replaceChildren(...c.series.map((s) => {
      const item = document.createElement("span");
      const mark = document.createElement("i");
      mark.textContent = s.dash ? "┄ " : "● ";
      mark.style.color = s.color;
      item.append(mark, s.label + " " + fmtValue(lastValue(s.col), c.plot));
      return item;
    }));
  }
}

function resizeCharts() {
  for (const c of MON.charts.values()) {
    const w = c.uplot.root.parentElement.clientWidth;
    if (w) c.uplot.setSize({ width: w, height: 150 });
  }
}

// -- the data --------------------------------------------------------------------------------

// A row (from /live or a gap fill) onto the columns: a new column starts with nulls; a jump in time
// (the server restarted, or the page was away) gets a null row so the line breaks there.
function addRow(row) {
  const cols = MON.cols;
  const n = cols.t.length;
  if (n && row.t <= cols.t[n - 1]) return false;  // seen already
  let rebuilt = false;
  for (const k of Object.keys(row)) {
    if (!(k in cols)) { cols[k] = new Array(n).fill(null); rebuilt = true; }
  }
  if (n && row.t - cols.t[n - 1] > 2.5 * MON.period) {
    for (const k of Object.keys(cols)) cols[k].push(k === "t" ? cols.t[n - 1] + MON.period : null);
    MON.gaps = (MON.gaps || 0) + 1;
  }
  for (const k of Object.keys(cols)) cols[k].push(k in row ? row[k] : null);
  while (cols.t.length && cols.t[0] < row.t - MON.keep) for (const k of Object.keys(cols)) cols[k].shift();
  return rebuilt;
}

async function loadSeries() {
  const s = await getJSON("/ui/api/series?model=" + encodeURIComponent(MON.model));
  MON.cols = s.columns;
  MON.units = s.units;
  MON.gpus = s.gpus;
  MON.period = s.period_s;
  MON.keep = s.keep_s;
  buildCharts();
  MON.shown = s.model;  // the charts are this model's now
}

// Follow /ui/api/live; when it breaks (the server stopped, the network), fill the gap from `since`
// the last row kept (the server sends the rows after it first) and go on.
async function followLive() {
  const ctl = MON.ctl = new AbortController();
  while (!ctl.signal.aborted) {
    try {
      const since = MON.cols.t.length ? MON.cols.t[MON.cols.t.length - 1] : 0;
      const r = await api("/ui/api/live?model=" + encodeURIComponent(MON.model) + "&since=" + since, { signal: ctl.signal });
      setMonConn("");
      await readEvents(r, (rows) => {
        let rebuilt = false;
        for (const row of rows) rebuilt = addRow(row) || rebuilt;
        if (rebuilt) buildCharts(); else refreshCharts();
      });
    } catch (e) {
      if (ctl.signal.aborted || e instanceof Refused) return;
    }
    setMonConn("reconnecting…");
    await sleep(1000);
  }
}

function setMonConn(text) {
  $("mon-conn").textContent = text;
  $("mon-conn").classList.toggle("down", !!text);
}

// -- beside the plots: models, plan, alerts, revision (from /v1/status, every 5 s) -------------

async function loadStatus() {
  let status = null;
  try {
    status = await getJSON("/v1/status?model=" + encodeURIComponent(MON.model));
  } catch (e) {
    if (e instanceof Refused) throw e;
  }
  MON.status = status;
  renderSide(status);
}

function cell(tag, text) {
  const el = document.createElement(tag);
  el.textContent = text;
  return el;
}

function renderSide(status) {
  const models = $("mon-models");
  models.replaceChildren(...state.models.map((m) => {
    const v = status && status.fleet ? status.fleet.find((f) => f.name === m.id) : null;
    let text = m.id + ": " + (v ? v.state : (m.status && m.status.value) || "?");
    if (v && v.expires_in !== null && v.expires_in !== undefined && v.state === "loaded") text += ", unloads in " + Math.round(v.expires_in) + " s";
    if (v && v.error) text += " (" + v.error + ")";
    const li = cell("li", text);
    li.dataset.testid = "mon-model-" + m.id;
    return li;
  }));
  const plan = $("mon-plan");
  plan.replaceChildren();
  if (status && status.plan) {
    for (const t of status.plan.terms) {
      const tr = document.createElement("tr");
      tr.append(cell("td", t.name), cell("td", (t.bytes / GIB).toFixed(2)), cell("td", t.where));
      plan.append(tr);
    }
    const tr = document.createElement("tr");
    tr.className = "total";
    tr.append(cell("td", "used of " + (status.plan.budget / GIB).toFixed(1) + " GiB (" + status.plan.device + ")"),
              cell("td", (status.plan.used / GIB).toFixed(2)), cell("td", ""));
    plan.append(tr);
  }
  const alerts = ((status && status.alerts) || []).filter((a) => a.active);
  $("mon-alerts").replaceChildren(...(alerts.length ? alerts.map((a) => cell("li", a.name + ": " + a.message)) :
    [cell("li", status ? "none raised" : "–")]));
  $("mon-revision").textContent = status ? (status.revision === null || status.revision === undefined ? "none (no saved configuration)" :
    "revision " + status.revision) + (status.fallback ? " (fallback)" : "") : "–";
}

// -- start -----------------------------------------------------------------------------------

async function startMonitor() {
  document.body.classList.add("monitor-view");
  try {
    await loadModels();
    const select = $("mon-model");
    const keep = MON.model || sessionStorage.getItem("specdeck.monitor.model");
    select.replaceChildren(...state.models.map((m) => { const o = cell("option", m.id); o.value = m.id; return o; }));
    if (keep && state.models.some((m) => m.id === keep)) select.value = keep;
    MON.model = select.value;
    await loadSeries();
    await loadStatus();
  } catch (e) {
    if (!(e instanceof Refused)) { banner("The server did not answer as expected: " + e.message + " (retrying)", 6000); await sleep(2000); startMonitor(); }
    return;
  }
  followLive();
}

async function pickModel() {
  MON.model = $("mon-model").value;
  sessionStorage.setItem("specdeck.monitor.model", MON.model);
  if (MON.ctl) MON.ctl.abort();
  await loadSeries();
  await loadStatus();
  followLive();
}

function wireMonitor() {
  $("mon-model").addEventListener("change", pickModel);
  window.addEventListener("resize", resizeCharts);
  setInterval(() => { if (MON.model && !state.down) loadStatus().catch(() => {}); }, 5000);
  window.specdeckMonitor = MON;  // the tests read the charts' data from here
}

// specdeck's chat page: conversations kept on the server (/ui/api/), answers written by the server as
// they stream (this page follows them and may leave and come back), and per message what speculation
// did. No build step: plain browser JavaScript over three vendored libraries (marked, DOMPurify,
// highlight.js). Untrusted text (the model's, imported conversations') reaches the page only through
// DOMPurify or textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem("specdeck.key") || localStorage.getItem("specdeck.key") || "",
  conversations: [], current: null, models: [], attachments: [], following: new Map(), search: "",
  defaults: {}, down: false, opening: null,
};
const SETTINGS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];

// -- the server ------------------------------------------------------------------------------

class Refused extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (state.key) headers["Authorization"] = "Bearer " + state.key;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  let r;
  try {
    r = await fetch(path, Object.assign({}, options, { headers }));
  } catch (e) {
    serverDown();
    throw e;
  }
  serverUp();
  if (r.status === 401) {
    askKey(state.key ? "That key was refused: check it and try again." : "");
    throw new Refused("key");
  }
  if (!r.ok) {
    let message = r.status + " " + r.statusText;
    try {
      const body = await r.json();
      message = (body.error && (body.error.message || body.error)) || message;
    } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return r;
}

async function getJSON(path, options) {
  return (await api(path, options)).json();
}

function serverDown() {
  if (state.down) return;
  state.down = true;
  $("conn").textContent = "server unreachable: retrying…";
  $("conn").classList.add("down");
  retryUntilUp();
}

function serverUp() {
  if (!state.down) return;
  state.down = false;
  $("conn").classList.remove("down");
  $("conn").textContent = "";
}

async function retryUntilUp() {
  while (state.down) {
    await sleep(2000);
    try {
      const r = await fetch("/health");
      if (r.status === 200 || r.status === 503) {
        serverUp();
        if (r.status === 503) banner("The models are loading…", 3000);
        await loadModels();
        await loadConversations();
        if (state.current) await openConversation(state.current.id);
      }
    } catch (e) { /* still down */ }
  }
}

function sleep(ms) { return new Promise((ok) => setTimeout(ok, ms)); }

function banner(text, ms) {
  const b = $("banner");
  b.textContent = text;
  b.classList.remove("hidden");
  if (ms) setTimeout(() => b.classList.add("hidden"), ms);
}

// -- the key ---------------------------------------------------------------------------------

function askKey(error) {
  $("key-error").textContent = error;
  $("key-error").classList.toggle("hidden", !error);
  if (!$("key-dialog").open) $("key-dialog").showModal();
}

async function useKey(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  state.key = key;
  sessionStorage.setItem("specdeck.key", key);
  if ($("remember").checked) localStorage.setItem("specdeck.key", key);
  else localStorage.removeItem("specdeck.key");
  $("key-dialog").close();
  $("forget-key").classList.remove("hidden");
  await start();
}

function forgetKey() {
  sessionStorage.removeItem("specdeck.key");
  localStorage.removeItem("specdeck.key");
  state.key = "";
  location.reload();
}

// -- models ----------------------------------------------------------------------------------

async function loadModels() {
  const list = await getJSON("/v1/models");
  const seen = new Set();
  state.models = list.data.filter((m) => !seen.has(m.id) && seen.add(m.id));
  const select = $("model");
  const keep = select.value || (state.current && state.current.model);
  select.replaceChildren(...state.models.map((m) => {
    const o = document.createElement("option");
    o.value = m.id;
    o.textContent = m.id + (m.status && m.status.value !== "loaded" ? " (" + m.status.value + ")" : "");
    return o;
  }));
  if (keep && state.models.some((m) => m.id === keep)) select.value = keep;
  showModelState();
}

function currentModel() {
  return state.models.find((m) => m.id === $("model").value) || state.models[0] || null;
}

function showModelState() {
  const m = currentModel();
  if (!m) return;
  const st = m.status ? m.status.value : "loaded";
  const meta = m.meta || {};
  $("model-state").textContent = (st === "loaded" ? "loaded" : st + ": it loads when you send") +
    " · context " + (meta.n_ctx || "?").toLocaleString() + (meta.vision ? " · images" : "") +
    (meta.note ? " · " + meta.note : "");
  checkAttachments();
}

async function loadDefaults() {
  const m = currentModel();
  if (!m || (m.status && m.status.value !== "loaded")) { state.defaults = {}; return; }  // /props would load it
  try {
    const props = await getJSON("/props?model=" + encodeURIComponent($("model").value));
    state.defaults = props.default_generation_settings || {};
  } catch (e) {
    state.defaults = {};
  }
}

function fillSettings(settings) {
  const d = state.defaults;
  const fallback = { temperature: d.temperature, top_p: d.top_p, top_k: d.top_k, min_p: d.min_p, max_tokens: "", seed: "" };
  for (const k of SETTINGS) {
    const v = settings && settings[k] !== undefined ? settings[k] : fallback[k];
    $(k).value = v === undefined || v === null || v === -1 ? "" : v;
  }
}

function readSettings() {
  const out = {};
  for (const k of SETTINGS) {
    const v = $(k).value;
    if (v !== "") out[k] = Number(v);
  }
  return out;
}

// -- conversations ---------------------------------------------------------------------------

async function loadConversations() {
  const q = state.search ? "?q=" + encodeURIComponent(state.search) : "";
  state.conversations = (await getJSON("/ui/api/conversations" + q)).conversations;
  renderList();
}

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren(...state.conversations.map((c) => {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    li.dataset.testid = "conversation";
    if (state.current && state.current.id === c.id) li.classList.add("active");
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = c.title;
    title.title = c.title;
    const rename = button("✎", "Rename", (e) => { e.stopPropagation(); renameConversation(c); });
    rename.dataset.testid = "rename";
    const del = button("✕", "Delete", (e) => { e.stopPropagation(); deleteConversation(c); });
    del.dataset.testid = "delete";
    li.append(title, rename, del);
    li.addEventListener("click", () => openConversation(c.id));
    return li;
  }));
}

function button(text, title, onclick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.title = title;
  b.addEventListener("click", onclick);
  return b;
}

function newConversation() {
  // a conversation is made on the server with its first message (sendTurn), not before
  state.current = null;
  state.opening = null;
  sessionStorage.removeItem("specdeck.conversation");
  renderList();
  renderConversation();
  $("input").focus();
}

async function createConversation() {
  state.current = await getJSON("/ui/api/conversations", { method: "POST", json: { model: $("model").value,
    system: $("system").value, settings: readSettings() } });
  return state.current;
}

async function openConversation(id) {
  state.opening = id; // the last one asked for wins: a click while the page opens the previous one at start
  const c = await getJSON("/ui/api/conversations/" + encodeURIComponent(id));
  if (state.opening !== id) return;
  state.current = c;
  sessionStorage.setItem("specdeck.conversation", id);
  if (state.current.model && state.models.some((m) => m.id === state.current.model)) $("model").value = state.current.model;
  $("system").value = state.current.system || "";
  fillSettings(state.current.settings);
  showModelState();
  renderList();
  renderConversation();
}

async function renameConversation(c) {
  const title = prompt("Rename the conversation", c.title);
  if (!title || !title.trim()) return;
  await api("/ui/api/conversations/" + c.id, { method: "PUT", json: { title: title.trim() } });
  if (state.current && state.current.id === c.id) state.current.title = title.trim();
  await loadConversations();
}

async function deleteConversation(c) {
  if (!confirm("Delete “" + c.title + "”?")) return;
  await api("/ui/api/conversations/" + c.id, { method: "DELETE" });
  if (state.current && state.current.id === c.id) {
    state.current = null;
    sessionStorage.removeItem("specdeck.conversation");
    renderConversation();
  }
  await loadConversations();
}

async function exportAll() {
  const blob = await (await api("/ui/api/export")).blob();
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "specdeck-conversations.jsonl";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function importFile() {
  const file = $("import-file").files[0];
  $("import-file").value = "";
  if (!file) return;
  try {
    const r = await getJSON("/ui/api/import", { method: "POST", body: await file.text(),
      headers: { "Content-Type": "application/x-ndjson" } });
    banner("Imported " + r.imported + " conversation(s).", 4000);
    await loadConversations();
  } catch (e) {
    if (!(e instanceof Refused)) banner("Import refused: " + e.message, 8000);
  }
}

// -- messages --------------------------------------------------------------------------------

function renderConversation() {
  const box = $("messages");
  if (!state.current || !state.current.messages.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = "Start a conversation: type below. Conversations are kept on this server.";
    box.replaceChildren(p);
    busy(false);
    return;
  }
  box.replaceChildren(...state.current.messages.map((m, i) => messageElement(m, i)));
  box.scrollTop = box.scrollHeight;
  for (const m of state.current.messages) {
    if (m.state === "streaming") follow(m.id);
  }
  busy(state.current.messages.some((m) => m.state === "streaming"));
}

function messageElement(m, index) {
  const el = document.createElement("div");
  el.className = "msg " + m.role;
  el.dataset.id = m.id;
  el.dataset.testid = "message-" + m.role;
  el.dataset.state = m.state;
  const who = document.createElement("div");
  who.className = "who";
  const name = document.createElement("span");
  name.textContent = m.role === "assistant" ? (m.stats && m.stats.model) || "assistant" : m.role;
  who.append(name);
  if (m.state && m.state !== "done") {
    const badge = document.createElement("span");
    badge.className = "badge " + m.state;
    badge.dataset.testid = "badge";
    badge.textContent = { streaming: "writing…", stopped: "stopped", interrupted: "interrupted: kept as far as it came",
      error: "error" }[m.state] || m.state;
    who.append(badge);
  }
  if (m.role === "assistant" && m.state !== "streaming") {
    const regen = button("↻ regenerate", "Answer this turn again", () => sendTurn({ at: index, content: null }));
    regen.dataset.testid = "regenerate";
    const cmp = button("⇆ compare", "Answer again with speculation on, then off, and show both speeds",
      () => sendTurn({ at: index, content: null, compare: true }));
    cmp.dataset.testid = "compare-again";
    const copy = button("copy", "Copy the answer", () => navigator.clipboard.writeText(m.content));
    who.append(regen, cmp, copy);
  }
  if (m.role === "user") {
    const edit = button("✎ edit", "Edit and resend", () => editMessage(m, index));
    edit.dataset.testid = "edit";
    who.append(edit);
  }
  const body = document.createElement("div");
  body.className = "body";
  el.append(who, body);
  fillBody(el, m);
  return el;
}

function fillBody(el, m) {
  const body = el.querySelector(".body");
  el.dataset.state = m.state;
  if (m.role !== "assistant") {
    body.textContent = m.content;
    for (const url of m.images || []) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "attached image";
      body.append(img);
    }
    return;
  }
  const parts = [];
  if (m.reasoning) {
    const d = document.createElement("details");
    d.className = "reasoning";
    d.dataset.testid = "reasoning";
    const s = document.createElement("summary");
    s.textContent = "Reasoning (" + m.reasoning.length.toLocaleString() + " characters)";
    const t = document.createElement("div");
    t.className = "text";
    t.textContent = m.reasoning;
    d.append(s, t);
    const old = body.querySelector("details.reasoning");
    if (old && old.open) d.open = true;
    parts.push(d);
  }
  const content = document.createElement("div");
  content.className = "content";
  content.dataset.testid = "content";
  content.innerHTML = markdown(m.content || "");
  for (const pre of content.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    if (code && window.hljs) window.hljs.highlightElement(code);
    const copy = button("copy", "Copy the code", () => navigator.clipboard.writeText(code ? code.textContent : pre.textContent));
    copy.className = "copy";
    pre.append(copy);
  }
  parts.push(content);
  for (const c of m.tool_calls || []) {
    const call = document.createElement("div");
    call.className = "call";
    call.dataset.testid = "tool-call";
    let args = c.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* as it came */ }
    call.textContent = "call " + (c.name || "?") + "(" + args + ")";
    parts.push(call);
  }
  if (m.state === "streaming" && !m.content && !m.reasoning) {
    const wait = document.createElement("div");
    wait.className = "muted";
    wait.textContent = waitingText(m.stats || {});
    parts.push(wait);
  }
  const stats = statsElement(m.stats || {}, m.state);
  if (stats) parts.push(stats);
  body.replaceChildren(...parts);
}

function waitingText(s) {
  if (s.error) return "";
  const p = s.prompt_progress;
  if (p && p.total) return "reading the prompt: " + p.processed.toLocaleString() + " of " + p.total.toLocaleString() + " tokens";
  const m = state.models.find((x) => x.id === s.model);
  if (m && m.status && m.status.value !== "loaded") return "loading " + m.id + "…";
  return "waiting for the first token…";
}

// Raw HTML in an answer is shown as text (a coding assistant's HTML is code, not markup), so only what
// markdown itself makes reaches DOMPurify; images in answers are not fetched (the server has none of
// them and the page loads nothing from elsewhere); links open in a new tab without a referrer.
let markdownReady = false;

function setUpMarkdown() {
  window.marked.use({ gfm: true, breaks: false, renderer: { html: (token) => escapeHTML(token.text || token.raw || "") } });
  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  markdownReady = true;
}

function markdown(text) {
  if (!window.marked || !window.DOMPurify) return escapeHTML(text);
  if (!markdownReady) setUpMarkdown();
  return window.DOMPurify.sanitize(window.marked.parse(text), { ADD_ATTR: ["target"],
    FORBID_TAGS: ["style", "form", "input", "textarea", "button", "img", "iframe", "svg", "math", "video", "audio"],
    FORBID_ATTR: ["style"] });
}

function escapeHTML(text) {
  const d = document.createElement("div");
  d.textContent = text;
  return d.innerHTML;
}

function fmt(x, digits) { return x === undefined || x === null ? "–" : Number(x).toFixed(digits); }

function statsElement(s, st) {
  if (s.error) {
    const e = document.createElement("div");
    e.className = "stats error";
    e.dataset.testid = "error";
    e.textContent = s.error;
    return e;
  }
  if (s.predicted_n === undefined) return null;
  const el = document.createElement("div");
  el.className = "stats";
  el.dataset.testid = "stats";
  const item = (label, value, key) => {
    const span = document.createElement("span");
    span.dataset.stat = key;
    const b = document.createElement("b");
    b.textContent = value;
    span.append(label + " ", b);
    el.append(span);
  };
  const live = st === "streaming";
  const usage = s.usage || {};
  if (!live) {
    const prompt = usage.prompt_tokens !== undefined ? usage.prompt_tokens : (s.prompt_n || 0) + (s.cache_n || 0);
    item("prompt", prompt.toLocaleString() + " (" + (s.cache_n || 0).toLocaleString() + " cached)", "prompt");
    item("first token", fmt((s.ttft_ms || 0) / 1000, 2) + " s", "ttft");
  }
  item(live ? "tokens/s (live)" : "tokens/s", fmt(s.predicted_per_second, 1), "tps");
  item("tokens", (s.predicted_n || 0).toLocaleString(), "tokens");
  item("tokens/decode", fmt(s.tokens_per_step, 2), "per_decode");
  const rate = s.draft_n ? " (" + Math.round(100 * s.draft_n_accepted / s.draft_n) + "%)" : "";
  item("drafted/accepted", (s.draft_n || 0) + "/" + (s.draft_n_accepted || 0) + rate, "drafts");
  const drafters = Object.keys(s.drafters || {});
  if (!live) item("drafter", s.speculative === false ? "off" : drafters.length ? drafters.join(", ") : "none drafted", "drafter");
  if (!live && usage.total_tokens !== undefined) {
    const m = state.models.find((x) => x.id === s.model) || currentModel();
    const nctx = m && m.meta ? m.meta.n_ctx : null;
    item("context", usage.total_tokens.toLocaleString() + (nctx ? " / " + nctx.toLocaleString() : ""), "context");
  }
  if (s.compare) {
    const c = document.createElement("span");
    c.className = "compare";
    c.dataset.testid = "compare";
    if (s.compare.running) c.textContent = "speculation off: running…";
    else if (s.compare.error) c.textContent = "speculation off: " + s.compare.error;
    else {
      const on = s.predicted_per_second, off = s.compare.predicted_per_second;
      c.textContent = "on " + fmt(on, 1) + " tok/s vs off " + fmt(off, 1) + " tok/s: " + fmt(on / off, 2) + "×" +
        (s.compare.same_text ? " (same text)" : " (texts differ)");
    }
    el.append(c);
  }
  return el;
}

// -- a turn ----------------------------------------------------------------------------------

function busy(on) {
  $("stop").classList.toggle("hidden", !on);
  $("send").disabled = on;
}

async function sendTurn(turn) {
  if (!state.current) await createConversation();
  const body = Object.assign({ model: $("model").value, system: $("system").value, settings: readSettings(),
    speculative: $("speculative").checked, compare: $("compare").checked }, turn);
  if ((body.images || []).length && !(currentModel() && currentModel().meta && currentModel().meta.vision)) {
    notice("This model has no vision projector: it cannot read images. Remove them, or pick a model that can.");
    return false;
  }
  try {
    const r = await getJSON("/ui/api/conversations/" + state.current.id + "/turns", { method: "POST", json: body });
    await openConversation(r.conversation);
    await loadConversations();
    return true;
  } catch (e) {
    if (!(e instanceof Refused)) notice(e.message);
    return false;
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("input").value;
  if (!text.trim() && !state.attachments.length) return;
  const ok = await sendTurn({ content: text, images: state.attachments.slice() });
  if (ok) {
    $("input").value = "";
    state.attachments = [];
    renderAttachments();
    notice("");
  }
}

function editMessage(m, index) {
  const text = prompt("Edit the message and send it again", m.content);
  if (text === null || !text.trim()) return;
  sendTurn({ at: index, content: text, images: m.images || [] });
}

async function follow(mid) {
  if (state.following.has(mid)) return;
  const ctl = new AbortController();
  state.following.set(mid, ctl);
  try {
    for (let tries = 0; tries < 1000; tries++) {
      try {
        const r = await api("/ui/api/messages/" + mid + "/events", { signal: ctl.signal });
        let last = null;
        await readEvents(r, (snaps) => { for (const snap of snaps) { last = snap; showSnapshot(snap); } });
        if (last && last.state !== "streaming") return;
      } catch (e) {
        if (ctl.signal.aborted || e instanceof Refused) return;
      }
      await sleep(1000);
    }
  } finally {
    state.following.delete(mid);
    if (state.current && ![...state.following.keys()].length) busy(false);
  }
}

// A server-sent event stream's data, read to its end: `onBatch` gets the events each read brought
// (parsed JSON, in order).
async function readEvents(response, onBatch) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    const events = buf.split("\n\n");
    buf = events.pop();
    const batch = [];
    for (const ev of events) {
      const line = ev.split("\n").find((l) => l.startsWith("data: "));
      if (line) batch.push(JSON.parse(line.slice(6)));
    }
    if (batch.length) onBatch(batch);
  }
}

function showSnapshot(snap) {
  if (!state.current) return;
  const m = state.current.messages.find((x) => x.id === snap.id);
  if (!m) return;
  Object.assign(m, snap);
  const el = document.querySelector('.msg[data-id="' + CSS.escape(snap.id) + '"]');
  if (!el) return;
  const box = $("messages");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  if (snap.state !== "streaming") {
    el.replaceWith(messageElement(m, state.current.messages.indexOf(m)));
    busy(false);
  } else {
    fillBody(el, m);
  }
  if (atEnd) box.scrollTop = box.scrollHeight;
}

async function stop() {
  if (!state.current) return;
  for (const m of state.current.messages) {
    if (m.state === "streaming") await api("/ui/api/messages/" + m.id + "/stop", { method: "POST" });
  }
}

// -- images ----------------------------------------------------------------------------------

function addImages(files) {
  for (const f of files) {
    if (!f.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.onload = () => { state.attachments.push(reader.result); renderAttachments(); };
    reader.readAsDataURL(f);
  }
}

function renderAttachments() {
  $("attachments").replaceChildren(...state.attachments.map((url, i) => {
    const d = document.createElement("div");
    d.className = "thumb";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "image to send";
    const x = button("✕", "Remove", () => { state.attachments.splice(i, 1); renderAttachments(); });
    d.append(img, x);
    return d;
  }));
  checkAttachments();
}

function checkAttachments() {
  const m = currentModel();
  if (state.attachments.length && m && !(m.meta && m.meta.vision)) {
    notice("This model has no vision projector: it cannot read images. Remove them, or pick a model that can.");
  } else if ($("notice").dataset.kind === "vision") {
    notice("");
  }
}

function notice(text) {
  $("notice").textContent = text;
  $("notice").dataset.kind = text.startsWith("This model has no vision") ? "vision" : "";
  $("notice").classList.toggle("hidden", !text);
}

// -- start -----------------------------------------------------------------------------------

function isMonitor() { return location.pathname === "/ui/monitor"; }

async function start() {
  if (isMonitor()) return startMonitor();
  try {
    await loadModels();
    await loadDefaults();
    fillSettings({});
    await loadConversations();
    const last = sessionStorage.getItem("specdeck.conversation");
    if (last && state.conversations.some((c) => c.id === last)) await openConversation(last);
    else renderConversation();
  } catch (e) {
    if (!(e instanceof Refused)) banner("The server did not answer as expected: " + e.message + " (retrying)", 6000);
    if (!(e instanceof Refused)) { await sleep(2000); start(); }
  }
}

function wire() {
  $("composer").addEventListener("submit", send);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("input").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])];
    if (files.length) { e.preventDefault(); addImages(files); }
  });
  const main = document.querySelector(".main.chat-only");
  main.addEventListener("dragover", (e) => { e.preventDefault(); main.classList.add("dropping"); });
  main.addEventListener("dragleave", () => main.classList.remove("dropping"));
  main.addEventListener("drop", (e) => { e.preventDefault(); main.classList.remove("dropping"); addImages(e.dataTransfer.files); });
  $("attach").addEventListener("change", () => { addImages($("attach").files); $("attach").value = ""; });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newConversation);
  $("search").addEventListener("input", () => { state.search = $("search").value; loadConversations(); });
  $("export").addEventListener("click", exportAll);
  $("import-file").addEventListener("change", importFile);
  $("key-form").addEventListener("submit", useKey);
  $("forget-key").addEventListener("click", forgetKey);
  $("forget-key").classList.toggle("hidden", !state.key);
  $("defaults").addEventListener("click", (e) => { e.preventDefault(); fillSettings({}); });
  $("model").addEventListener("change", async () => {
    showModelState();
    await loadDefaults();
    if (state.current) await api("/ui/api/conversations/" + state.current.id, { method: "PUT", json: { model: $("model").value } });
  });
  $("system").addEventListener("change", async () => {
    if (state.current) await api("/ui/api/conversations/" + state.current.id, { method: "PUT", json: { system: $("system").value } });
  });
  window.addEventListener("unhandledrejection", (e) => {
    if (!(e.reason instanceof Refused)) banner("Something went wrong: " + (e.reason && e.reason.message), 6000);
    e.preventDefault();
  });
  setInterval(() => { if (!state.down) loadModels().catch(() => {}); }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  wire();
  if (isMonitor()) wireMonitor();
  start();
});

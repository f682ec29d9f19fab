// otter_tx admin app: a single-page app over the management JSON API.
// Plain modern JavaScript, no framework, no build step.  Every value from the
// API is put on the page as text (textContent / createTextNode), never as HTML.
// Charts: uPlot (vendor/uplot, MIT), loaded by index.html as the global uPlot.

"use strict";

const STORE = window.sessionStorage;
const REFRESH_CHOICES = [[5, "every 5 s"], [10, "every 10 s"], [30, "every 30 s"], [60, "every 60 s"], [0, "paused"]];
// chart history asked of the API (contract: *_details.samples), seconds
// the charts' time ranges, as the RabbitMQ UI offers them ([age, incr] in seconds); the broker keeps an
// hour of history (docs/management.md, "Message rates"), so longer ranges are not offered
const RANGE_CHOICES = [["60|5", "Last minute"], ["600|5", "Last ten minutes"], ["3600|60", "Last hour"]];
function chartRange() {
  const v = STORE.getItem("otter.range");
  return RANGE_CHOICES.some(([r]) => r === v) ? v : RANGE_CHOICES[0][0];
}
function samplesQuery() {
  const [age, incr] = chartRange().split("|");
  return "lengths_age=" + age + "&lengths_incr=" + incr + "&msg_rates_age=" + age + "&msg_rates_incr=" + incr;
}
const COLORS = ["#2f6f8f", "#d9822b", "#4caf50", "#9c27b0", "#e53935", "#00897b", "#795548", "#607d8b",
  "#c0ca33", "#3949ab", "#f06292"];
const RATE_KEYS = ["publish", "confirm", "deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver", "ack",
  "return_unroutable", "drop_unroutable", "get_empty"];
const QUEUE_RATE_KEYS = ["publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver", "ack", "get_empty"];
const DEATH_KEYS = ["expired", "dead_lettered_expired", "dead_lettered_rejected", "dead_lettered_maxlen",
  "dead_lettered_delivery_limit", "delayed"];
const QUEUE_DEATH_KEYS = DEATH_KEYS.slice(0, 5); // a queue has no "delayed"
const QUEUE_ARGS = [["x-message-ttl", "number"], ["x-expires", "number"], ["x-max-length", "number"],
  ["x-max-length-bytes", "number"], ["x-overflow", "string"], ["x-dead-letter-exchange", "string"],
  ["x-dead-letter-routing-key", "string"], ["x-max-priority", "number"], ["x-single-active-consumer", "boolean"],
  ["x-queue-mode", "string"]];
const EXCHANGE_ARGS = [["alternate-exchange", "string"], ["x-delayed-type", "string"]];
// the definition keys each policy kind accepts: the overview's policy_keys replace these at login
let policyKeys = {"policies": ["dead-letter-exchange", "dead-letter-routing-key", "delivery-limit", "expires",
  "max-length", "max-length-bytes", "message-ttl", "overflow"],
"operator-policies": ["expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit"]};
const STRING_POLICY_KEYS = ["dead-letter-exchange", "dead-letter-routing-key", "overflow", "queue-mode",
  "alternate-exchange", "ha-mode", "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure"];
function policyKeyTypes(kind) {
  return (policyKeys[kind] || []).map((k) => [k, STRING_POLICY_KEYS.includes(k) ? "string" : "number"]);
}
// a delayed exchange's publish form: the delay headers (docs/delayed.md)
const DELAY_HEADERS = [["x-delay", "number"], ["x-delay-until", "number"]];
const DELAYED = "x-delayed-message";
const PAGE_SIZES = [20, 100, 500];
const ALL = "";
// RabbitMQ's UI names for the message_stats keys, and ours
const LABELS = {publish: "Publish", confirm: "Publisher confirm", deliver: "Deliver (manual ack)",
  deliver_no_ack: "Deliver (auto ack)", get: "Get (manual ack)", get_no_ack: "Get (auto ack)", get_empty: "Get (empty)",
  redeliver: "Redelivered", ack: "Consumer ack", return_unroutable: "Unroutable (return)",
  drop_unroutable: "Unroutable (drop)", expired: "Expired", dead_lettered_expired: "Dead-lettered (expired)",
  dead_lettered_rejected: "Dead-lettered (rejected)", dead_lettered_maxlen: "Dead-lettered (maxlen)",
  dead_lettered_delivery_limit: "Dead-lettered (delivery limit)", delayed: "Delayed", publish_in: "Publish (in)",
  publish_out: "Publish (out)"};

// --- DOM helpers ----------------------------------------------------------------

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value" || k === "checked") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  appendList(el, kids);
  return el;
}

function append(el, ...kids) { return appendList(el, kids); }

function appendList(el, kids) {
  for (const k of kids) {
    if (k === null || k === undefined || k === false) continue;
    if (Array.isArray(k)) appendList(el, k);
    else if (k instanceof Node) el.appendChild(k);
    else el.appendChild(document.createTextNode(String(k)));
  }
  return el;
}

function fill(el, ...kids) {
  el.replaceChildren();
  return appendList(el, kids);
}

function enc(s) { return encodeURIComponent(s); }
function fmtNum(n) { return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"); }
function fmtRate(d) { return d && typeof d.rate === "number" ? d.rate.toFixed(1) + "/s" : ""; }
function fmtByteRate(d) { return d && typeof d.rate === "number" ? fmtBytes(Math.round(d.rate)) + "/s" : ""; }
function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function fmtValue(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}
// every time on the page is UTC, "2026-11-26 16:05:08 UTC" (the charts' axes: "16:05:08")
function fmtTime(ms) { return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC"); }
function fmtClock(ms) { return new Date(ms).toISOString().slice(11, 19); }
// every duration on the page: "45 s", "4 min 2 s", "3 h 7 min", "2 d 5 h"
function fmtDuration(ms) {
  if (ms <= 0) return "0 s";
  const s = Math.ceil(ms / 1000);
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + (s % 60) + " s";
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return hrs + " h " + (m % 60) + " min";
  return Math.floor(hrs / 24) + " d " + (hrs % 24) + " h";
}
// "5 min" from now, or "2026-11-26 16:30[:00]" (UTC) -> epoch ms; NaN when neither
function parseWhen(text) {
  const t = text.trim();
  const rel = /^(?:in\s+)?(\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)$/i.exec(t);
  if (rel) {
    const unit = {s: 1000, m: 60000, h: 3600000, d: 86400000}[rel[2][0].toLowerCase()];
    return Date.now() + Number(rel[1]) * unit;
  }
  if (!/^\d{4}-\d\d-\d\d([ T]\d\d:\d\d(:\d\d)?)?( ?UTC|Z)?$/.test(t)) return NaN;
  const iso = t.replace(/ ?(UTC|Z)$/, "").replace(" ", "T");
  return Date.parse(iso.length === 10 ? iso + "T00:00:00Z" : iso + "Z");
}
function queueHref(v, n) { return "#/queues/" + enc(v) + "/" + enc(n); }
function exchangeHref(v, n) { return "#/exchanges/" + enc(v) + "/" + enc(n === "" ? "amq.default" : n); }

function table(headers, rows, emptyText) {
  if (!rows.length) return h("p", {class: "empty"}, emptyText || "(none)");
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((c) => h("th", {class: /^(Ready|Unacked|Total|Messages|Consumers|Channels|Prefetch|Priority|Delayed|Count|Port|Bytes|Value)/.test(c) ? "num" : null}, c)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => c instanceof Node ? h("td", {}, c) :
      h("td", {class: typeof c === "number" ? "num" : null}, typeof c === "number" ? fmtNum(c) : fmtValue(c)))))));
}

function kv(pairs) {
  return h("dl", {class: "kv"}, pairs.filter((p) => p).map(([k, v]) => [h("dt", {}, k),
    h("dd", {}, v instanceof Node ? v : fmtValue(v))]));
}

function tags(obj) {
  const out = [];
  for (const [k, v] of Object.entries(obj || {})) out.push(h("span", {class: "tag", title: k + ": " + fmtValue(v)}, k + "=" + fmtValue(v)));
  return out.length ? out : "";
}

function flash(text, kind) {
  let box = document.getElementById("flash");
  if (!box) { box = h("div", {id: "flash"}); document.body.appendChild(box); }
  const el = h("div", {class: kind || "error", role: kind === "ok" ? "status" : "alert"}, text);
  box.appendChild(el);
  setTimeout(() => el.remove(), kind === "ok" ? 4000 : 8000);
}

// --- API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, reason) { super(reason); this.status = status; this.reason = reason; }
}

let session = null; // {name, tags, auth}

async function api(method, path, body, extraHeaders) {
  const headers = Object.assign({"Authorization": session ? session.auth : ""}, extraHeaders || {});
  // credentials "omit": our own Authorization header is sent, but a 401 with a Basic challenge
  // (wrong password) comes back to us instead of opening the browser's login dialog
  const init = {method, headers, cache: "no-store", credentials: "omit"};
  if (body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  if (text) { try { data = JSON.parse(text); } catch (e) { data = text; } }
  if (!r.ok) {
    let reason = data && typeof data === "object" ? data.reason : null;
    if (reason === null || reason === undefined) reason = (data && data.error) || (r.status + " " + r.statusText);
    if (typeof reason !== "string") reason = JSON.stringify(reason);
    throw new ApiError(r.status, reason);
  }
  return data;
}

// run an action: flash its error (RabbitMQ's reason text) or success, then refresh the page,
// or go to ``thenGo`` (a hash) when the action removed what the page shows
async function act(fn, okText, thenGo) {
  try {
    const res = await fn();
    if (okText) flash(typeof okText === "function" ? okText(res) : okText, "ok");
    if (thenGo) location.hash = thenGo;
    else await refreshNow();
    return res;
  } catch (e) {
    flash(e instanceof ApiError ? e.reason : String(e));
    return undefined;
  }
}

function hasTag(...names) { return session && session.tags.some((t) => names.includes(t)); }

// --- state: vhost selection and refresh ---------------------------------------------------

let vhosts = [];
let current = null; // the mounted page: {refresh}
let timer = null;
let ticking = false;

function selectedVHost() { return STORE.getItem("otter.vhost") || ALL; }
function refreshSeconds() { const v = STORE.getItem("otter.refresh"); return v === null ? 5 : Number(v); }

function schedule() {
  if (timer) clearTimeout(timer);
  timer = null;
  const s = refreshSeconds();
  if (s > 0) timer = setTimeout(async () => { await refreshNow(); schedule(); }, s * 1000);
}

let again = false; // a refresh was asked for while one ran (after an action, a new page)

async function refreshNow() {
  if (!current) return;
  if (ticking) { again = true; return; }
  ticking = true;
  try { await current.refresh(); } catch (e) {
    if (e instanceof ApiError && e.status === 401 && e.reason === "Login failed") {
      logout("Login failed"); // the password changed or the user is gone: log in again
      return;
    }
    if (current && current.gone && e instanceof ApiError && [401, 403, 404].includes(e.status)) {
      showGone(current.gone, e);
      return;
    }
    flash(e instanceof ApiError ? e.reason : String(e));
  } finally {
    ticking = false;
    if (again && current) { again = false; await refreshNow(); }
  }
}

// A detail page whose object went (deleted, x-expires, auto-delete, a closed connection) or that the
// user may not see: one notice instead of the page, and no more refreshes of it.
// gone: {what, name, vhost (optional), back (the list's hash)}
function showGone(gone, err) {
  if (current && current.destroy) current.destroy();
  current = {refresh: async () => {}};
  const where = gone.vhost !== undefined ? " in virtual host " + gone.vhost : "";
  const text = err.status === 404 ?
    gone.what + " " + gone.name + where + " does not exist (any more): it was deleted or closed." :
    "You may not see " + gone.what.toLowerCase() + " " + gone.name + where + ": " + err.reason;
  fill(document.getElementById("page"), h("h1", {}, gone.what + " ", gone.name),
    h("p", {class: "gone", role: "status", "data-gone": String(err.status)}, text),
    h("p", {}, h("a", {href: gone.back}, "Back to the list")));
}

// --- charts --------------------------------------------------------------------------

// A line chart of several series: from the API's samples when it sends them,
// else from a history the page keeps while it is open.
class Chart {
  constructor(title, labels, unit) {
    this.title = title;
    this.labels = labels.map((l) => LABELS[l] || l);
    this.unit = unit || "";
    this.history = []; // [t seconds, ...values]
    this.plot = null;
    this.body = h("div", {class: "chart"});
    this.el = h("div", {}, h("h3", {}, title), this.body);
  }

  // details: one *_details object per label (may lack samples); values: the current values
  // (counts or rates) used for the client-side history; kind: "count" or "rate"
  update(details, values, kind) {
    this.current = values;
    let data = fromSamples(details, kind);
    if (!data) {
      const now = Date.now() / 1000;
      if (values.some((v) => typeof v === "number")) this.history.push([now, ...values.map((v) => (typeof v === "number" ? v : null))]);
      if (this.history.length > 240) this.history.shift();
      data = this.labels.map((_, i) => this.history.map((p) => p[i + 1]));
      data.unshift(this.history.map((p) => p[0]));
    }
    if (data[0].length < 2) {
      if (this.plot) { this.plot.destroy(); this.plot = null; }
      fill(this.body, h("div", {class: "nodata"}, "no data yet"));
      return;
    }
    if (!this.plot) {
      fill(this.body);
      const opts = {
        width: 540, height: 180, padding: [10, 28, 0, 0],
        series: [{}].concat(this.labels.map((l, i) => ({label: l, stroke: COLORS[i % COLORS.length], width: 1.5,
          // off the chart, the current values (as the page's numbers); on it, the values under the cursor
          value: (u, v, si) => {
            if ((u.cursor.idx === null || u.cursor.idx === undefined) && typeof this.current[si - 1] === "number") v = this.current[si - 1];
            return v === null || v === undefined ? "-" : v.toFixed(kind === "rate" ? 1 : 0) + this.unit;
          }}))),
        axes: [{values: (u, splits) => splits.map((t) => fmtClock(t * 1000)), label: "UTC", labelSize: 14}, {size: 55}],
        scales: {y: {range: (u, min, max) => [0, Math.max(1, max * 1.1)]}},
        legend: {live: true},
        // the legend shows the newest values (RabbitMQ's UI shows the current ones) when the cursor is not on the chart
        hooks: {ready: [newestLegend], setCursor: [newestLegend], setData: [newestLegend]},
      };
      this.plot = new window.uPlot(opts, data, this.body);
    } else {
      this.plot.setData(data);
    }
  }
}

function newestLegend(u) {
  if (u.cursor.idx === null || u.cursor.idx === undefined) {
    const n = u.data[0].length;
    if (n) u.setLegend({idx: n - 1});
  }
}

// [xs (s), ys...] from the samples of each details object (newest first), or null
function fromSamples(details, kind) {
  const first = details.find((d) => d && Array.isArray(d.samples) && d.samples.length >= 2);
  if (!first) return null;
  const stamps = first.samples.map((s) => s.timestamp).reverse();
  const series = details.map((d) => {
    const by = new Map(((d && d.samples) || []).map((s) => [s.timestamp, s.sample]));
    return stamps.map((t) => (by.has(t) ? by.get(t) : null));
  });
  if (kind !== "rate") return [stamps.map((t) => t / 1000), ...series];
  const xs = stamps.slice(1).map((t) => t / 1000);
  return [xs, ...series.map((ys) => ys.slice(1).map((y, i) => {
    const prev = ys[i];
    if (y === null || prev === null) return null;
    return Math.max(0, (y - prev) * 1000 / (stamps[i + 1] - stamps[i]));
  }))];
}

// ["Expired / dead-lettered", "Expired 3, Dead-lettered (maxlen) 1"] from message_stats, or null
function deathCounts(stats) {
  const parts = DEATH_KEYS.filter((k) => stats && typeof stats[k] === "number").map((k) => LABELS[k] + " " + fmtNum(stats[k]));
  return parts.length ? ["Expired / dead-lettered (total)", parts.join(", ")] : null;
}

function lengthCharts() { return new Chart("Queued messages", ["Ready", "Unacked", "Total"]); }

function updateLengths(chart, obj) {
  const keys = ["messages_ready", "messages_unacknowledged", "messages"];
  chart.update(keys.map((k) => obj && obj[k + "_details"]), keys.map((k) => obj && obj[k]), "count");
}

function updateRates(chart, stats, keys) {
  stats = stats || {};
  chart.update(keys.map((k) => stats[k + "_details"]), keys.map((k) => (stats[k + "_details"] || {}).rate), "rate");
}

// --- forms ----------------------------------------------------------------------------

function field(label, input) { return h("label", {}, h("span", {}, label), input); }
function textInput(name, value, attrs) { return h("input", Object.assign({type: "text", name, value: value || ""}, attrs || {})); }
function selectInput(name, options, value) {
  return h("select", {name}, options.map((o) => {
    const [v, t] = Array.isArray(o) ? o : [o, o];
    return h("option", {value: v, selected: v === value}, t);
  }));
}

// key / value / type rows; quick: [[key, type], ...] buttons adding a row
function argsEditor(quick, name) {
  const rows = h("div", {class: "args", "data-args": name || "arguments"});
  const addRow = (k, type, v) => {
    const row = h("div", {class: "row"},
      h("input", {type: "text", placeholder: "key", value: k || "", "data-k": "1"}),
      h("input", {type: "text", placeholder: "value", value: v || "", "data-v": "1"}),
      selectInput(null, [["string", "String"], ["number", "Number"], ["boolean", "Boolean"], ["json", "List / JSON"]], type || "string"),
      h("button", {type: "button", title: "remove", onclick: () => row.remove()}, "x"));
    rows.appendChild(row);
    return row;
  };
  addRow();
  const box = h("div", {},
    rows,
    h("div", {class: "quick"}, "Add: ", quick.map(([k, t]) => h("button", {type: "button", onclick: () => {
      const empty = [...rows.querySelectorAll(".row")].find((r) => !r.querySelector("[data-k]").value);
      if (empty) { empty.querySelector("[data-k]").value = k; empty.querySelector("select").value = t; }
      else addRow(k, t);
      addRow();
    }}, k)), h("button", {type: "button", onclick: () => addRow()}, "+ row")));
  box.read = () => {
    const out = {};
    for (const r of rows.querySelectorAll(".row")) {
      const k = r.querySelector("[data-k]").value.trim();
      const raw = r.querySelector("[data-v]").value;
      if (!k) continue;
      const type = r.querySelector("select").value;
      if (type === "number") {
        if (raw.trim() === "" || isNaN(Number(raw))) throw new Error("'" + k + "' must be a number");
        out[k] = Number(raw);
      } else if (type === "boolean") out[k] = raw.trim().toLowerCase() === "true";
      else if (type === "json") out[k] = JSON.parse(raw);
      else out[k] = raw;
    }
    return out;
  };
  box.reset = () => { rows.replaceChildren(); addRow(); };
  box.set = (obj) => {
    rows.replaceChildren();
    for (const [k, v] of Object.entries(obj)) {
      const type = typeof v === "number" ? "number" : typeof v === "boolean" ? "boolean" : typeof v === "string" ? "string" : "json";
      addRow(k, type, type === "json" ? JSON.stringify(v) : String(v));
    }
    addRow();
  };
  return box;
}

function form(title, fields, submitText, onsubmit) {
  const f = h("form", {class: "box"}, title ? h("h3", {}, title) : null, fields,
    h("div", {class: "actions"}, h("button", {type: "submit", class: "primary"}, submitText)));
  f.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try { await onsubmit(f); } catch (e) { flash(e instanceof ApiError ? e.reason : e.message || String(e)); }
  });
  return f;
}

function val(f, name) { const el = f.elements[name]; return el.type === "checkbox" ? el.checked : el.value; }

function vhostChoices(includeAll) {
  const opts = vhosts.map((v) => [v.name, v.name]);
  return includeAll ? [[ALL, "All"], ...opts] : opts;
}
function defaultVHost() { return selectedVHost() || (vhosts[0] && vhosts[0].name) || "/"; }

// AMQP timestamps are whole seconds since the epoch: the timestamp property and x-death's "time"
const SECONDS_KEYS = ["timestamp", "time"];

// a property or header value as RabbitMQ's UI shows it: a table (nested) for a table, an x-death list
// as one row per death, a list of scalars as "a, b"; key: its name (for epoch-seconds times)
function valueView(v, key) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) {
    if (v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) {
      const cols = [];
      for (const x of v) for (const k of Object.keys(x)) if (!cols.includes(k)) cols.push(k);
      return h("table", {class: "nested", "data-list": key || null},
        h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
        h("tbody", {}, v.map((x) => h("tr", {}, cols.map((c) => h("td", {}, valueView(x[c], c)))))));
    }
    return v.map((x) => fmtValue(x)).join(", ");
  }
  if (typeof v === "object") {
    return h("table", {class: "nested", "data-table": key || null}, h("tbody", {},
      Object.entries(v).map(([k, x]) => h("tr", {"data-key": k}, h("th", {}, k), h("td", {}, valueView(x, k))))));
  }
  if (typeof v === "number" && SECONDS_KEYS.includes(key) && v > 0) return fmtTime(v * 1000);
  return String(v);
}

function messagesView(msgs, browsing) {
  if (!msgs.length) return h("p", {class: "empty"}, browsing ? "No ready messages there" : "Queue is empty");
  return msgs.map((m, i) => h("div", {class: "msg", "data-message": String(i + 1)},
    h("b", {}, "Message " + (i + 1)),
    kv([["Exchange", m.exchange === "" ? "(AMQP default)" : m.exchange], ["Routing key", m.routing_key],
      ["Redelivered", String(m.redelivered)], [browsing ? "Ready messages after it" : "Messages left", m.message_count],
      ["Properties", valueView(Array.isArray(m.properties) ? {} : m.properties, "properties")],
      ["Payload", h("span", {}, m.payload_bytes + " bytes, encoding: " + m.payload_encoding)]]),
    h("pre", {class: "payload"}, m.payload)));
}

// headerQuick: [[key, type], ...] quick-add buttons for headers (a delayed exchange's x-delay)
function publishForm(vhost, exchange, fixedKey, headerQuick) {
  const headers = argsEditor(headerQuick || [], "headers");
  const props = argsEditor([["content_type", "string"], ["message_id", "string"], ["correlation_id", "string"],
    ["expiration", "string"], ["priority", "number"], ["reply_to", "string"], ["type", "string"]], "properties");
  return form("Publish message", [
    fixedKey === undefined ? field("Routing key", textInput("routing_key")) :
      h("p", {class: "muted"}, "Published through the default exchange with routing key '" + fixedKey + "'."),
    field("Delivery mode", selectInput("delivery_mode", [["1", "1 - Non-persistent"], ["2", "2 - Persistent"]], "1")),
    h("div", {}, h("b", {}, "Headers"), headers), h("div", {}, h("b", {}, "Properties"), props),
    field("Payload", h("textarea", {name: "payload"})),
  ], "Publish message", async (f) => {
    const properties = Object.assign({delivery_mode: Number(val(f, "delivery_mode"))}, props.read());
    const hdrs = headers.read();
    if (Object.keys(hdrs).length) properties.headers = hdrs;
    const rk = fixedKey === undefined ? val(f, "routing_key") : fixedKey;
    await act(() => api("POST", "/api/exchanges/" + enc(vhost) + "/" + enc(exchange === "" ? "amq.default" : exchange) + "/publish",
      {properties, routing_key: rk, payload: val(f, "payload"), payload_encoding: "string"}),
    (r) => (r && r.routed ? "Message published." : "Message published, but not routed."));
  });
}

// --- pages ----------------------------------------------------------------------------

function listPath(kind, vh) { return "/api/" + kind + (vh ? "/" + enc(vh) : ""); }

// A list page's filter and pager, as RabbitMQ's UI: a name filter (substring, or a regular expression,
// ignoring case), a page size, and the API's paging (?page=&page_size=&name=&use_regex=). The choices
// are kept for the browser tab (sessionStorage). box.query(): the query string for the current choices;
// box.show(answer): the pager for a paginated answer; box.page(items): the same wrapper made here for a
// list the API cannot filter (the channels of one vhost).
function listFilter(kind) {
  const key = "otter.filter." + kind;
  let st = {name: "", regex: false, size: 100, page: 1};
  try { Object.assign(st, JSON.parse(STORE.getItem(key) || "{}")); } catch (e) { /* the defaults */ }
  const save = () => STORE.setItem(key, JSON.stringify(st));
  const nameIn = h("input", {type: "search", name: "filter", value: st.name, placeholder: "Filter by name"});
  const regexIn = h("input", {type: "checkbox", name: "regex", checked: st.regex});
  const sizeSel = selectInput("page_size", PAGE_SIZES.map((n) => [String(n), n + " per page"]), String(st.size));
  let debounce = null;
  // a regular expression that does not compile is not sent (it would fail every refresh): the field says so
  const apply = () => {
    let bad = null;
    if (regexIn.checked) { try { new RegExp(nameIn.value); } catch (e) { bad = e.message; } }
    nameIn.classList.toggle("invalid", bad !== null);
    nameIn.title = bad === null ? "" : bad;
    if (bad !== null) return;
    st.name = nameIn.value; st.regex = regexIn.checked; st.page = 1; save(); refreshNow();
  };
  nameIn.addEventListener("input", () => { clearTimeout(debounce); debounce = setTimeout(apply, 300); });
  regexIn.addEventListener("change", apply);
  sizeSel.addEventListener("change", () => { st.size = Number(sizeSel.value); st.page = 1; save(); refreshNow(); });
  const pager = h("span", {class: "pages"});
  const box = h("div", {class: "filter"}, nameIn, h("label", {}, regexIn, " Regex"), sizeSel, pager);
  const go = (p) => () => { st.page = p; save(); refreshNow(); };
  box.query = () => "page=" + st.page + "&page_size=" + st.size + (st.name ? "&name=" + enc(st.name) + "&use_regex=" + st.regex : "");
  box.show = (d) => {
    if (d.page > d.page_count && d.page_count >= 1 && st.page !== d.page_count) { st.page = d.page_count; save(); again = true; }
    fill(pager, d.page_count > 1 ? [
      h("button", {type: "button", disabled: d.page <= 1, onclick: go(1)}, "First"),
      h("button", {type: "button", disabled: d.page <= 1, onclick: go(d.page - 1)}, "Previous"),
      h("span", {"data-page": String(d.page)}, "Page " + d.page + " of " + d.page_count),
      h("button", {type: "button", disabled: d.page >= d.page_count, onclick: go(d.page + 1)}, "Next"),
      h("button", {type: "button", disabled: d.page >= d.page_count, onclick: go(d.page_count)}, "Last")] : null,
    h("span", {class: "muted", "data-shown": String(d.item_count)}, fmtNum(d.filtered_count) + " " +
      (d.filtered_count === 1 ? "item" : "items") + (d.filtered_count !== d.total_count ? " (filtered from " + fmtNum(d.total_count) + ")" : "")));
  };
  box.page = (items) => {
    let rx = null;
    if (st.name && st.regex) { try { rx = new RegExp(st.name, "i"); } catch (e) { throw new ApiError(400, "invalid regex"); } }
    const name = st.name.toLowerCase();
    const kept = items.filter((i) => (rx ? rx.test(i.name) : String(i.name).toLowerCase().includes(name)));
    const count = Math.max(1, Math.ceil(kept.length / st.size));
    const pageItems = kept.slice((st.page - 1) * st.size, st.page * st.size);
    return {items: pageItems, item_count: pageItems.length, filtered_count: kept.length, total_count: items.length,
      page: st.page, page_count: count, page_size: st.size};
  };
  return box;
}

const pages = {};

// how many nodes /api/nodes lists (1 when the user may not see them: monitoring and administrators may)
async function clusterNodeCount() {
  if (!hasTag("administrator", "monitoring")) return 1;
  try { return (await api("GET", "/api/nodes")).length; } catch (e) { return 1; }
}

pages.overview = (root) => {
  const stats = h("div", {class: "stats"});
  const queued = lengthCharts();
  const rates = new Chart("Message rates", RATE_KEYS, "/s");
  const deaths = new Chart("Expired, dead-lettered by reason, delayed", DEATH_KEYS, "/s");
  const node = h("div"), listeners = h("div"), info = h("div");
  append(root, h("h1", {}, "Overview"), stats, h("div", {class: "grid"}, queued.el, rates.el, deaths.el),
    h("h2", {}, "Nodes"), node, h("h2", {}, "Listeners"), listeners, h("h2", {}, "Versions"), info);
  return {async refresh() {
    const o = await api("GET", "/api/overview?" + samplesQuery());
    const t = o.object_totals || {}, q = o.queue_totals || {};
    fill(stats, [["Connections", t.connections], ["Channels", t.channels], ["Exchanges", t.exchanges],
      ["Queues", t.queues], ["Consumers", t.consumers], ["Ready", q.messages_ready],
      ["Unacked", q.messages_unacknowledged], ["Total", q.messages]].map(([k, v]) =>
      h("div", {class: "stat"}, k, h("b", {}, fmtNum(v || 0)))));
    updateLengths(queued, q);
    updateRates(rates, o.message_stats, RATE_KEYS);
    updateRates(deaths, o.message_stats, DEATH_KEYS);
    fill(listeners, table(["Node", "Protocol", "Bound to", "Port"],
      (o.listeners || []).map((l) => [l.node, l.protocol, l.ip_address, String(l.port)])));
    fill(info, kv([["Product", o.product_name + " " + o.product_version], ["RabbitMQ API", o.rabbitmq_version],
      ["Cluster", o.cluster_name], ["Node", o.node]]));
    try {
      const nodes = await api("GET", "/api/nodes");
      fill(node, table(["Name", "Uptime", "Memory", "File descriptors", "Sockets", "Disk free", "Running"],
        nodes.map((n) => [n.name, n.uptime !== undefined ? fmtDuration(n.uptime) : "",
          n.mem_used !== undefined ? fmtBytes(n.mem_used) + (n.mem_limit ? " of " + fmtBytes(n.mem_limit) : "") : "",
          n.fd_used !== undefined ? n.fd_used + (n.fd_total ? " of " + n.fd_total : "") : "",
          n.sockets_used !== undefined ? n.sockets_used + (n.sockets_total ? " of " + n.sockets_total : "") : "",
          n.disk_free !== undefined ? fmtBytes(n.disk_free) : "",
          n.running === false ? h("span", {class: "down"}, "false") : "true"])));
    } catch (e) {
      fill(node, h("p", {class: "empty"}, "Node statistics not available: " + (e.reason || e)));
    }
  }};
};

pages.connections = (root) => {
  const list = h("div");
  const filter = listFilter("connections");
  append(root, h("h1", {}, "Connections"), filter, list);
  return {async refresh() {
    const vh = selectedVHost();
    const d = await api("GET", (vh ? "/api/vhosts/" + enc(vh) + "/connections" : "/api/connections") + "?" + filter.query());
    filter.show(d);
    const conns = d.items;
    fill(list, table(["Name", "Virtual host", "User", "State", "Protocol", "Client", "Channels", "From client", "To client"],
      conns.map((c) => [h("a", {href: "#/connections/" + enc(c.name)}, c.name), c.vhost, c.user, c.state, c.protocol,
        ((c.client_properties || {}).product || "") + " " + ((c.client_properties || {}).version || ""),
        c.channels, fmtByteRate(c.recv_oct_details), fmtByteRate(c.send_oct_details)])));
  }};
};

// A stream protocol connection's publishers and consumers (rabbitmq_stream_management's lists)
function streamPublisherTable(ps) {
  return table(["Publisher", "Stream", "Reference", "Published", "Confirmed", "Errored"],
    ps.map((p) => [p.publisher_id, h("a", {href: queueHref(p.queue.vhost, p.queue.name)}, p.queue.name), p.reference,
      p.published, p.confirmed, p.errored]), "No publishers");
}

function streamConsumerTable(cs) {
  return table(["Subscription", "Stream", "Properties", "Credits", "Consumed", "Offset", "Offset lag"],
    cs.map((c) => [c.subscription_id, h("a", {href: queueHref(c.queue.vhost, c.queue.name)}, c.queue.name),
      h("span", {}, tags(c.properties)), c.credits, c.consumed, c.offset, c.offset_lag]), "No consumers");
}

pages.connection = (root, [name]) => {
  const info = h("div"), chans = h("div"), chansHead = h("h2", {}, "Channels");
  const pubsHead = h("h2", {hidden: ""}, "Publishers"), pubs = h("div");
  const subsHead = h("h2", {hidden: ""}, "Consumers"), subs = h("div");
  append(root, h("h1", {}, "Connection ", name), info, chansHead, chans, pubsHead, pubs, subsHead, subs,
    h("h2", {}, "Close this connection"),
    form(null, [field("Reason", textInput("reason", "Closed via management plugin"))], "Force close", async (f) => {
      if (!window.confirm("Close connection " + name + "?")) return;
      await act(() => api("DELETE", "/api/connections/" + enc(name), undefined, {"X-Reason": val(f, "reason")}),
        "Connection closed.", "#/connections");
    }));
  return {gone: {what: "Connection", name, back: "#/connections"}, async refresh() {
    const c = await api("GET", "/api/connections/" + enc(name));
    fill(info, kv([["Virtual host", c.vhost], ["User", c.user], ["State", c.state], ["Protocol", c.protocol],
      ["Client", fmtValue(c.client_properties)], ["From", c.peer_host + ":" + c.peer_port],
      c.protocol === "stream" ? null : ["Channel max", c.channel_max], ["Frame max", c.frame_max], ["Heartbeat", c.timeout], ["TLS", String(!!c.ssl)]]));
    if (c.protocol === "stream") {
      // no channels: its publishers and consumers instead
      chansHead.hidden = true;
      pubsHead.hidden = false;
      subsHead.hidden = false;
      const base = "/api/stream/connections/" + enc(c.vhost) + "/" + enc(name);
      const [ps, cs] = await Promise.all([api("GET", base + "/publishers"), api("GET", base + "/consumers")]);
      fill(chans);
      fill(pubs, streamPublisherTable(ps));
      fill(subs, streamConsumerTable(cs));
      return;
    }
    const ch = await api("GET", "/api/connections/" + enc(name) + "/channels");
    fill(chans, channelTable(ch));
  }};
};

function channelHref(n) { return "#/channels/" + enc(n); }
function channelMode(c) { return (c.confirm ? "C" : "") + (c.transactional ? "T" : ""); }

function channelTable(chs) {
  return table(["Channel", "Virtual host", "User", "Mode", "State", "Unconfirmed", "Prefetch", "Unacked", "Consumers",
    "Publish", "Deliver / get", "Ack"],
  chs.map((c) => {
    const s = c.message_stats || {};
    return [h("a", {href: channelHref(c.name)}, c.name), c.vhost, c.user, channelMode(c), c.state,
      c.messages_unconfirmed, c.prefetch_count, c.messages_unacknowledged, c.consumer_count,
      fmtRate(s.publish_details), fmtRate(s.deliver_get_details), fmtRate(s.ack_details)];
  }));
}

pages.channels = (root) => {
  const list = h("div");
  const filter = listFilter("channels");
  append(root, h("h1", {}, "Channels"), filter, list);
  return {async refresh() {
    const vh = selectedVHost();
    // no per-vhost channel list in the API: one vhost's channels are filtered and paged here
    const d = vh ? filter.page((await api("GET", "/api/channels")).filter((c) => c.vhost === vh)) :
      await api("GET", "/api/channels?" + filter.query());
    filter.show(d);
    fill(list, channelTable(d.items));
  }};
};

const CHANNEL_RATE_KEYS = ["publish", "confirm", "deliver", "deliver_no_ack", "get", "get_no_ack", "ack", "redeliver",
  "return_unroutable", "drop_unroutable", "get_empty"];

pages.channel = (root, [name]) => {
  const info = h("div"), consumers = h("div");
  const rates = new Chart("Message rates", CHANNEL_RATE_KEYS, "/s");
  append(root, h("h1", {}, "Channel ", name), info, h("div", {class: "grid"}, rates.el), h("h2", {}, "Consumers"), consumers);
  return {
    gone: {what: "Channel", name, back: "#/channels"},
    async refresh() {
      const c = await api("GET", "/api/channels/" + enc(name) + "?" + samplesQuery());
      const conn = (c.connection_details || {}).name;
      fill(info, kv([["Connection", conn ? h("a", {href: "#/connections/" + enc(conn)}, conn) : ""],
        ["Virtual host", c.vhost], ["User", c.user], ["State", c.state],
        ["Mode", channelMode(c) === "" ? "(none)" : (c.confirm ? "confirm" : "") + (c.transactional ? "transactional" : "")],
        ["Prefetch count", c.prefetch_count], ["Global prefetch count", c.global_prefetch_count],
        ["Unacked", c.messages_unacknowledged], ["Unconfirmed", c.messages_unconfirmed],
        ["Uncommitted messages", c.messages_uncommitted], ["Uncommitted acks", c.acks_uncommitted]]));
      updateRates(rates, c.message_stats, CHANNEL_RATE_KEYS);
      fill(consumers, table(["Queue", "Consumer tag", "Ack required", "Exclusive", "Prefetch", "Arguments"],
        (c.consumer_details || []).map((x) => [x.queue ? h("a", {href: queueHref(x.queue.vhost, x.queue.name)}, x.queue.name) : "",
          x.consumer_tag, String(x.ack_required), String(x.exclusive), x.prefetch_count, h("span", {}, tags(x.arguments))]),
        "No consumers"));
    },
  };
};

let exchangeTypes = ["direct", "fanout", "headers", "topic", "x-delayed-message"];

function features(o) {
  const out = [];
  if (o.durable) out.push(h("span", {class: "tag", title: "durable"}, "D"));
  if (o.auto_delete) out.push(h("span", {class: "tag", title: "auto-delete"}, "AD"));
  if (o.internal) out.push(h("span", {class: "tag", title: "internal"}, "I"));
  if (o.exclusive) out.push(h("span", {class: "tag", title: "exclusive"}, "Excl"));
  for (const [k, v] of Object.entries(o.arguments || {})) out.push(h("span", {class: "tag", title: k + ": " + fmtValue(v)}, k.replace(/^x-/, "") + "=" + fmtValue(v)));
  return h("span", {}, out);
}

pages.exchanges = (root) => {
  const list = h("div");
  const filter = listFilter("exchanges");
  const args = argsEditor(EXCHANGE_ARGS);
  const typeSel = selectInput("type", exchangeTypes, "direct");
  append(root, h("h1", {}, "Exchanges"), filter, list, h("h2", {}, "Add a new exchange"),
    form(null, [field("Virtual host", selectInput("vhost", vhostChoices(false), defaultVHost())),
      field("Name", textInput("name", "", {required: true})), field("Type", typeSel),
      field("Durability", selectInput("durable", [["true", "Durable"], ["false", "Transient"]], "true")),
      field("Auto delete", selectInput("auto_delete", [["false", "No"], ["true", "Yes"]], "false")),
      field("Internal", selectInput("internal", [["false", "No"], ["true", "Yes"]], "false")),
      h("div", {}, h("b", {}, "Arguments"), args)], "Add exchange", async (f) => {
      const body = {type: val(f, "type"), durable: val(f, "durable") === "true", auto_delete: val(f, "auto_delete") === "true",
        internal: val(f, "internal") === "true", arguments: args.read()};
      const r = await act(() => api("PUT", "/api/exchanges/" + enc(val(f, "vhost")) + "/" + enc(val(f, "name")), body), "Exchange declared.");
      if (r !== undefined) { f.elements.name.value = ""; args.reset(); }
    }));
  return {async refresh() {
    const d = await api("GET", listPath("exchanges", selectedVHost()) + "?" + filter.query());
    filter.show(d);
    const ex = d.items;
    fill(list, table(["Virtual host", "Name", "Type", "Features", "Delayed", "Message rate in", "Message rate out"],
      ex.map((e) => [e.vhost, h("a", {href: exchangeHref(e.vhost, e.name)}, e.name === "" ? "(AMQP default)" : e.name),
        e.type, features(e), e.messages_delayed === undefined ? "" : e.messages_delayed,
        fmtRate((e.message_stats || {}).publish_in_details), fmtRate((e.message_stats || {}).publish_out_details)])));
  }};
};

function bindingRows(bs, vhost) {
  return bs.map((b) => [
    b.source === "" ? "(AMQP default)" : h("a", {href: exchangeHref(vhost, b.source)}, b.source),
    b.destination_type === "queue" ? h("a", {href: queueHref(vhost, b.destination)}, b.destination) :
      h("a", {href: exchangeHref(vhost, b.destination)}, b.destination),
    b.destination_type, b.routing_key, h("span", {}, tags(b.arguments)),
    b.source !== "" ? h("button", {class: "danger", onclick: () => act(() => api("DELETE",
      "/api/bindings/" + enc(vhost) + "/e/" + enc(b.source) + "/" + (b.destination_type === "queue" ? "q" : "e") + "/" +
      enc(b.destination) + "/" + enc(b.properties_key)), "Binding removed.")}, "Unbind") : ""]);
}

// the held messages of a delayed exchange, a page at a time (GET .../delayed?page=&page_size=, or
// &due_from= to jump to the page holding the first message due at or after a time)
function delayedList(base) {
  const box = h("div", {class: "delayed"});
  let page = 1, size = 100, dueFrom = null, jumped = null;
  const sizeSel = selectInput("page_size", PAGE_SIZES.map((n) => [String(n), n + " per page"]), "100");
  sizeSel.addEventListener("change", () => { size = Number(sizeSel.value); page = 1; refreshNow(); });
  const jump = form(null, [field("Jump to due time", textInput("due_from", "", {
    placeholder: "in 10 min, 2 h, or 2026-11-26 16:30 (UTC)"}))], "Jump", async (f) => {
    const t = parseWhen(val(f, "due_from"));
    if (isNaN(t)) { flash("Give a time as 'in 10 min', '2 h', or 'YYYY-MM-DD HH:MM' (UTC)."); return; }
    dueFrom = t;
    await refreshNow();
  });
  jump.classList.add("inline");
  const go = (p) => () => { page = p; refreshNow(); };
  const cancel = async (m) => {
    try {
      await api("DELETE", base + "/delayed/" + enc(m.id));
      flash("Delayed message cancelled.", "ok");
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        flash("Message " + (m.message_id || m.id) + " is no longer held: it was already delivered (or cancelled).", "info");
      } else flash(e instanceof ApiError ? e.reason : String(e));
    }
    await refreshNow();
  };
  const body = h("div");
  append(box, h("div", {class: "pager"}, sizeSel, jump), body);
  box.refresh = async () => {
    try { await show(); } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      fill(body, h("p", {class: "empty"}, "The list of held messages is not available: " + err.reason));
    }
  };
  const show = async () => {
    let q = "?page=" + page + "&page_size=" + size;
    if (dueFrom !== null) { q = "?page_size=" + size + "&due_from=" + Math.floor(dueFrom); jumped = dueFrom; dueFrom = null; }
    let d = await api("GET", base + "/delayed" + q);
    const pages = Math.max(1, Math.ceil(d.total_count / size));
    if (!d.items.length && d.page > pages) d = await api("GET", base + "/delayed?page=" + pages + "&page_size=" + size);
    page = d.page;
    const first = (page - 1) * size;
    fill(body,
      h("p", {"data-held": String(d.total_count)}, fmtNum(d.total_count) + " held" + (d.items.length ?
        "; showing " + fmtNum(first + 1) + "-" + fmtNum(first + d.items.length) + " in due order" : "")),
      d.total_count > size ? h("div", {class: "pager"},
        h("button", {type: "button", disabled: page <= 1, onclick: go(1)}, "First"),
        h("button", {type: "button", disabled: page <= 1, onclick: go(page - 1)}, "Previous"),
        h("span", {"data-page": String(page)}, "Page " + page + " of " + pages),
        h("button", {type: "button", disabled: page >= pages, onclick: go(page + 1)}, "Next"),
        h("button", {type: "button", disabled: page >= pages, onclick: go(pages)}, "Last")) : null,
      table(["Due", "In", "Routing key", "Message id", "Bytes", ""],
        d.items.map((m) => [fmtTime(m.due), fmtDuration(m.due - Date.now()), m.routing_key, m.message_id || "", m.payload_bytes,
          h("button", {class: "danger", onclick: () => cancel(m)}, "Cancel")]),
        "No delayed messages held"),
      d.total_count ? h("button", {class: "danger", onclick: () => {
        if (window.confirm("Cancel every held message?")) act(() => api("DELETE", base + "/delayed"), "Held messages purged.");
      }}, "Cancel all") : null);
    if (jumped !== null) {
      const row = [...body.querySelectorAll("tbody tr")][d.items.findIndex((m) => m.due >= jumped)];
      if (row) row.classList.add("mark");
      jumped = null;
    }
  };
  return box;
}

pages.exchange = (root, [vhost, name]) => {
  const ename = name === "amq.default" ? "" : name;
  const info = h("div"), from = h("div"), to = h("div"), publish = h("div");
  const base = "/api/exchanges/" + enc(vhost) + "/" + enc(name);
  const delayed = delayedList(base);
  const delayedSection = h("section", {hidden: true}, h("h2", {}, "Delayed messages"), delayed);
  const rates = new Chart("Message rates", ["publish_in", "publish_out"], "/s");
  const bargs = argsEditor([]);
  append(root, h("h1", {}, "Exchange ", ename === "" ? "(AMQP default)" : ename, h("span", {class: "muted"}, " in virtual host " + vhost)),
    info, h("div", {class: "grid"}, rates.el), delayedSection,
    h("h2", {}, "Bindings from this exchange"), from, h("h2", {}, "Bindings to this exchange"), to,
    ename === "" ? null : form("Add binding from this exchange", [
      field("To", selectInput("dtype", [["q", "To queue"], ["e", "To exchange"]], "q")),
      field("Destination", textInput("destination", "", {required: true})), field("Routing key", textInput("routing_key")),
      h("div", {}, h("b", {}, "Arguments"), bargs)], "Bind", async (f) => {
      await act(() => api("POST", "/api/bindings/" + enc(vhost) + "/e/" + enc(ename) + "/" + val(f, "dtype") + "/" + enc(val(f, "destination")),
        {routing_key: val(f, "routing_key"), arguments: bargs.read()}), "Binding added.");
    }),
    publish,
    ename === "" || ename.startsWith("amq.") ? null : h("div", {class: "actions"}, h("button", {class: "danger", onclick: async () => {
      if (!window.confirm("Delete exchange " + ename + "?")) return;
      await act(() => api("DELETE", "/api/exchanges/" + enc(vhost) + "/" + enc(ename)), "Exchange deleted.", "#/exchanges");
    }}, "Delete this exchange")));
  return {
    gone: {what: "Exchange", name: ename === "" ? "(AMQP default)" : ename, vhost, back: "#/exchanges"},
    async refresh() {
      const e = await api("GET", base + "?" + samplesQuery());
      if (!publish.firstChild) fill(publish, publishForm(vhost, ename, undefined, e.type === DELAYED ? DELAY_HEADERS : []));
      fill(info, kv([["Type", e.type], ["Features", features(e)], ["Policy", e.policy || ""],
        e.messages_delayed !== undefined ? ["Delayed messages held", e.messages_delayed] : null]));
      updateRates(rates, e.message_stats, ["publish_in", "publish_out"]);
      fill(from, table(["From", "To", "Type", "Routing key", "Arguments", ""],
        bindingRows(await api("GET", base + "/bindings/source"), vhost), "No bindings"));
      fill(to, table(["From", "To", "Type", "Routing key", "Arguments", ""],
        bindingRows(await api("GET", base + "/bindings/destination"), vhost), "No bindings"));
      delayedSection.hidden = e.type !== DELAYED;
      if (e.type !== DELAYED) return;
      await delayed.refresh();
    },
  };
};

pages.queues = (root) => {
  const list = h("div");
  const filter = listFilter("queues");
  const args = argsEditor(QUEUE_ARGS);
  // quorum queues and streams are durable and not auto-delete (RabbitMQ refuses the others)
  const typeSel = selectInput("type", [["classic", "Classic"], ["quorum", "Quorum"], ["stream", "Stream"]], "classic");
  const durableSel = selectInput("durable", [["true", "Durable"], ["false", "Transient"]], "true");
  const autoSel = selectInput("auto_delete", [["false", "No"], ["true", "Yes"]], "false");
  typeSel.addEventListener("change", () => {
    const quorum = typeSel.value !== "classic";
    if (quorum) { durableSel.value = "true"; autoSel.value = "false"; }
    durableSel.disabled = autoSel.disabled = quorum;
  });
  append(root, h("h1", {}, "Queues"), filter, list, h("h2", {}, "Add a new queue"),
    form(null, [field("Virtual host", selectInput("vhost", vhostChoices(false), defaultVHost())),
      field("Type", typeSel), field("Name", textInput("name", "", {required: true})),
      field("Durability", durableSel), field("Auto delete", autoSel),
      h("div", {}, h("b", {}, "Arguments"), args)], "Add queue", async (f) => {
      const a = args.read();
      if (typeSel.value !== "classic") a["x-queue-type"] = typeSel.value;
      const body = {durable: durableSel.value === "true", auto_delete: autoSel.value === "true", arguments: a};
      const r = await act(() => api("PUT", "/api/queues/" + enc(val(f, "vhost")) + "/" + enc(val(f, "name")), body), "Queue declared.");
      if (r !== undefined) { f.elements.name.value = ""; args.reset(); }
    }));
  return {async refresh() {
    const d = await api("GET", listPath("queues", selectedVHost()) + "?" + filter.query());
    filter.show(d);
    const qs = d.items;
    // the Node column in a cluster (more than one node), as RabbitMQ's list shows it
    const clustered = (await clusterNodeCount()) > 1 || qs.some((q) => q.node !== qs[0].node);
    const heads = ["Virtual host", "Name"].concat(clustered ? ["Node"] : [], ["Type", "Features", "Policy", "State",
      "Ready", "Unacked", "Total", "Incoming", "Deliver / get", "Ack"]);
    fill(list, table(heads,
    qs.map((q) => {
      const s = q.message_stats || {};
      const state = q.state === "down" ? h("span", {class: "down"}, "down") : q.state;
      return [q.vhost, h("a", {href: queueHref(q.vhost, q.name)}, q.name)].concat(clustered ? [q.node] : [], [
        q.type, features(q), q.policy || "", state,
        q.messages_ready, q.messages_unacknowledged, q.messages, fmtRate(s.publish_details), fmtRate(s.deliver_get_details),
        fmtRate(s.ack_details)]);
    })));
  }};
};

// a quorum queue's or a replicated stream's members (docs/cluster.md, "Membership"; docs/streams.md,
// "In a cluster"): its leader, members and the in-sync ones; administrators add a member (a running
// cluster node that is not one) or delete one (a stream's: rabbitmq-streams add_replica / delete_replica)
function membersSection(vhost, name) {
  let base = "/api/queues/quorum/" + enc(vhost) + "/" + enc(name) + "/replicas/";
  const admin = hasTag("administrator");
  const view = h("div");
  const nodeSel = h("select", {name: "node", required: true});
  const add = form("Add a member", [field("Node", nodeSel)], "Add member", async (f) => {
    const node = val(f, "node");
    if (node) await act(() => api("POST", base + "add", {node}), "Member " + node + " added: it joins and syncs.");
  });
  const el = h("div", {id: "members", hidden: true}, h("h2", {}, "Members"), view, admin ? add : null);
  let shown = null;
  return {el, async refresh(q) {
    el.hidden = !((q.type === "quorum" || q.type === "stream") && q.leader);
    if (el.hidden) return;
    const manage = admin;
    base = "/api/queues/" + q.type + "/" + enc(vhost) + "/" + enc(name) + "/replicas/";
    if (add) add.hidden = !manage;
    const ms = q.members || [q.leader], online = q.online || [];
    fill(view, kv([["Leader", h("span", {"data-member-leader": ""}, q.leader)], ["Members", ms.join(", ")],
      ["Online (in sync)", online.join(", ")]]),
    table(manage ? ["Node", "Role", "In sync", ""] : ["Node", "Role", "In sync"], ms.map((m) => [m,
      m === q.leader ? "leader" : "follower", online.includes(m) ? "yes" : "no"].concat(!manage ? [] : [
      ms.length > 1 ? h("button", {class: "danger", "data-delete-member": m, onclick: () => {
        if (window.confirm("Delete member " + m + " of queue " + name + "?" + (m === q.leader ?
          " Its leadership goes to an in-sync follower first." : "")))
          act(() => api("DELETE", base + "delete", {node: m}), "Member " + m + " deleted.");
      }}, "Delete member") : ""])), "No members"));
    if (!manage) return;
    let nodes = [];
    try { nodes = (await api("GET", "/api/nodes")).filter((n) => n.running !== false).map((n) => n.name); } catch (e) { nodes = []; }
    const others = nodes.filter((n) => !ms.includes(n)).sort();
    // the select is rebuilt only when its choices change (a choice being made is kept)
    if (others.join("\n") !== shown) {
      shown = others.join("\n");
      const keep = nodeSel.value;
      fill(nodeSel, others.length ? others.map((n) => h("option", {value: n, selected: n === keep}, n)) :
        h("option", {value: ""}, "(every running node is a member)"));
      add.querySelector("button[type=submit]").disabled = !others.length;
    }
  }};
}

pages.queue = (root, [vhost, name]) => {
  const base = "/api/queues/" + enc(vhost) + "/" + enc(name);
  const info = h("div"), expiry = h("div"), lease = h("div"), dl = h("div"), consumers = h("div"), bindings = h("div");
  const streamBox = h("div", {id: "stream"});
  const members = membersSection(vhost, name);
  const got = h("div", {id: "got"}), browsed = h("div", {id: "browsed"});
  const queued = lengthCharts();
  const rates = new Chart("Message rates", QUEUE_RATE_KEYS, "/s");
  const deaths = new Chart("Expired and dead-lettered by reason", QUEUE_DEATH_KEYS, "/s");
  const bargs = argsEditor([]);
  let expiresAt = null;
  const leaseText = h("span", {class: "countdown"});
  const tick = () => { if (expiresAt !== null) leaseText.textContent = fmtDuration(expiresAt - Date.now()) + " (at " + fmtTime(expiresAt) + ")"; };
  const ticker = setInterval(tick, 500);
  append(root, h("h1", {}, "Queue ", name, h("span", {class: "muted"}, " in virtual host " + vhost)), info, streamBox, members.el,
    h("div", {class: "grid"}, queued.el, rates.el, deaths.el),
    h("h2", {}, "Time to expiry"), expiry, h("h2", {}, "Queue lease (x-expires)"), lease,
    h("h2", {}, "Dead-letter target"), dl,
    h("h2", {}, "Consumers"), consumers, h("h2", {}, "Bindings"), bindings,
    form("Add binding to this queue", [field("From exchange", textInput("source", "", {required: true})),
      field("Routing key", textInput("routing_key")), h("div", {}, h("b", {}, "Arguments"), bargs)], "Bind", async (f) => {
      await act(() => api("POST", "/api/bindings/" + enc(vhost) + "/e/" + enc(val(f, "source")) + "/q/" + enc(name),
        {routing_key: val(f, "routing_key"), arguments: bargs.read()}), "Binding added.");
    }),
    publishForm(vhost, "", name),
    h("h2", {}, "Get messages"),
    form(null, [h("p", {class: "muted"}, "Getting messages from a queue is a destructive action: with requeue they come back marked redelivered."),
      field("Ack mode", selectInput("ackmode", [["ack_requeue_true", "Nack message requeue true"],
        ["ack_requeue_false", "Automatic ack"], ["reject_requeue_true", "Reject requeue true"], ["reject_requeue_false", "Reject requeue false"]], "ack_requeue_true")),
      field("Encoding", selectInput("encoding", [["auto", "Auto string / base64"], ["base64", "base64"]], "auto")),
      field("Messages", h("input", {type: "number", name: "count", value: "1", min: "1"}))], "Get message(s)", async (f) => {
      const msgs = await act(() => api("POST", base + "/get", {count: Number(val(f, "count")), ackmode: val(f, "ackmode"),
        encoding: val(f, "encoding"), truncate: 50000}));
      if (msgs !== undefined) fill(got, messagesView(msgs));
    }), got,
    h("h2", {}, "Browse messages"),
    form(null, [h("p", {class: "muted"}, "Reads ready messages without taking them: nothing is requeued or marked redelivered."),
      field("Offset", h("input", {type: "number", name: "offset", value: "0", min: "0"})),
      field("Messages", h("input", {type: "number", name: "count", value: "10", min: "1"})),
      field("Encoding", selectInput("encoding", [["auto", "Auto string / base64"], ["base64", "base64"]], "auto"))], "Browse", async (f) => {
      const msgs = await act(() => api("POST", base + "/browse", {count: Number(val(f, "count")), offset: Number(val(f, "offset")),
        encoding: val(f, "encoding"), truncate: 50000}));
      if (msgs !== undefined) fill(browsed, messagesView(msgs, true));
    }), browsed,
    h("h2", {}, "Purge and delete"),
    h("div", {class: "actions"},
      h("button", {class: "danger", onclick: () => {
        if (window.confirm("Purge queue " + name + "?")) act(() => api("DELETE", base + "/contents"), "Queue purged.");
      }}, "Purge messages"),
      h("button", {class: "danger", onclick: async () => {
        if (!window.confirm("Delete queue " + name + "?")) return;
        await act(() => api("DELETE", base), "Queue deleted.", "#/queues");
      }}, "Delete queue")));
  return {
    gone: {what: "Queue", name, vhost, back: "#/queues"},
    destroy() { clearInterval(ticker); },
    async refresh() {
      const q = await api("GET", base + "?" + samplesQuery());
      fill(info, kv([["Type", q.type], ["Features", features(q)], ["Policy", q.policy || ""],
        ["Effective policy definition", h("span", {}, tags(q.effective_policy_definition))], ["State", q.state],
        ["Consumers", q.consumers], ["Ready", h("span", {"data-count": "ready"}, fmtNum(q.messages_ready))],
        ["Unacked", h("span", {"data-count": "unacked"}, fmtNum(q.messages_unacknowledged))],
        ["Total", h("span", {"data-count": "total"}, fmtNum(q.messages))],
        ["Paged out", q.messages_paged_out], ["Bytes", fmtBytes(q.message_bytes)],
        deathCounts(q.message_stats)]));
      // a stream: its offsets, segments and readers (docs/streams.md)
      const st = q.stream;
      fill(streamBox, st ? [h("h2", {}, "Stream"),
        kv([["First offset", fmtNum(st.first_offset)], ["Last chunk offset", st.last_offset === null ? "" : fmtNum(st.last_offset)],
          ["Committed (next) offset", fmtNum(st.committed_offset)], ["Size on disk", fmtBytes(st.bytes)],
          ["Retention", (st.max_length_bytes === null ? "no size limit" : fmtBytes(st.max_length_bytes)) + ", " +
            (st.max_age_seconds === null ? "no age limit" : fmtDuration(st.max_age_seconds * 1000))],
          ["Segment size", fmtBytes(st.segment_bytes)]]),
        h("h3", {}, "Segments"),
        table(["First offset", "Next offset", "Messages", "Bytes"], st.segments.map((s) =>
          [fmtNum(s.first_offset), fmtNum(s.next_offset), fmtNum(s.next_offset - s.first_offset), fmtBytes(s.bytes)]), "No segments"),
        h("h3", {}, "Readers"),
        table(["Consumer tag", "Next offset", "Behind"], st.readers.map((r) =>
          [r.consumer_tag, fmtNum(r.offset), fmtNum(st.committed_offset - r.offset)]), "No readers")] : []);
      await members.refresh(q);
      updateLengths(queued, q);
      updateRates(rates, q.message_stats, QUEUE_RATE_KEYS);
      updateRates(deaths, q.message_stats, QUEUE_DEATH_KEYS);
      fill(consumers, table(["Channel", "Consumer tag", "Ack required", "Exclusive", "Prefetch", "Active", "Arguments"],
        (q.consumer_details || []).map((c) => [(c.channel_details || {}).name || "", c.consumer_tag, String(c.ack_required),
          String(c.exclusive), c.prefetch_count, String(c.active !== false), h("span", {}, tags(c.arguments))]), "No consumers"));
      fill(bindings, table(["From", "To", "Type", "Routing key", "Arguments", ""],
        bindingRows(await api("GET", base + "/bindings"), vhost), "No bindings"));
      const x = await api("GET", base + "/expiry");
      // each bucket excludes the earlier ones: ranges, not "within"
      const buckets = [["within_1s", "Under 1 s"], ["within_10s", "1 s to 10 s"], ["within_1min", "10 s to 1 min"],
        ["later", "Over 1 min"], ["never", "Never (no TTL)"]];
      const max = Math.max(1, ...buckets.map(([k]) => x[k]));
      fill(expiry, h("div", {class: "hist"}, buckets.map(([k, text], i) => [h("span", {}, text),
        h("div", {}, h("div", {class: "bar" + (i === 4 ? " never" : ""), style: "width:" + (100 * x[k] / max).toFixed(1) + "%"})),
        h("span", {class: "num", "data-bucket": k}, fmtNum(x[k]))])),
        x.estimated ? h("p", {class: "empty"}, fmtNum(x.estimated) + " paged-out messages are counted by the earliest expiry of their segment on disk.") : null);
      expiresAt = x.expires_at;
      fill(lease, x.x_expires === null ? h("p", {class: "empty"}, "No x-expires: the queue never expires for being unused.") :
        kv([["x-expires", fmtDuration(x.x_expires) + " (" + fmtNum(x.x_expires) + " ms)"],
          ["Deleted if unused in", expiresAt === null ? h("span", {}, "not running: the queue has consumers") : leaseText]]));
      tick();
      const d = await api("GET", base + "/dead-letter");
      fill(dl, d.exchange === null ? h("p", {class: "empty"}, "No dead-letter exchange: expired and rejected messages are dropped.") : [
        kv([["Exchange", h("a", {href: exchangeHref(vhost, d.exchange)}, d.exchange === "" ? "(AMQP default)" : d.exchange)],
          ["Routing key", d.routing_key === null ? "(the message's own)" : d.routing_key], ["Strategy", d.strategy]]),
        table(["Queue reached now", "Routing key"], d.queues.map((t) => [h("a", {href: queueHref(t.vhost, t.name)}, t.name), t.routing_key]),
          "No queue would receive a dead letter now: it would be dropped.")]);
    },
  };
};

function policyPage(root, operator) {
  const kind = operator ? "operator-policies" : "policies";
  const list = h("div");
  const def = argsEditor(policyKeyTypes(kind), "definition");
  const edit = (p) => {
    const f = root.querySelector("form");
    f.elements.vhost.value = p.vhost;
    f.elements.name.value = p.name;
    f.elements.pattern.value = p.pattern;
    f.elements["apply-to"].value = p["apply-to"];
    f.elements.priority.value = String(p.priority);
    def.set(p.definition || {});
    f.scrollIntoView();
  };
  append(root, h("h1", {}, operator ? "Operator policies" : "Policies"), list, h("h2", {}, "Add / update a policy"),
    form(null, [field("Virtual host", selectInput("vhost", vhostChoices(false), defaultVHost())),
      field("Name", textInput("name", "", {required: true})), field("Pattern", textInput("pattern", "", {required: true})),
      field("Apply to", selectInput("apply-to", [["all", "Exchanges and queues"], ["queues", "Queues"], ["exchanges", "Exchanges"]], "all")),
      field("Priority", h("input", {type: "number", name: "priority", value: "0"})),
      h("div", {}, h("b", {}, "Definition"), def)], "Add / update policy", async (f) => {
      const body = {pattern: val(f, "pattern"), "apply-to": val(f, "apply-to"), priority: Number(val(f, "priority") || 0), definition: def.read()};
      const r = await act(() => api("PUT", "/api/" + kind + "/" + enc(val(f, "vhost")) + "/" + enc(val(f, "name")), body), "Policy set.");
      if (r !== undefined) { f.elements.name.value = ""; f.elements.pattern.value = ""; def.reset(); }
    }));
  return {async refresh() {
    const ps = await api("GET", listPath(kind, selectedVHost()));
    fill(list, table(["Virtual host", "Name", "Pattern", "Apply to", "Definition", "Priority", ""],
      ps.map((p) => [p.vhost, p.name, p.pattern, p["apply-to"], h("span", {}, tags(p.definition)), p.priority,
        h("span", {class: "actions"}, h("button", {onclick: () => edit(p)}, "Edit"), h("button", {class: "danger", onclick: () => {
          if (window.confirm("Delete policy " + p.name + "?")) act(() => api("DELETE", "/api/" + kind + "/" + enc(p.vhost) + "/" + enc(p.name)), "Policy deleted.");
        }}, "Delete"))]), "No policies"));
  }};
}
pages.policies = (root) => policyPage(root, false);
pages["operator-policies"] = (root) => policyPage(root, true);

pages.users = (root) => {
  const list = h("div"), perms = h("div");
  const userSel = h("div");
  append(root, h("h1", {}, "Users"), list, h("h2", {}, "Add / update a user"),
    form(null, [field("Username", textInput("name", "", {required: true})),
      field("Password", h("input", {type: "password", name: "password"})),
      field("Tags", textInput("tags", "", {placeholder: "administrator, monitoring, policymaker, management"}))], "Add / update user", async (f) => {
      const r = await act(() => api("PUT", "/api/users/" + enc(val(f, "name")), {password: val(f, "password"), tags: val(f, "tags")}), "User saved.");
      if (r !== undefined) f.reset();
    }),
    h("h2", {}, "Permissions"), perms, h("h2", {}, "Set permission"),
    form(null, [userSel, field("Virtual host", selectInput("vhost", vhostChoices(false), defaultVHost())),
      field("Configure regexp", textInput("configure", ".*")), field("Write regexp", textInput("write", ".*")),
      field("Read regexp", textInput("read", ".*"))], "Set permission", async (f) => {
      await act(() => api("PUT", "/api/permissions/" + enc(val(f, "vhost")) + "/" + enc(val(f, "user")),
        {configure: val(f, "configure"), write: val(f, "write"), read: val(f, "read")}), "Permission set.");
    }));
  return {async refresh() {
    const us = await api("GET", "/api/users");
    fill(list, table(["Name", "Tags", "Has password", ""], us.map((u) => [u.name,
      Array.isArray(u.tags) ? u.tags.join(", ") : u.tags, String(!!u.password_hash),
      u.name === session.name ? "" : h("button", {class: "danger", onclick: () => {
        if (window.confirm("Delete user " + u.name + "?")) act(() => api("DELETE", "/api/users/" + enc(u.name)), "User deleted.");
      }}, "Delete")])));
    if (!userSel.firstChild || userSel.dataset.users !== us.map((u) => u.name).join("\n")) {
      userSel.dataset.users = us.map((u) => u.name).join("\n");
      fill(userSel, field("User", selectInput("user", us.map((u) => u.name), session.name)));
    }
    const ps = await api("GET", "/api/permissions");
    fill(perms, table(["User", "Virtual host", "Configure", "Write", "Read", ""],
      ps.filter((p) => !selectedVHost() || p.vhost === selectedVHost()).map((p) => [p.user, p.vhost, p.configure, p.write, p.read,
        h("button", {class: "danger", onclick: () => act(() => api("DELETE", "/api/permissions/" + enc(p.vhost) + "/" + enc(p.user)), "Permission cleared.")}, "Clear")])));
  }};
};

pages.vhosts = (root) => {
  const list = h("div");
  append(root, h("h1", {}, "Virtual hosts"), list, h("h2", {}, "Add a new virtual host"),
    form(null, [field("Name", textInput("name", "", {required: true}))], "Add virtual host", async (f) => {
      const r = await act(() => api("PUT", "/api/vhosts/" + enc(val(f, "name")), {}), "Virtual host added.");
      if (r !== undefined) { f.reset(); await loadVHosts(); }
    }));
  return {async refresh() {
    const vs = await api("GET", "/api/vhosts");
    fill(list, table(["Name", "Ready", "Unacked", "Total", ""], vs.map((v) => [v.name,
      v.messages_ready || 0, v.messages_unacknowledged || 0, v.messages || 0,
      h("button", {class: "danger", onclick: async () => {
        if (!window.confirm("Delete virtual host " + v.name + " and everything in it?")) return;
        const r = await act(() => api("DELETE", "/api/vhosts/" + enc(v.name)), "Virtual host deleted.");
        if (r !== undefined) await loadVHosts();
      }}, "Delete")])));
  }};
};

pages.limits = (root) => {
  const vlist = h("div"), ulist = h("div");
  append(root, h("h1", {}, "Limits"), h("h2", {}, "Virtual host limits"), vlist,
    form("Set a virtual host limit", [field("Virtual host", selectInput("vhost", vhostChoices(false), defaultVHost())),
      field("Limit", selectInput("limit", ["max-connections", "max-queues"], "max-connections")),
      field("Value", h("input", {type: "number", name: "value", value: "-1"}))], "Set limit", async (f) => {
      await act(() => api("PUT", "/api/vhost-limits/" + enc(val(f, "vhost")) + "/" + enc(val(f, "limit")), {value: Number(val(f, "value"))}), "Limit set.");
    }),
    h("h2", {}, "User limits"), ulist,
    form("Set a user limit", [field("User", textInput("user", "", {required: true})),
      field("Limit", selectInput("limit", ["max-connections", "max-channels"], "max-connections")),
      field("Value", h("input", {type: "number", name: "value", value: "-1"}))], "Set limit", async (f) => {
      await act(() => api("PUT", "/api/user-limits/" + enc(val(f, "user")) + "/" + enc(val(f, "limit")), {value: Number(val(f, "value"))}), "Limit set.");
    }));
  const rows = (items, who, path) => items.flatMap((it) => Object.entries(it.value || {}).map(([k, v]) => [it[who], k, v,
    h("button", {class: "danger", onclick: () => act(() => api("DELETE", path + enc(it[who]) + "/" + enc(k)), "Limit removed.")}, "Clear")]));
  return {async refresh() {
    fill(vlist, table(["Virtual host", "Limit", "Value", ""], rows(await api("GET", "/api/vhost-limits"), "vhost", "/api/vhost-limits/"), "No limits"));
    fill(ulist, table(["User", "Limit", "Value", ""], rows(await api("GET", "/api/user-limits"), "user", "/api/user-limits/"), "No limits"));
  }};
};

pages.definitions = (root) => {
  const result = h("div");
  const scope = () => selectedVHost();
  const path = () => "/api/definitions" + (scope() ? "/" + enc(scope()) : "");
  append(root, h("h1", {}, "Definitions"),
    h("p", {class: "muted"}, "Users, virtual hosts, permissions, policies, parameters, queues, exchanges and bindings, in RabbitMQ's format. " +
      "The vhost selector above limits export and import to one virtual host."),
    h("h2", {}, "Export"),
    h("div", {class: "actions"}, h("button", {class: "primary", onclick: async () => {
      try {
        const defs = await api("GET", path());
        const blob = new Blob([JSON.stringify(defs, null, 2)], {type: "application/json"});
        const a = h("a", {href: URL.createObjectURL(blob), download: "otter_tx_definitions.json"});
        document.body.appendChild(a); a.click(); a.remove();
        fill(result, h("pre", {class: "payload"}, JSON.stringify(defs, null, 2).slice(0, 20000)));
      } catch (e) { flash(e.reason || String(e)); }
    }}, "Download definitions")),
    h("h2", {}, "Import"),
    form(null, [field("File", h("input", {type: "file", name: "file", accept: ".json,application/json"})),
      field("or paste JSON", h("textarea", {name: "json"}))], "Upload definitions", async (f) => {
      const file = f.elements.file.files[0];
      const text = file ? await file.text() : val(f, "json");
      const body = JSON.parse(text);
      const r = await act(() => api("POST", path(), body), "Definitions imported.");
      if (r !== undefined) await loadVHosts();
    }), result);
  return {async refresh() {}};
};

// --- shell: login, navigation, routing ---------------------------------------------------

const NAV = [
  ["overview", "Overview", () => true], ["connections", "Connections", () => true], ["channels", "Channels", () => true],
  ["exchanges", "Exchanges", () => true], ["queues", "Queues", () => true],
  ["policies", "Policies", () => hasTag("administrator", "policymaker")],
  ["operator-policies", "Operator policies", () => hasTag("administrator")],
  ["limits", "Limits", () => hasTag("administrator")],
  ["users", "Users", () => hasTag("administrator")], ["vhosts", "Virtual hosts", () => hasTag("administrator")],
  ["definitions", "Definitions", () => hasTag("administrator")],
];

async function loadVHosts() {
  vhosts = await api("GET", "/api/vhosts");
  const sel = document.getElementById("vhost-select");
  if (sel) {
    const v = selectedVHost();
    fill(sel, vhostChoices(true).map(([val, text]) => h("option", {value: val, selected: val === v}, text)));
  }
}

// the mounted page goes: its own timers too (a queue page's lease countdown)
function unmount() {
  if (current && current.destroy) current.destroy();
  current = null;
}

function loginPage(message) {
  if (timer) clearTimeout(timer);
  unmount();
  const err = h("div", {class: "error", role: "alert"}, message || "");
  const f = h("form", {class: "box login"}, h("h1", {}, "otter_tx"),
    field("Username", h("input", {type: "text", name: "username", autocomplete: "username", required: true})),
    field("Password", h("input", {type: "password", name: "password", autocomplete: "current-password"})),
    err, h("div", {class: "actions"}, h("button", {type: "submit", class: "primary"}, "Login")));
  f.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const auth = "Basic " + btoa(unescape(encodeURIComponent(f.elements.username.value + ":" + f.elements.password.value)));
    session = {name: f.elements.username.value, tags: [], auth};
    try {
      const me = await api("GET", "/api/whoami");
      session.name = me.name;
      session.tags = Array.isArray(me.tags) ? me.tags : String(me.tags || "").split(",").filter((t) => t);
      STORE.setItem("otter.session", JSON.stringify(session));
      await start();
    } catch (e) {
      if (!(e instanceof ApiError)) console.error(e);
      session = null;
      err.textContent = e instanceof ApiError ? (e.status === 401 && !e.reason.startsWith("Not") ? "Login failed" : e.reason) : String(e);
    }
  });
  fill(document.getElementById("app"), f);
}

function logout(message) {
  STORE.removeItem("otter.session");
  session = null;
  loginPage(message || "");
}

function shell() {
  const refreshSel = h("select", {id: "refresh-select", onchange: (ev) => { STORE.setItem("otter.refresh", ev.target.value); schedule(); }},
    REFRESH_CHOICES.map(([s, t]) => h("option", {value: String(s), selected: s === refreshSeconds()}, t)));
  const rangeSel = h("select", {id: "range-select", onchange: (ev) => { STORE.setItem("otter.range", ev.target.value); refreshNow(); }},
    RANGE_CHOICES.map(([r, t]) => h("option", {value: r, selected: r === chartRange()}, t)));
  const vhostSel = h("select", {id: "vhost-select", onchange: (ev) => { STORE.setItem("otter.vhost", ev.target.value); route(); }});
  const nav = h("nav", {}, NAV.filter(([, , show]) => show()).map(([id, text]) => h("a", {href: "#/" + id, "data-nav": id}, text)));
  const main = h("main", {id: "page"});
  fill(document.getElementById("app"),
    h("header", {}, h("span", {class: "brand"}, "otter_tx", h("small", {}, "management")), h("span", {class: "spacer"}),
      h("label", {}, "Virtual host ", vhostSel), h("label", {}, "Refresh ", refreshSel),
      h("label", {}, "Charts ", rangeSel),
      h("button", {type: "button", onclick: () => refreshNow()}, "Refresh now"),
      h("span", {}, "User ", h("b", {id: "who"}, session.name), " ", session.tags.map((t) => h("span", {class: "tag"}, t))),
      h("button", {type: "button", id: "logout", onclick: () => logout("")}, "Log out")),
    nav, main);
}

async function route() {
  if (!session) return;
  unmount();
  const parts = (location.hash.replace(/^#\/?/, "") || "overview").split("/").map((p) => { try { return decodeURIComponent(p); } catch (e) { return p; } });
  let [name, ...params] = parts;
  if (name === "queues" && params.length === 2) name = "queue";
  else if (name === "exchanges" && params.length === 2) name = "exchange";
  else if (name === "connections" && params.length === 1) name = "connection";
  else if (name === "channels" && params.length === 1) name = "channel";
  const allowed = NAV.find(([id]) => id === name);
  if (!pages[name] || (allowed && !allowed[2]())) name = "overview";
  for (const a of document.querySelectorAll("nav a")) {
    const id = a.dataset.nav;
    a.classList.toggle("active", id === name || (name === "queue" && id === "queues") ||
      (name === "exchange" && id === "exchanges") || (name === "connection" && id === "connections") ||
      (name === "channel" && id === "channels"));
  }
  const main = fill(document.getElementById("page"));
  current = pages[name](main, params);
  await refreshNow();
  schedule();
}

async function start() {
  shell();
  try { await loadVHosts(); } catch (e) { flash(e.reason || String(e)); }
  try {
    const o = await api("GET", "/api/overview");
    if (Array.isArray(o.exchange_types)) exchangeTypes = o.exchange_types.map((t) => t.name);
    if (o.policy_keys) policyKeys = o.policy_keys;
  } catch (e) { /* the default list */ }
  await route();
}

window.addEventListener("hashchange", () => route());

(function boot() {
  const saved = STORE.getItem("otter.session");
  if (saved) {
    try { session = JSON.parse(saved); } catch (e) { session = null; }
  }
  if (session) start(); else loginPage("");
})();

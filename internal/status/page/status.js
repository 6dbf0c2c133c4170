// The sidecar's status page: polls /v1/status every second and renders it.
// Every value goes into the page as text (textContent), never as markup.
"use strict";

const pollMillis = 1000;
// Subscriptions whose details the reader opened (true) or closed (false);
// others are open while they have paused keys.
const openDetails = new Map();

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function cell(text, cls) {
  return el("td", cls ? { class: cls } : {}, text);
}

// nameCell is a cell of a resource name that may wrap after each "/".
function nameCell(name, cls) {
  const td = el("td", cls ? { class: cls } : {});
  name.split("/").forEach((part, i, parts) => {
    td.append(part + (i < parts.length - 1 ? "/" : ""));
    if (i < parts.length - 1) td.append(el("wbr"));
  });
  return td;
}

const fmtInt = new Intl.NumberFormat("en");

function num(n) {
  return fmtInt.format(n || 0);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  n = n || 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function age(seconds) {
  if (!seconds) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + " min " + Math.floor(seconds % 60) + " s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + " h " + (m % 60) + " min";
  return Math.floor(h / 24) + " d " + (h % 24) + " h";
}

function since(t, now) {
  if (!t) return "–";
  return age((now - Date.parse(t)) / 1000);
}

function replaceRows(table, rows) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
}

function renderHealth(st) {
  const items = [
    ["NATS", st.nats.status, st.nats.connected ? "ok" : "bad"],
    ["server", [st.nats.server_name, st.nats.server_version].filter(Boolean).join(" ") || "–"],
    ["URL", st.nats.embedded ? "embedded (in this process)" : st.nats.url || "–"],
    ["reconnects", num(st.nats.reconnects), st.nats.reconnects ? "warn" : ""],
    ["durability", st.nats.sync || "–", st.nats.sync_risk ? "warn" : "ok"],
    ["round trip", st.nats.rtt_ms ? st.nats.rtt_ms.toFixed(2) + " ms" : "–"],
    ["JetStream", st.jetstream.ok ? "available" : "unavailable: " + (st.jetstream.error || "not read yet"), st.jetstream.ok ? "ok" : "bad"],
    ["JetStream read", st.jetstream.as_of ? since(st.jetstream.as_of, Date.parse(st.time)) + " ago, in " + st.jetstream.read_ms.toFixed(1) + " ms" : "–"],
    ["streams / consumers", num(st.jetstream.streams) + " / " + num(st.jetstream.consumers)],
    ["storage", bytes(st.jetstream.storage_bytes)],
    ["StreamingPull streams", num(st.streams)],
    ["uptime", age(st.sidecar.uptime_seconds)],
    ["goroutines", num(st.sidecar.goroutines)],
  ];
  const cards = items.map(([k, v, cls]) => el("div", { "data-health": k }, el("dt", {}, k), el("dd", cls ? { class: cls } : {}, v)));
  document.getElementById("health").replaceChildren(...cards);
}

function renderSubscriptions(st) {
  const table = document.getElementById("subscriptions");
  const subs = st.subscriptions || [];
  document.getElementById("no-subscriptions").hidden = subs.length > 0;
  replaceRows(table, subs.map((s) => {
    const delivery = s.delivery + (s.push_endpoint ? ", push" : "") + (s.detached ? ", detached" : "");
    const parts = s.partitions && s.partitions.length ? s.partitions_owned + " / " + s.partitions.length : "–";
    return el("tr", { "data-subscription": s.name },
      nameCell(s.name, "name"),
      nameCell(s.topic || "", "topic"),
      cell(delivery, "delivery"),
      cell(num(s.backlog), "num backlog"),
      cell(num(s.unacked), "num unacked"),
      cell(age(s.oldest_unacked_age_seconds), "num oldest"),
      cell(num(s.keys_in_flight), "num keys"),
      cell(num(s.paused_keys), "num paused" + (s.paused_keys ? " warn" : "")),
      cell(parts, "num partitions"),
      cell(num(s.redelivered_recent), "num redelivered"),
      cell(num(s.dead_lettered_recent), "num dead-lettered" + (s.dead_lettered_recent ? " warn" : "")),
      cell(num(s.streams), "num streams"));
  }));

  const details = subs.filter((s) => (s.partitions && s.partitions.length) || (s.paused && s.paused.length) || s.push_endpoint);
  document.getElementById("details").replaceChildren(...details.map((s) => renderDetails(s, st)));
}

function renderDetails(s, st) {
  const d = el("details", { "data-subscription": s.name });
  d.open = openDetails.has(s.name) ? openDetails.get(s.name) : s.paused_keys > 0;
  const summary = el("summary", {}, s.name);
  // A click is the reader's choice (a toggle event also follows d.open = ...).
  summary.addEventListener("click", () => openDetails.set(s.name, !d.open));
  d.append(summary);
  if (s.push_endpoint) d.append(el("p", {}, "Pushes to " + s.push_endpoint));
  if (s.paused && s.paused.length) {
    d.append(el("h3", {}, "Paused keys (" + num(s.paused_keys) + (s.paused_keys > s.paused.length ? ", the first " + s.paused.length + " shown" : "") + ")"));
    const t = el("table", { class: "paused" },
      el("thead", {}, el("tr", {}, el("th", {}, "ordering key"), el("th", {}, "message id"), el("th", { class: "num" }, "delivery attempt"), el("th", { class: "num" }, "held for"))),
      el("tbody", {}, ...s.paused.map((p) => el("tr", {}, cell(p.key, "key"), cell(p.message_id), cell(num(p.delivery_attempt), "num"), cell(age(p.held_seconds), "num")))));
    d.append(t);
  }
  if (s.partitions && s.partitions.length) {
    d.append(el("h3", {}, "Partitions"));
    const now = Date.parse(st.time);
    const t = el("table", { class: "partitions" },
      el("thead", {}, el("tr", {}, el("th", { class: "num" }, "partition"), el("th", {}, "owner"), el("th", {}, "owned for"), el("th", { class: "num" }, "pending"), el("th", { class: "num" }, "unacked"))),
      el("tbody", {}, ...s.partitions.map((p) => el("tr", {},
        cell(p.partition, "num"),
        cell((p.owner === "other" ? (p.holder || "other") + " (pin " + p.pin_id + ")" : p.owner || "none") + (p.owner === "this sidecar" && p.holder ? " (" + p.holder + ")" : ""), p.owner ? "" : "warn"),
        cell(since(p.pinned_since, now)),
        cell(num(p.pending), "num"),
        cell(num(p.unacked), "num")))));
    d.append(t);
  }
  return d;
}

function renderTopics(st) {
  const topics = st.topics || [];
  document.getElementById("no-topics").hidden = topics.length > 0;
  const now = Date.parse(st.time);
  replaceRows(document.getElementById("topics"), topics.map((t) => el("tr", { "data-topic": t.name },
    nameCell(t.name),
    cell(num(t.messages), "num messages"),
    cell(bytes(t.bytes), "num bytes"),
    cell(num(t.consumers), "num"),
    cell(t.last_stored ? since(t.last_stored, now) + " ago" : "–"))));
}

function renderClients(st) {
  const now = Date.parse(st.time);
  replaceRows(document.getElementById("clients"), (st.clients || []).map((c) => el("tr", {},
    cell(c.peer), cell(c.user_agent), nameCell(c.subscription), cell(since(c.since, now)), cell(num(c.outstanding), "num"))));
  const more = document.getElementById("clients-more");
  more.hidden = !st.clients_omitted;
  more.textContent = st.clients_omitted ? "and " + num(st.clients_omitted) + " more streams" : "";
}

function render(st) {
  renderHealth(st);
  renderSubscriptions(st);
  renderTopics(st);
  renderClients(st);
  document.getElementById("updated").textContent = "updated " + new Date(st.time).toLocaleTimeString();
}

async function poll() {
  const error = document.getElementById("error");
  try {
    const resp = await fetch("/v1/status", { cache: "no-store" });
    if (!resp.ok) throw new Error("/v1/status answered " + resp.status);
    render(await resp.json());
    error.hidden = true;
  } catch (e) {
    error.textContent = "Cannot read the status: " + e.message;
    error.hidden = false;
  }
  setTimeout(poll, pollMillis);
}

poll();

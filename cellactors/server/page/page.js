// The fleet page: polls /fleet, /state and /metrics of the node that served it and redraws.
// Everything from the server is inserted with textContent or as attribute values, never
// parsed as markup, and the Content-Security-Policy allows no other script.
"use strict";

(() => {
  const INTERVAL_MS = 1500;
  const OUTCOMES = ["ok", "not_run", "unknown", "failed"];
  let previous = null; // the last /metrics sample: {t, calls, bucket, ackSum, ackCount}

  function byId(id) {
    return document.getElementById(id);
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text === undefined || text === null ? "" : String(text);
    if (className) td.className = className;
    return td;
  }

  function setText(id, text) {
    byId(id).textContent = String(text);
  }

  async function fetchOk(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) {
      let detail = "";
      try {
        const body = await response.json();
        detail = body && body.message ? ": " + body.message : "";
      } catch (_) {
        // not JSON: the status says enough
      }
      throw new Error(path + " answered HTTP " + response.status + detail);
    }
    return response;
  }

  // --- Prometheus text format --------------------------------------------------------------

  const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

  function unescapeLabel(value) {
    return value.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
  }

  function parseMetrics(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = SAMPLE.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[2]) {
        for (const l of m[2].matchAll(LABEL)) labels[l[1]] = unescapeLabel(l[2]);
      }
      samples.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return samples;
  }

  function summarize(samples) {
    const calls = new Map(); // "class\u0000method" -> {class, method, outcome -> count}
    let bucket = 0;
    let ackSum = 0;
    let ackCount = 0;
    let unacked = null;
    for (const s of samples) {
      if (s.name === "cellactors_calls_total") {
        const key = s.labels.class + "\u0000" + s.labels.method;
        if (!calls.has(key)) calls.set(key, { cls: s.labels.class, method: s.labels.method, counts: {} });
        calls.get(key).counts[s.labels.outcome] = s.value;
      } else if (s.name === "cellactors_bucket_requests_total") {
        bucket += s.value;
      } else if (s.name === "cellactors_ack_latency_seconds_sum") {
        ackSum = s.value;
      } else if (s.name === "cellactors_ack_latency_seconds_count") {
        ackCount = s.value;
      } else if (s.name === "cellactors_unacked_transactions") {
        unacked = s.value;
      }
    }
    return { t: performance.now(), calls, bucket, ackSum, ackCount, unacked };
  }

  function rate(now, before, seconds) {
    // A counter below its previous value means the process restarted: count from zero.
    const delta = before === undefined || now < before ? now : now - before;
    return delta / seconds;
  }

  function fmtRate(value) {
    return value >= 10 ? value.toFixed(0) : value.toFixed(1);
  }

  function drawMetrics(current) {
    const prev = previous;
    previous = current;
    setText("unacked", current.unacked === null ? "–" : current.unacked + " transactions");
    const rows = [];
    const keys = [...current.calls.keys()].sort();
    const seconds = prev ? (current.t - prev.t) / 1000 : 0;
    let totalRate = 0;
    for (const key of keys) {
      const entry = current.calls.get(key);
      const before = prev && prev.calls.get(key);
      const tr = document.createElement("tr");
      tr.dataset.cls = entry.cls;
      tr.dataset.method = entry.method;
      tr.append(cell(entry.cls), cell(entry.method));
      let total = 0;
      for (const outcome of OUTCOMES) {
        const count = entry.counts[outcome] || 0;
        total += count;
        if (seconds > 0) {
          const r = rate(count, before ? before.counts[outcome] || 0 : undefined, seconds);
          totalRate += r;
          tr.append(cell(fmtRate(r)));
        } else {
          tr.append(cell("…"));
        }
      }
      tr.append(cell(total));
      rows.push(tr);
    }
    byId("rates-body").replaceChildren(...rows);
    if (seconds > 0) {
      setText("rate-calls", fmtRate(totalRate) + " /s");
      setText("rate-bucket", fmtRate(rate(current.bucket, prev.bucket, seconds)) + " /s");
      const acks = current.ackCount - prev.ackCount;
      setText(
        "ack-latency",
        acks > 0
          ? ((1000 * (current.ackSum - prev.ackSum)) / acks).toFixed(1) + " ms average of " + acks
          : "no acknowledgements since the last refresh"
      );
    } else {
      setText("rate-calls", "measuring…");
      setText("rate-bucket", "measuring…");
      setText("ack-latency", "measuring…");
    }
  }

  // --- /state and /fleet ---------------------------------------------------------------------

  function fmtSeconds(ms) {
    return (Math.abs(ms) / 1000).toFixed(1) + " s";
  }

  function drawState(state) {
    setText("node-id", state.node);
    setText("node-status", state.status);
    setText("node-generation", state.generation);
    const left = state.lease_expires_ms - Date.now();
    setText("node-lease", state.lease_expires_ms ? "expires in about " + fmtSeconds(left) : "none");
    const rows = state.cells.map((c) => {
      const tr = document.createElement("tr");
      tr.dataset.cell = c.cell;
      tr.append(
        cell(c.cell),
        cell(c.epoch),
        cell(c.acked_txid),
        cell(c.committed_txid),
        cell(c.unacked, c.unacked > 0 ? "pending" : ""),
        cell(Number(c.idle_s).toFixed(1) + " s ago"),
        cell(c.restored_from)
      );
      return tr;
    });
    if (rows.length === 0) {
      const tr = document.createElement("tr");
      const td = cell("no resident cells");
      td.colSpan = 7;
      tr.append(td);
      rows.push(tr);
    }
    byId("cells-body").replaceChildren(...rows);
  }

  function pageLink(node) {
    // Another node's page, at the internal address its lease advertises (if reachable).
    const a = document.createElement("a");
    a.textContent = node.node;
    try {
      const url = new URL("http://" + node.addr + "/");
      if (url.protocol === "http:" && url.pathname === "/") a.href = url.href;
    } catch (_) {
      return document.createTextNode(node.node);
    }
    return a;
  }

  function drawFleet(fleet) {
    const rows = fleet.nodes.map((n) => {
      const tr = document.createElement("tr");
      tr.dataset.node = n.node;
      tr.dataset.alive = n.alive ? "yes" : "no";
      tr.className = (n.alive ? "alive-row" : "expired") + (n.self ? " self" : "");
      const name = document.createElement("td");
      name.append(n.self || !n.alive || !n.addr ? document.createTextNode(n.node) : pageLink(n));
      if (n.self) name.append(document.createTextNode(" (this node)"));
      let load = n.load && n.load.resident_cells !== undefined ? String(n.load.resident_cells) : "";
      if (load && n.load.hibernated_cells) load += " (+" + n.load.hibernated_cells + " hibernated)";
      const left = n.expires_ms - fleet.now_ms;
      let expires;
      if (n.expires_ms === 0) expires = "released";
      else if (left > 0) expires = "in " + fmtSeconds(left);
      else expires = fmtSeconds(left) + " ago";
      tr.append(
        name,
        cell(n.alive ? "alive" : "expired", n.alive ? "alive" : "expired-label"),
        cell(n.addr),
        cell(load),
        cell(expires),
        cell(n.generation)
      );
      return tr;
    });
    byId("fleet-body").replaceChildren(...rows);
  }

  // --- polling -------------------------------------------------------------------------------

  async function refresh() {
    const [state, fleet, metrics] = await Promise.allSettled([
      fetchOk("/state").then((r) => r.json()),
      fetchOk("/fleet").then((r) => r.json()),
      fetchOk("/metrics").then((r) => r.text()),
    ]);
    const errors = [];
    if (state.status === "fulfilled") drawState(state.value);
    else errors.push(state.reason.message);
    if (fleet.status === "fulfilled") drawFleet(fleet.value);
    else errors.push(fleet.reason.message);
    if (metrics.status === "fulfilled") drawMetrics(summarize(parseMetrics(metrics.value)));
    else errors.push(metrics.reason.message);
    const status = byId("status");
    status.className = errors.length ? "error" : "";
    status.textContent = errors.length
      ? "refresh failed: " + errors.join("; ")
      : "updated " + new Date().toLocaleTimeString();
  }

  function loop() {
    refresh()
      .catch((err) => {
        const status = byId("status");
        status.className = "error";
        status.textContent = "refresh failed: " + err;
      })
      .finally(() => setTimeout(loop, INTERVAL_MS));
  }

  loop();
})();

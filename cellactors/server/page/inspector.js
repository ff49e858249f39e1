// The inspector on the fleet page: charts of the last minutes (from /history) and the cell
// view (from /inspect/cells/...). Like page.js, everything from the server is inserted as
// text or as attribute values, never parsed as markup. Charts are plain SVG drawn here.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const HISTORY_MS = 5000;
  const TOKEN_KEY = "cellactors-inspector-token";
  const W = 320;
  const H = 70;
  const PAD = 4;
  // Each chart: its element id, title, unit and series (point field, label, css class).
  const CHARTS = [
    { id: "chart-calls", unit: "/s", series: [["calls_per_s", "calls", "s0"], ["errors_per_s", "errors", "s3"]] },
    {
      id: "chart-latency",
      unit: " ms",
      series: [["call_p50_ms", "p50", "s0"], ["call_p95_ms", "p95", "s1"], ["call_p99_ms", "p99", "s2"]],
    },
    { id: "chart-bucket", unit: "/s", series: [["bucket_per_s", "requests", "s0"]] },
    {
      id: "chart-ack",
      unit: " ms",
      series: [["ack_p50_ms", "p50", "s0"], ["ack_p99_ms", "p99", "s2"]],
    },
  ];
  let scope = "node";

  function byId(id) {
    return document.getElementById(id);
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function fmt(value, unit) {
    if (value === null || value === undefined) return "–";
    const text = value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
    return text + unit;
  }

  // --- charts ------------------------------------------------------------------------------

  function drawChart(chart, points, stepS) {
    const box = byId(chart.id);
    const plot = box.querySelector("svg");
    const legend = box.querySelector(".legend");
    let max = 0;
    for (const p of points) {
      for (const [field] of chart.series) {
        if (p[field] !== null && p[field] > max) max = p[field];
      }
    }
    const top = max > 0 ? max * 1.1 : 1;
    const t1 = points.length ? points[points.length - 1].t_ms : 0;
    // From the first interval's start to the last's end: fills the width from the first
    // interval on, and covers the whole history (ten minutes) once it is full.
    const t0 = points.length ? points[0].t_ms - 1000 * points[0].seconds : t1;
    const span = Math.max(t1 - t0, 2000 * stepS);
    const x = (t) => PAD + ((W - 2 * PAD) * (span - (t1 - t))) / span;
    const y = (v) => H - PAD - ((H - 2 * PAD) * v) / top;
    const children = [svg("line", { x1: PAD, y1: H - PAD, x2: W - PAD, y2: H - PAD, class: "axis" })];
    legend.replaceChildren();
    for (const [field, label, cls] of chart.series) {
      let d = "";
      let pen = "M";
      let last = null;
      for (const p of points) {
        const v = p[field];
        if (v === null || v === undefined) {
          pen = "M"; // a gap: no call or acknowledgement in that interval
          continue;
        }
        d += pen + x(p.t_ms).toFixed(1) + " " + y(v).toFixed(1) + " ";
        pen = "L";
        last = p;
      }
      const path = svg("path", { d: d.trim(), class: "series " + cls });
      path.dataset.field = field;
      path.dataset.points = String(points.filter((p) => p[field] !== null && p[field] !== undefined).length);
      children.push(path);
      if (last) children.push(svg("circle", { cx: x(last.t_ms), cy: y(last[field]), r: 2, class: "dot " + cls }));
      const item = el("span", label + " " + fmt(last ? last[field] : null, chart.unit), "key " + cls);
      legend.append(item);
    }
    const scale = svg("text", { x: W - PAD, y: 10, class: "scale", "text-anchor": "end" });
    scale.textContent = "max " + fmt(max, chart.unit);
    children.push(scale);
    plot.replaceChildren(...children);
  }

  async function refreshCharts() {
    const status = byId("charts-status");
    try {
      const response = await fetch("/history" + (scope === "fleet" ? "?scope=fleet" : ""), { cache: "no-store" });
      if (!response.ok) throw new Error("/history answered HTTP " + response.status);
      const body = await response.json();
      for (const chart of CHARTS) drawChart(chart, body.points, body.step_s);
      let text = body.points.length + " intervals of " + body.step_s + " s";
      if (body.scope === "fleet") {
        text += " · nodes " + body.nodes.join(", ");
        if (body.missing.length) text += " · not reached: " + body.missing.join(", ");
      }
      status.textContent = body.points.length ? text : "the first interval ends within " + body.step_s + " s";
      status.className = "note";
    } catch (err) {
      status.textContent = "charts: " + err.message;
      status.className = "note error";
    }
  }

  function chartLoop() {
    refreshCharts().finally(() => setTimeout(chartLoop, HISTORY_MS));
  }

  // --- cell view ---------------------------------------------------------------------------

  const view = { cls: "", name: "", table: null, offset: 0, limit: 20 };

  function token() {
    return byId("inspect-token").value.trim();
  }

  async function inspectFetch(path) {
    const headers = {};
    if (token()) headers.Authorization = "Bearer " + token();
    const response = await fetch(path, { cache: "no-store", headers });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      // not JSON: the status says enough
    }
    if (!response.ok) {
      let message = path + " answered HTTP " + response.status;
      if (body && body.message) message += ": " + body.message;
      if (body && body.error === "remote_owner" && body.addr) message += " (open the page of " + body.node + ")";
      throw new Error(message);
    }
    return body;
  }

  function cellPath(suffix) {
    return "/inspect/cells/" + encodeURIComponent(view.cls) + "/" + encodeURIComponent(view.name) + suffix;
  }

  function table(headers, rows, id) {
    const t = el("table");
    if (id) t.id = id;
    const head = el("tr");
    for (const h of headers) head.append(el("th", h));
    const thead = el("thead");
    thead.append(head);
    const tbody = el("tbody");
    for (const row of rows) {
      const tr = el("tr");
      for (const value of row) tr.append(el("td", shown(value)));
      tbody.append(tr);
    }
    if (rows.length === 0) {
      const tr = el("tr");
      const td = el("td", "none", "note");
      td.colSpan = Math.max(1, headers.length);
      tr.append(td);
      tbody.append(tr);
    }
    t.append(thead, tbody);
    return t;
  }

  function shown(value) {
    if (value === null || value === undefined) return "NULL";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function when(ms) {
    return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "–";
  }

  function drawCell(body) {
    const out = byId("inspect-result");
    const parts = [el("h3", body.cell + " · txid " + body.txid)];
    const tabs = el("p", null, "tabs");
    for (const t of body.tables) {
      const b = el("button", t.name + " (" + t.rows + ")");
      b.type = "button";
      b.dataset.table = t.name;
      if (body.table && body.table.name === t.name) b.className = "current";
      b.addEventListener("click", () => {
        view.table = t.name;
        view.offset = 0;
        loadCell();
      });
      tabs.append(b);
    }
    parts.push(tabs);
    if (body.table) {
      const p = body.table;
      parts.push(table(p.columns, p.rows, "inspect-rows"));
      const nav = el("p", null, "pager");
      const prev = el("button", "← previous");
      prev.type = "button";
      prev.id = "inspect-prev";
      prev.disabled = p.offset === 0;
      prev.addEventListener("click", () => {
        view.offset = Math.max(0, p.offset - p.limit);
        loadCell();
      });
      const next = el("button", "next →");
      next.type = "button";
      next.id = "inspect-next";
      next.disabled = !p.more;
      next.addEventListener("click", () => {
        view.offset = p.offset + p.limit;
        loadCell();
      });
      const first = p.rows.length ? p.offset + 1 : p.offset;
      nav.append(prev, el("span", " rows " + first + "–" + (p.offset + p.rows.length) + " "), next);
      parts.push(nav);
    }
    parts.push(el("h4", "Alarm and schedules"));
    const timers = [];
    if (body.alarm) timers.push(["alarm", "", when(body.alarm.at_ms), body.alarm.failures]);
    for (const s of body.schedules) timers.push(["schedule", s.name, when(s.at_ms), s.failures]);
    parts.push(table(["kind", "name", "due", "failures"], timers));
    parts.push(el("h4", "Outbox (undelivered)"));
    parts.push(table(["id", "target", "method", "txid", "sent"], body.outbox.map((m) => [m.id, m.target, m.method, m.txid, when(m.at_ms)])));
    parts.push(el("h4", "Dead letters"));
    parts.push(
      table(
        ["id", "target", "method", "attempts", "given up", "error"],
        body.dead_letters.map((d) => [d.id, d.target, d.method, d.attempts, when(d.dead_ms), d.code])
      )
    );
    parts.push(el("h4", "Recent changes"));
    const changes = el("div");
    changes.id = "inspect-changes";
    changes.append(el("p", "loading…", "note"));
    parts.push(changes);
    out.replaceChildren(...parts);
    loadChanges(Math.max(0, body.txid - 10));
  }

  async function loadChanges(after) {
    const box = byId("inspect-changes");
    try {
      const body = await inspectFetch(cellPath("/changes?after=" + after));
      const rows = [];
      for (const c of body.changes.slice().reverse()) {
        const what = (c.changes || [])
          .map((r) => r.table + " " + JSON.stringify(r.key) + (r.deleted ? " deleted" : " = " + JSON.stringify(r.row)))
          .join("; ");
        rows.push([c.txid, c.time || when(c.ts), what || (c.schema_change ? "schema change (database image)" : "")]);
      }
      box.replaceChildren(table(["txid", "time", "rows"], rows));
    } catch (err) {
      box.replaceChildren(el("p", err.message, "error"));
    }
  }

  async function loadCell() {
    const status = byId("inspect-status");
    status.className = "note";
    status.textContent = "reading " + view.cls + "/" + view.name + "…";
    let query = "?offset=" + view.offset + "&limit=" + view.limit;
    if (view.table) query += "&table=" + encodeURIComponent(view.table);
    try {
      drawCell(await inspectFetch(cellPath(query)));
      status.textContent = "read " + new Date().toLocaleTimeString();
    } catch (err) {
      status.className = "note error";
      status.textContent = err.message;
      byId("inspect-result").replaceChildren();
    }
  }

  function start() {
    for (const radio of document.querySelectorAll('input[name="chart-scope"]')) {
      radio.addEventListener("change", () => {
        scope = radio.value;
        refreshCharts();
      });
    }
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) byId("inspect-token").value = saved;
    byId("inspect-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, token());
      view.cls = byId("inspect-class").value.trim();
      view.name = byId("inspect-name").value.trim();
      view.table = null;
      view.offset = 0;
      if (view.cls && view.name) loadCell();
    });
    // A click on a resident cell's row looks into that cell (its id is "Class:name").
    byId("cells-body").addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-cell]");
      if (!row) return;
      const id = row.dataset.cell;
      const colon = id.indexOf(":");
      if (colon < 0) return;
      byId("inspect-class").value = id.slice(0, colon);
      byId("inspect-name").value = id.slice(colon + 1);
      byId("inspect-form").requestSubmit();
      byId("inspect-title").scrollIntoView();
    });
    chartLoop();
  }

  start();
})();

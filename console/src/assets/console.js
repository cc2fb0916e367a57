// Riverbank console: the job list and a job page, drawn from /api/jobs[/ns/name], polled every
// second. No framework: strings of escaped HTML and SVG. Every chart line carries
// data-series/data-points, every stage box data-stage, so tests can read the page's DOM.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";

function esc(s) {
  return String(s == null ? "" : s).replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function bytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(b) || 0, i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return v.toFixed(i ? 1 : 0) + " " + u[i];
}

function count(n) {
  n = Number(n) || 0;
  if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n));
}

function duration(s) {
  if (s == null) return "–";
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60 ? (s % 60) + "s" : "");
  if (s < 86400) return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}

// An RFC 3339 instant as its UTC time of day ("end of time" and the like stay as they are).
function clock(t) {
  const d = t ? new Date(t) : null;
  return d && !isNaN(d) ? d.toISOString().slice(11, 19) + "Z" : t || "–";
}

function stateBadge(state) {
  return `<span class="state state-${esc(state)}">${esc(state || "Unknown")}</span>`;
}

// ---- the job list ----------------------------------------------------------------------

function renderList(jobs) {
  const now = Date.now() / 1000;
  const rows = jobs.map((j) => `<tr data-job="${esc(j.namespace)}/${esc(j.name)}">
    <td><a href="/jobs/${encodeURIComponent(j.namespace)}/${encodeURIComponent(j.name)}">${esc(j.name)}</a></td>
    <td>${esc(j.namespace)}</td><td>${stateBadge(j.state)}</td>
    <td class="num">${j.currentWorkers}/${j.targetWorkers}</td>
    <td class="num">${duration(j.backlogSeconds)}</td>
    <td class="num">${j.progress == null ? "–" : Math.round(j.progress * 100) + "%"}</td>
    <td class="num">${j.created == null ? "–" : duration(now - j.created)}</td>
    <td>${j.insights.map((c) => `<span class="badge">${esc(c)}</span>`).join("")}</td></tr>`);
  return `<h1>Jobs</h1><table id="jobs"><thead><tr><th>Name</th><th>Namespace</th><th>State</th>
    <th>Workers</th><th>Backlog</th><th>Progress</th><th>Age</th><th>Insights</th></tr></thead>
    <tbody>${rows.join("") || '<tr><td colspan="8" class="muted">No jobs.</td></tr>'}</tbody></table>`;
}

// ---- the stage graph ---------------------------------------------------------------------

const BOX_W = 300, GAP_X = 110, GAP_Y = 24, LINE = 15;

function renderGraph(graph, progress, rates, streaming) {
  const stages = graph.stages;
  if (!stages.length) return '<p class="muted">The plan is not known yet.</p>';
  const byId = new Map(stages.map((s) => [s.id, s]));
  const prog = new Map(((progress && progress.stages) || []).map((s) => [s.name, s]));
  const rate = new Map((rates || []).map((r) => [r.id, r]));
  // Columns by the longest path from a source.
  const depth = new Map();
  const depthOf = (id, seen) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const ins = graph.edges.filter((e) => e.to === id && byId.has(e.from));
    const d = ins.length ? 1 + Math.max(...ins.map((e) => depthOf(e.from, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  stages.forEach((s) => depthOf(s.id, new Set()));
  const height = (s) => LINE * (s.components.length + (streaming ? 6 : 5)) + 12;
  const cols = [];
  stages.forEach((s) => { const d = depth.get(s.id); (cols[d] = cols[d] || []).push(s); });
  const pos = new Map();
  let maxH = 0;
  cols.forEach((col, c) => {
    let y = 10;
    col.forEach((s) => { pos.set(s.id, { x: 10 + c * (BOX_W + GAP_X), y, h: height(s) }); y += height(s) + GAP_Y; });
    maxH = Math.max(maxH, y);
  });
  const width = 20 + cols.length * (BOX_W + GAP_X) - GAP_X;
  const edges = graph.edges.filter((e) => pos.has(e.from) && pos.has(e.to)).map((e) => {
    const a = pos.get(e.from), b = pos.get(e.to);
    const x1 = a.x + BOX_W, y1 = a.y + a.h / 2, x2 = b.x - 4, y2 = b.y + b.h / 2, mx = (x1 + x2) / 2;
    return `<g class="shuffle" data-from="${esc(e.from)}" data-to="${esc(e.to)}">
      <path class="edge" d="M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}"><title>${esc(e.collection)}: ${esc(e.shuffle)}</title></path>
      <text class="edge-label" x="${mx}" y="${(y1 + y2) / 2 - 4}" text-anchor="middle">${esc(e.shuffle.replace(/^shuffle\((.*)\)$/, "$1").replace("combine states ", "combine "))}</text></g>`;
  });
  const boxes = stages.map((s) => {
    const p = pos.get(s.id), sp = prog.get(s.id) || {}, r = rate.get(s.id) || {};
    const state = sp.state || "Waiting";
    const total = sp.itemsTotal || 0, done = sp.itemsDone || 0;
    const frac = total ? done / total : state === "Done" ? 1 : 0;
    let y = p.y + LINE + 2;
    const lines = [`<text class="title" x="${p.x + 8}" y="${y}">${esc(s.id)} ${esc(s.name)} · ${esc(s.kind)} · ${esc(state)}</text>`];
    s.components.forEach((c) => { y += LINE; lines.push(`<text class="component" x="${p.x + 14}" y="${y}">${esc(c)}</text>`); });
    y += LINE;
    lines.push(`<text class="counters" x="${p.x + 8}" y="${y}">in ${count(sp.elementsIn)} el · ${bytes(sp.bytesIn)}</text>`);
    y += LINE;
    lines.push(`<text class="counters" x="${p.x + 8}" y="${y}">out ${count(sp.elementsOut)} el · ${bytes(sp.bytesOut)}</text>`);
    y += LINE;
    lines.push(`<text class="throughput" x="${p.x + 8}" y="${y}">${count(r.elementsPerSec)} el/s · ${bytes(r.bytesPerSec)}/s</text>`);
    const st = streaming && progress && progress.streaming;
    if (st) {
      y += LINE;
      // The stage's own watermark (its sources'), the job's backlog.
      lines.push(`<text class="streaming" x="${p.x + 8}" y="${y}">watermark ${esc(clock(sp.watermark || st.watermark))} · lag ${duration(sp.watermark ? sp.watermarkLagSeconds : st.watermarkLagSeconds)} · backlog ${backlog(st)}</text>`);
    }
    y += 8;
    lines.push(`<rect class="bar" x="${p.x + 8}" y="${y}" width="${BOX_W - 16}" height="6"></rect>`);
    const items = st ? `checkpoint ${st.checkpoint + 1}: ${done}/${total} work items` : `${done}/${total} work items`;
    lines.push(`<rect class="done" x="${p.x + 8}" y="${y}" width="${(BOX_W - 16) * frac}" height="6"><title>${items}</title></rect>`);
    return `<g class="stage state-${esc(state)}" data-stage="${esc(s.id)}" data-state="${esc(state)}" data-progress="${frac.toFixed(3)}">
      <rect class="box" x="${p.x}" y="${p.y}" width="${BOX_W}" height="${p.h}" rx="6"></rect>${lines.join("")}</g>`;
  });
  return `<svg id="graph" xmlns="${SVG}" width="${width}" height="${maxH}" viewBox="0 0 ${width} ${maxH}">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#57606a"></path></marker></defs>
    ${edges.join("")}${boxes.join("")}</svg>`;
}

// ---- charts ------------------------------------------------------------------------------

const COLORS = ["#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e", "#1b7c83", "#6e7781"];
const CW = 460, CH = 180, PAD_L = 66, PAD_R = 10, PAD_T = 22, PAD_B = 34;

// series: [{name, points: [[t, v], ...]}]; markers: [{t, label}].
function chart(id, title, series, fmt, t0, t1, markers) {
  const all = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => v != null && isFinite(v));
  const vmax = Math.max(1e-9, ...all) * 1.1;
  const span = Math.max(1, t1 - t0);
  const x = (t) => PAD_L + ((t - t0) / span) * (CW - PAD_L - PAD_R);
  const y = (v) => CH - PAD_B - (v / vmax) * (CH - PAD_T - PAD_B);
  const lines = series.map((s, i) => {
    const pts = s.points.filter((p) => p[1] != null && isFinite(p[1]));
    const color = COLORS[i % COLORS.length];
    return `<polyline data-series="${esc(s.name)}" data-points="${pts.length}" stroke="${color}"
      points="${pts.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ")}"><title>${esc(s.name)}</title></polyline>`;
  });
  const legend = series.map((s, i) =>
    `<text x="${PAD_L + 50 + i * 90}" y="${CH - 10}" style="fill:${COLORS[i % COLORS.length]}">■ ${esc(s.name)}</text>`);
  const marks = (markers || []).filter((m) => m.t >= t0).map((m) =>
    `<line class="marker" data-reason="${esc(m.reason)}" x1="${x(m.t)}" x2="${x(m.t)}" y1="${PAD_T}" y2="${CH - PAD_B}"><title>${esc(m.label)}</title></line>`);
  return `<div class="panel"><svg class="chart" data-chart="${id}" xmlns="${SVG}" viewBox="0 0 ${CW} ${CH}" style="width:100%;height:auto">
    <text x="${PAD_L}" y="14" font-weight="600">${esc(title)}</text>
    <line class="axis" x1="${PAD_L}" x2="${CW - PAD_R}" y1="${CH - PAD_B}" y2="${CH - PAD_B}"></line>
    <line class="axis" x1="${PAD_L}" x2="${PAD_L}" y1="${PAD_T}" y2="${CH - PAD_B}"></line>
    <text x="${PAD_L - 4}" y="${PAD_T + 8}" text-anchor="end">${esc(fmt(vmax / 1.1))}</text>
    <text x="${PAD_L - 4}" y="${CH - PAD_B}" text-anchor="end">0</text>
    <text x="${CW - PAD_R}" y="${CH - PAD_B + 12}" text-anchor="end">now</text>
    <text x="${PAD_L}" y="${CH - PAD_B + 12}">−${duration(t1 - t0)}</text>
    ${lines.join("")}${marks.join("")}${legend.join("")}</svg></div>`;
}

function perWorker(history, field) {
  const names = [];
  history.forEach((h) => h.workerSamples.forEach((w) => { if (!names.includes(w.name)) names.push(w.name); }));
  return names.map((n) => ({
    name: n,
    points: history.flatMap((h) => h.workerSamples.filter((w) => w.name === n).map((w) => [h.t, w[field]])),
  }));
}

function renderCharts(d) {
  const h = d.history;
  // From the first sample kept (the job's start, or 15 minutes ago) to now.
  const t1 = d.now, t0 = h.length ? Math.min(h[0].t, t1 - 10) : t1 - 60;
  const markers = d.markers.map((m) => ({ t: m.t, reason: m.reason, label: `${m.decision} ${m.from} → ${m.to}: ${m.reason} — ${m.message}` }));
  return `<div class="charts">
    ${chart("workers", "Workers (current, target; autoscaling decisions)", [
      { name: "current", points: h.map((s) => [s.t, s.workers]) },
      { name: "target", points: h.map((s) => [s.t, s.targetWorkers]) }], count, t0, t1, markers)}
    ${chart("throughput", "Throughput (bytes/s)", [
      { name: "bytes/s", points: h.map((s) => [s.t, s.throughputBytes]) }], bytes, t0, t1)}
    ${chart("elements", "Throughput (elements/s)", [
      { name: "elements/s", points: h.map((s) => [s.t, s.throughputElements]) }], count, t0, t1)}
    ${chart("backlog", "Backlog (seconds)", [
      { name: "backlog", points: h.map((s) => [s.t, s.backlogSeconds]) }], duration, t0, t1)}
    ${d.streaming ? chart("freshness", "Data freshness (watermark lag, seconds)", [
      { name: "watermark lag", points: h.map((s) => [s.t, s.watermarkLagSeconds]) }], duration, t0, t1) +
      (h.some((s) => s.backlogBytes > 0) && !h.some((s) => s.backlogElements > 0)
        ? chart("backlog-bytes", "Backlog (bytes the sources have left)", [
          { name: "bytes", points: h.map((s) => [s.t, s.backlogBytes]) }], bytes, t0, t1)
        : chart("backlog-elements", "Backlog (elements not read)", [
          { name: "elements", points: h.map((s) => [s.t, s.backlogElements]) }], count, t0, t1)) : ""}
    ${chart("cpu", "CPU per worker (fraction of its cores)", perWorker(h, "cpu"), (v) => (v * 100).toFixed(0) + "%", t0, t1)}
    ${chart("memory", "Memory per worker (RSS)", perWorker(h, "rssBytes"), bytes, t0, t1)}
  </div>`;
}

// A stream's backlog: the elements its sources have not read (a YAML job's), else the bytes its
// sources say they have left (a Beam SDK job's splittable DoFns size their rests in bytes).
function backlog(st) {
  return st.backlogBytes > 0 && !(st.backlogElements > 0)
    ? bytes(st.backlogBytes)
    : `${count(st.backlogElements)} el`;
}

// ---- the job page ------------------------------------------------------------------------

function renderJob(d) {
  const s = d.summary, p = d.progress;
  const ev = d.evaluation;
  const rationale = ev
    ? `<div class="rationale" id="rationale"><b>${esc(ev.decision)}</b> ${ev.currentWorkers} → ${ev.targetWorkers} workers
       (${esc(ev.reason)}${ev.dryRun ? ", dry run" : ""}) at ${esc(ev.time)}<br>${esc(ev.message)}</div>`
    : '<p class="muted" id="rationale">No autoscaling evaluation yet.</p>';
  const insights = d.insights.length
    ? d.insights.map((i) => `<div class="insight" data-insight="${esc(i.code)}"><span class="badge">${esc(i.code)}</span>
        ${i.subject ? "<b>" + esc(i.subject) + "</b>: " : ""}${esc(i.message)}<div class="rec">${esc(i.recommendation)}</div></div>`).join("")
    : '<p class="muted">No insights.</p>';
  const events = d.events.slice().reverse().map((e) => `<tr><td>${new Date(e.time * 1000).toLocaleTimeString()}</td>
      <td>${esc(e.type)}</td><td>${esc(e.reason)}</td><td>${esc(e.message)}</td></tr>`).join("");
  // A stream never completes: what its user follows is the checkpoints, the watermark and
  // the backlog, not the current checkpoint's work items.
  const st = d.streaming && p && p.streaming;
  const facts = st
    ? `<span id="facts">checkpoint ${st.checkpoint} · watermark ${esc(clock(st.watermark))} ·
       lag ${duration(st.watermarkLagSeconds)} · backlog ${backlog(st)}</span>`
    : p
    ? `<span id="facts">${p.workItemsDone}/${p.workItemsTotal} work items · ${Math.round(p.fractionConsumed * 100)}% ·
       ${bytes(p.throughputBytesPerSec)}/s · backlog ${duration(p.backlogSeconds)}</span>`
    : "";
  return `<h1>${esc(s.name)} ${stateBadge(s.state)} <span class="badges">${d.insights.map((i) => `<span class="badge">${esc(i.code)}</span>`).join("")}</span></h1>
    <p><span class="muted">${esc(s.namespace)}</span> · ${s.currentWorkers}/${s.targetWorkers} workers · ${facts}</p>
    <p id="message">${esc(d.message)}</p>
    <h2>Autoscaling</h2>${rationale}
    <h2>Insights</h2><div id="insights">${insights}</div>
    <h2>Stages</h2><div class="panel">${renderGraph(d.graph, p, d.stageRates, d.streaming)}</div>
    <h2>Charts</h2>${renderCharts(d)}
    <h2>Events</h2><table id="events"><thead><tr><th>Time</th><th>Type</th><th>Reason</th><th>Message</th></tr></thead>
    <tbody>${events || '<tr><td colspan="4" class="muted">No events.</td></tr>'}</tbody></table>`;
}

// ---- polling -----------------------------------------------------------------------------

async function tick() {
  const app = document.getElementById("app");
  const live = document.getElementById("live");
  const m = location.pathname.match(/^\/jobs\/([^/]+)\/([^/]+)\/?$/);
  try {
    const url = m ? `/api/jobs/${m[1]}/${m[2]}` : "/api/jobs";
    const r = await fetch(url, { cache: "no-store" });
    if (r.status === 404) {
      app.innerHTML = '<p>No such job. <a href="/">All jobs</a></p>';
    } else {
      const data = await r.json();
      app.innerHTML = m ? renderJob(data) : renderList(data);
    }
    live.textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (e) {
    live.textContent = "disconnected (" + e + ")";
  }
  setTimeout(tick, POLL_MS);
}

tick();

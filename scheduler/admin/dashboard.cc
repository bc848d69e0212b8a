#include "scheduler/admin/dashboard.h"

namespace mlfabric::admin {

const std::string& DashboardHtml() {
  static const std::string* const kHtml = new std::string(R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>MLfabric scheduler</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
  :root { --bg:#f6f7f9; --card:#fff; --ink:#1d2330; --mute:#69707d; --line:#e2e5ea;
          --ok:#1a7f37; --bad:#c62828; --warn:#b26a00; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
         background:var(--bg); color:var(--ink); }
  header { display:flex; align-items:baseline; gap:16px; padding:12px 20px;
           background:#1d2330; color:#fff; }
  header h1 { font-size:18px; margin:0; }
  header .meta { color:#c5cad3; font-size:13px; }
  #conn { margin-left:auto; font-weight:600; }
  #conn.ok { color:#7ee787; } #conn.bad, b.bad { color:#ff7b72; }
  main { display:grid; grid-template-columns: repeat(12, 1fr); gap:14px; padding:14px 20px; }
  .card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; }
  .card h2 { font-size:13px; text-transform:uppercase; letter-spacing:.04em; color:var(--mute);
             margin:0 0 8px; }
  .w12 { grid-column: span 12; } .w8 { grid-column: span 8; } .w6 { grid-column: span 6; }
  .w4 { grid-column: span 4; }
  .tiles { display:flex; gap:10px; flex-wrap:wrap; }
  .tile { flex:1; min-width:110px; background:var(--bg); border-radius:6px; padding:8px 10px; }
  .tile .v { font-size:22px; font-weight:650; }
  .tile .k { font-size:12px; color:var(--mute); }
  table { width:100%; border-collapse:collapse; font-variant-numeric: tabular-nums; }
  th, td { text-align:left; padding:4px 6px; border-bottom:1px solid var(--line); }
  th { color:var(--mute); font-weight:600; font-size:12px; }
  td.n { text-align:right; }
  .pill { display:inline-block; padding:0 6px; border-radius:9px; font-size:12px; }
  .pill.up { background:#dafbe1; color:var(--ok); } .pill.down { background:#ffebe9; color:var(--bad); }
  .pill.drain { background:#fff1d6; color:var(--warn); }
  canvas { width:100%; display:block; }
  .legend { font-size:12px; color:var(--mute); margin-top:4px; }
  .legend span { display:inline-block; margin-right:10px; }
  .legend i { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:4px;
              vertical-align:-1px; }
  .empty { color:var(--mute); font-style:italic; }
</style>
</head>
<body>
<header>
  <h1>MLfabric scheduler</h1>
  <span class="meta" id="meta">connecting&hellip;</span>
  <span id="conn" class="bad">&#9679; offline</span>
</header>
<main>
  <section class="card w12"><div class="tiles" id="tiles"></div></section>
  <section class="card w6"><h2>Hosts &amp; measured bandwidth</h2><div id="hosts"></div></section>
  <section class="card w6"><h2>Jobs &amp; model versions</h2><div id="jobs"></div></section>
  <section class="card w8"><h2>Link utilisation (reserved / reported), up to 60 s</h2>
    <canvas id="util" height="220"></canvas><div class="legend" id="util-legend"></div></section>
  <section class="card w4"><h2>Drops by reason</h2><canvas id="drops" height="220"></canvas></section>
  <section class="card w8"><h2>Scheduled transfers per link (Gantt)</h2>
    <canvas id="gantt" height="260"></canvas><div class="legend" id="gantt-legend"></div></section>
  <section class="card w4"><h2>Update delay histogram (applied)</h2>
    <canvas id="delays" height="260"></canvas></section>
  <section class="card w12"><h2>Recent batches</h2><div id="batches"></div></section>
</main>
<script>
"use strict";
const COLORS = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2",
                "#17becf","#bcbd22","#7f7f7f"];
const state = { ok: false, updated: 0 };

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",
    '"':"&quot;","'":"&#39;"}[c]));
}
function bps(v) {
  if (v == null) return "–";
  const units = [[1e9,"Gbit/s"],[1e6,"Mbit/s"],[1e3,"kbit/s"]];
  for (const [f,u] of units) if (Math.abs(v) >= f) return (v/f).toFixed(v/f >= 100 ? 0 : 2) + " " + u;
  return v.toFixed(0) + " bit/s";
}
function num(v) { return v == null ? "–" : Number(v).toLocaleString("en-US"); }
function colorFor(key, map) {
  if (!(key in map)) map[key] = COLORS[Object.keys(map).length % COLORS.length];
  return map[key];
}
// With admin_read_auth the API needs the bearer token: open the dashboard
// as /dashboard#token=<admin_token> (a fragment never leaves the browser).
const TOKEN = new URLSearchParams(location.hash.slice(1)).get("token");
async function getJson(path) {
  const headers = TOKEN ? {"Authorization": "Bearer " + TOKEN} : {};
  const r = await fetch(path, {cache: "no-store", headers});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
function canvasCtx(id) {
  const c = document.getElementById(id);
  const ratio = window.devicePixelRatio || 1;
  const w = c.clientWidth, h = c.height / (c.dataset.ratio || 1);
  c.dataset.ratio = ratio;
  c.width = w * ratio; c.height = h * ratio; c.style.height = h + "px";
  const ctx = c.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.font = "12px system-ui, sans-serif";
  ctx.clearRect(0, 0, w, h);
  return {ctx, w, h};
}
function emptyMsg(ctx, w, h, text) {
  ctx.fillStyle = "#69707d"; ctx.textAlign = "center";
  ctx.fillText(text, w / 2, h / 2); ctx.textAlign = "left";
}

function renderTiles(cluster) {
  const s = cluster.stats;
  const tiles = [["hosts alive", cluster.hosts_alive + " / " + cluster.hosts], ["jobs", cluster.jobs],
    ["in flight", cluster.in_flight], ["planned", num(s.planned)], ["applied", num(s.applied)],
    ["dropped", num(s.dropped)], ["failed", num(s.failed)], ["timed out", num(s.timed_out)],
    ["batch cycles", num(s.batches)],
    ["plan ms (max)", s.plan_ms_max.toFixed(2)], ["bw reports", num(s.bandwidth_reports)]];
  document.getElementById("tiles").innerHTML = tiles.map(([k, v]) =>
    `<div class="tile"><div class="v">${esc(v)}</div><div class="k">${esc(k)}</div></div>`).join("");
  document.getElementById("meta").textContent =
    `planner ${cluster.planner} · batch ${cluster.batch_interval_ms} ms · ` +
    `${cluster.planner_threads} planning threads · up ${cluster.uptime_s.toFixed(0)} s`;
}

function renderHosts(hosts) {
  if (!hosts.hosts.length) {
    document.getElementById("hosts").innerHTML = '<p class="empty">no hosts registered</p>';
    return;
  }
  const rows = hosts.hosts.map(h => {
    const st = !h.alive ? '<span class="pill down">down</span>'
      : h.draining ? '<span class="pill drain">draining</span>' : '<span class="pill up">up</span>';
    const age = h.report_age_s == null ? "never" : h.report_age_s.toFixed(1) + " s ago";
    return `<tr><td><b>${esc(h.name)}</b></td><td>${st}</td>
      <td class="n">${bps(h.reported_up_bps)}</td><td class="n">${bps(h.available_up_bps)}</td>
      <td class="n">${bps(h.reported_down_bps)}</td><td class="n">${bps(h.available_down_bps)}</td>
      <td class="n">${esc(age)}</td></tr>`;
  }).join("");
  document.getElementById("hosts").innerHTML = `<table><tr><th>host</th><th>state</th>
    <th class="n">up measured</th><th class="n">up free</th><th class="n">down measured</th>
    <th class="n">down free</th><th class="n">last report</th></tr>${rows}</table>`;
}

function renderJobs(jobs) {
  if (!jobs.jobs.length) {
    document.getElementById("jobs").innerHTML = '<p class="empty">no jobs</p>'; return;
  }
  const rows = jobs.jobs.map(j => {
    const servers = j.servers.length ? j.servers.map(s =>
      `${esc(s.name)}@${esc(s.host)}: <b>v${num(s.model_version)}</b>` +
      (s.pending ? ` (${s.pending} pending)` : "")).join("<br>") : '<span class="empty">no server yet</span>';
    const mode = j.mode === "ssp" ? `ssp K=${j.staleness_k}` : j.mode;
    const workers = (j.workers || []).map(w =>
      `${w.straggler ? '<b class="bad">straggler</b> ' : ""}${esc(w.name)}: ${num(w.iterations)} it, ` +
      `${(1000 * w.iteration_s).toFixed(0)} ms/it` +
      (w.slowdown ? ` (${w.slowdown.toFixed(1)}&times; median)` : "")).join("<br>");
    const members = j.generation ? `<br>${num(j.members)} members, generation ${num(j.generation)}` : "";
    return `<tr><td><b>${esc(j.name)}</b></td><td>${esc(mode)}${members}</td><td class="n">${j.tau_max}</td>
      <td class="n">${j.priority_class}</td><td>${servers}</td><td>${workers}</td>
      <td class="n">${num(j.applied)}</td><td class="n">${num(j.dropped)}</td><td class="n">${num(j.failed)}</td></tr>`;
  }).join("");
  document.getElementById("jobs").innerHTML = `<table><tr><th>job</th><th>mode</th>
    <th class="n">&tau;<sub>max</sub></th><th class="n">prio</th><th>model version</th>
    <th>workers</th><th class="n">applied</th><th class="n">dropped</th><th class="n">failed</th></tr>${rows}</table>`;
}

function renderUtil(links, now) {
  const {ctx, w, h} = canvasCtx("util");
  const pad = {l: 40, r: 8, t: 8, b: 20};
  const series = {};
  for (const s of links.samples) {
    for (const l of s.links) {
      for (const [dir, res, rep] of [["up", l.up_reserved_bps, l.up_reported_bps],
                                     ["down", l.down_reserved_bps, l.down_reported_bps]]) {
        const key = l.host + (dir === "up" ? " ↑" : " ↓");
        (series[key] = series[key] || []).push([s.at_s, rep > 0 ? Math.min(1.5, res / rep) : 0]);
      }
    }
  }
  // Up to the last 60 s, but no wider than the history there is (>= 10 s).
  const first = links.samples.length ? links.samples[0].at_s : now;
  const span = Math.min(60, Math.max(10, now - first));
  const x0 = now - span, x = t => pad.l + (t - x0) / span * (w - pad.l - pad.r);
  const y = v => pad.t + (1 - Math.min(v, 1.2) / 1.2) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#e2e5ea"; ctx.fillStyle = "#69707d";
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    ctx.beginPath(); ctx.moveTo(pad.l, y(v)); ctx.lineTo(w - pad.r, y(v)); ctx.stroke();
    ctx.fillText((v * 100).toFixed(0) + "%", 4, y(v) + 4);
  }
  for (let k = 4; k >= 0; k--) {
    const dt = span * k / 4;
    ctx.textAlign = k === 0 ? "right" : k === 4 ? "left" : "center";
    ctx.fillText(k === 0 ? "now" : "-" + dt.toFixed(0) + " s", x(now - dt), h - 4);
  }
  ctx.textAlign = "left";
  const keys = Object.keys(series).sort();
  if (!keys.length) emptyMsg(ctx, w, h, "no link samples yet");
  const legend = [];
  keys.forEach((k, i) => {
    const c = COLORS[i % COLORS.length];
    ctx.strokeStyle = c; ctx.lineWidth = 1.5; ctx.beginPath();
    series[k].filter(p => p[0] >= x0).forEach((p, j) => j ? ctx.lineTo(x(p[0]), y(p[1])) : ctx.moveTo(x(p[0]), y(p[1])));
    ctx.stroke(); ctx.lineWidth = 1;
    legend.push(`<span><i style="background:${c}"></i>${esc(k)}</span>`);
  });
  document.getElementById("util-legend").innerHTML = legend.join("");
}

const jobColors = {};
function renderGantt(transfers, now) {
  const {ctx, w, h} = canvasCtx("gantt");
  const all = transfers.recent;
  const rows = [...new Set(all.flatMap(t => [t.src + " ↑", t.dst + " ↓"]))].sort();
  if (!all.length) { emptyMsg(ctx, w, h, "no transfers scheduled yet"); return; }
  let t0 = Math.min(...all.map(t => t.start_s)), t1 = Math.max(now, ...all.map(t => t.end_s));
  t0 = Math.max(t0, t1 - 30);
  const pad = {l: 70, r: 8, t: 6, b: 20};
  const rowH = Math.max(8, Math.min(28, (h - pad.t - pad.b) / rows.length));
  const x = t => pad.l + (t - t0) / Math.max(1e-6, t1 - t0) * (w - pad.l - pad.r);
  ctx.fillStyle = "#69707d";
  rows.forEach((r, i) => ctx.fillText(r, 4, pad.t + i * rowH + rowH / 2 + 4));
  for (let k = 0; k <= 4; k++) {
    const t = t0 + (t1 - t0) * k / 4;
    ctx.fillText((t - now).toFixed(1) + " s", x(t) - 14, h - 4);
  }
  for (const t of all) {
    if (t.end_s < t0) continue;
    ctx.fillStyle = colorFor(t.job, jobColors);
    for (const r of [t.src + " ↑", t.dst + " ↓"]) {
      const i = rows.indexOf(r);
      const xa = x(Math.max(t0, t.start_s)), xb = Math.max(xa + 1.5, x(t.end_s));
      ctx.fillRect(xa, pad.t + i * rowH + 2, xb - xa, rowH - 4);
    }
  }
  ctx.strokeStyle = "#c62828"; ctx.beginPath(); ctx.moveTo(x(now), pad.t); ctx.lineTo(x(now), h - pad.b); ctx.stroke();
  document.getElementById("gantt-legend").innerHTML = Object.entries(jobColors).map(([j, c]) =>
    `<span><i style="background:${c}"></i>job ${esc(j)}</span>`).join("") +
    '<span><i style="background:#c62828"></i>now</span>';
}

function bars(id, labels, values, color, emptyText) {
  const {ctx, w, h} = canvasCtx(id);
  if (!values.length || values.every(v => v === 0)) { emptyMsg(ctx, w, h, emptyText); return; }
  const pad = {l: 36, r: 6, t: 14, b: 34};
  const max = Math.max(...values, 1);
  const bw = (w - pad.l - pad.r) / values.length;
  ctx.fillStyle = "#69707d";
  ctx.fillText(String(max), 4, pad.t + 4); ctx.fillText("0", 4, h - pad.b);
  values.forEach((v, i) => {
    const bh = (h - pad.t - pad.b) * v / max;
    ctx.fillStyle = Array.isArray(color) ? color[i % color.length] : color;
    ctx.fillRect(pad.l + i * bw + 2, h - pad.b - bh, bw - 4, bh);
    ctx.fillStyle = "#1d2330";
    if (v) ctx.fillText(String(v), pad.l + i * bw + 4, h - pad.b - bh - 3);
    ctx.save(); ctx.translate(pad.l + i * bw + bw / 2, h - pad.b + 12); ctx.fillStyle = "#69707d";
    ctx.textAlign = "center"; ctx.fillText(labels[i], 0, 0); ctx.restore();
  });
}

function renderDelays(delays) {
  const hgm = delays.histogram;
  const labels = hgm.bounds.map((b, i) => i === 0 ? "0" : (hgm.bounds[i - 1] + 1 === b ? String(b) : `≤${b}`));
  labels.push(">" + hgm.bounds[hgm.bounds.length - 1]);
  bars("delays", labels, hgm.counts, "#1f77b4", "no applied updates yet");
}

function renderDrops(drops) {
  const entries = Object.entries(drops.by_reason).sort((a, b) => b[1] - a[1]);
  bars("drops", entries.map(e => e[0]), entries.map(e => e[1]),
       ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"], "no drops");
}

function renderBatches(batches) {
  const list = batches.recent.slice(-8).reverse();
  if (!list.length) {
    document.getElementById("batches").innerHTML = '<p class="empty">no batches yet</p>'; return;
  }
  document.getElementById("batches").innerHTML = `<table><tr><th>batch</th><th>job</th><th>server</th>
    <th class="n">planned at</th><th class="n">updates</th><th class="n">scheduled</th>
    <th class="n">dropped</th><th class="n">compute ms</th><th class="n">thread</th></tr>` +
    list.map(b => `<tr><td>#${b.id}</td><td>${esc(b.job)}</td><td>${esc(b.server)}@${esc(b.server_host)}</td>
      <td class="n">${b.planned_at_s.toFixed(2)} s</td><td class="n">${b.updates}</td>
      <td class="n">${b.scheduled}</td><td class="n">${b.dropped}</td>
      <td class="n">${b.compute_ms.toFixed(3)}</td><td class="n">${b.planning_thread}</td></tr>`).join("") +
    "</table>";
}

async function refresh() {
  try {
    const [cluster, hosts, jobs, links, transfers, delays, drops, batches] = await Promise.all(
      ["cluster", "hosts", "jobs", "links", "transfers", "delays", "drops", "batches?limit=8"]
        .map(p => getJson("/api/v1/" + p)));
    renderTiles(cluster); renderHosts(hosts); renderJobs(jobs);
    renderUtil(links, cluster.now_s); renderGantt(transfers, cluster.now_s);
    renderDelays(delays); renderDrops(drops); renderBatches(batches);
    state.ok = true; state.updated++;
    document.body.dataset.updates = state.updated;
    const conn = document.getElementById("conn");
    conn.className = "ok"; conn.textContent = "● live";
  } catch (e) {
    state.ok = false;
    const conn = document.getElementById("conn");
    conn.className = "bad"; conn.textContent = "● offline (" + e.message + ")";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML");
  return *kHtml;
}

}  // namespace mlfabric::admin

package main

import "html/template"

// page is the dashboard as one self-contained HTML page (uPlot inlined): a 24-column grid as
// Grafana's, each panel at its gridPos, a dark theme close to Grafana's default, and a footer that
// says what drew it.
var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>{{.UPlotCSS}}</style>
<style>
  :root { --unit: 30px; --gap: 6px; }
  body { margin: 0; background: #111217; color: #ccccdc; font: 13px "DejaVu Sans", sans-serif; }
  header { padding: 10px 14px; display: flex; justify-content: space-between; align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; color: #fff; font-weight: 500; }
  header span { color: #8e8e9e; }
  #grid { position: relative; margin: 0 8px; height: calc({{.Rows}} * var(--unit)); }
  .panel { position: absolute; box-sizing: border-box; background: #181b1f; border: 1px solid #2c3235;
           border-radius: 3px; padding: 6px 8px; overflow: hidden; }
  .panel h2 { font-size: 13px; margin: 0 0 4px; color: #d8d9da; font-weight: 500; white-space: nowrap; }
  .row { position: absolute; box-sizing: border-box; padding: 6px 2px; font-size: 15px; color: #fff; font-weight: 500; }
  .stat { font-size: 40px; color: #73bf69; text-align: center; margin-top: 4px; font-weight: 500; }
  .stat.zero { color: #8e8e9e; }
  .nodata { color: #8e8e9e; text-align: center; margin-top: 40px; }
  .err { color: #f2495c; font-size: 11px; }
  .legend { font-size: 11px; color: #ccccdc; line-height: 16px; }
  .legend span { margin-right: 12px; white-space: nowrap; display: inline-block; }
  .legend i { display: inline-block; width: 10px; height: 3px; margin: 0 4px 3px 0; vertical-align: middle; }
  footer { color: #8e8e9e; padding: 8px 14px 14px; font-size: 12px; }
</style></head>
<body>
<header><h1>{{.Title}}</h1><span>{{.From}} to {{.To}}</span></header>
<div id="grid"></div>
<footer>Drawn by hack/dashboard-render from {{.Source}} (each panel's PromQL against Prometheus {{.Prometheus}}'s recorded data, plotted with uPlot), not by Grafana.</footer>
<script>{{.UPlot}}</script>
<script>
const panels = {{.Data}};
const grid = document.getElementById("grid");
const unit = 30, gap = 6, width = grid.clientWidth;
const plots = [];
const palette = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a", "#96d98d", "#ffb357", "#ca95e5", "#c0d8ff"];
function box(p, cls) {
  const el = document.createElement("div");
  el.className = cls;
  el.style.left = (p.X / 24 * width + gap / 2) + "px";
  el.style.top = (p.Y * unit + gap / 2) + "px";
  el.style.width = (p.W / 24 * width - gap) + "px";
  el.style.height = (p.H * unit - gap) + "px";
  grid.appendChild(el);
  return el;
}
function fmt(v, unitName) {
  if (v == null) return "";
  if (unitName === "percentunit") return (v * 100).toFixed(1) + "%";
  if (unitName === "s") {
    const a = Math.abs(v);
    return a === 0 ? "0" : a < 0.001 ? +(v * 1e6).toPrecision(3) + " µs" : a < 1 ? +(v * 1e3).toPrecision(3) + " ms" : +v.toPrecision(3) + " s";
  }
  return Math.abs(v) >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toPrecision(3);
}
for (const p of panels) {
  if (p.Type === "row") { box(p, "row").textContent = p.Title; continue; }
  const el = box(p, "panel");
  const h = document.createElement("h2"); h.textContent = p.Title; el.appendChild(h);
  if (p.Err) { const e = document.createElement("div"); e.className = "err"; e.textContent = p.Err; el.appendChild(e); continue; }
  if (p.Type === "stat") {
    const s = document.createElement("div");
    s.className = "stat" + (p.Stat === "0" || p.Stat === "no data" ? " zero" : "");
    s.textContent = p.Stat; el.appendChild(s); continue;
  }
  if (!p.Series || p.Series.length === 0) {
    const n = document.createElement("div"); n.className = "nodata"; n.textContent = "No data"; el.appendChild(n); continue;
  }
  const data = [p.Times].concat(p.Series.map(s => s.values));
  const w = p.W / 24 * width - gap - 18, hAll = p.H * unit - gap - 34;
  const opts = {
    width: w, height: hAll,
    legend: { show: false },
    cursor: { show: false },
    scales: { x: { time: true } },
    series: [{}].concat(p.Series.map((s, i) => ({ label: s.label, stroke: palette[i % palette.length], width: 1.5, spanGaps: false, points: { show: false }, value: (u, v) => fmt(v, p.Unit) }))),
    axes: [
      // Time of day, UTC, as the header's range.
      { stroke: "#8e8e9e", grid: { stroke: "#2c3235", width: 1 }, ticks: { stroke: "#2c3235" }, font: "11px DejaVu Sans", space: 70,
        values: (u, vals) => vals.map(v => new Date(v * 1000).toISOString().slice(11, 19)) },
      { stroke: "#8e8e9e", grid: { stroke: "#2c3235", width: 1 }, ticks: { stroke: "#2c3235" }, font: "11px DejaVu Sans", size: 64,
        values: (u, vals) => vals.map(v => fmt(v, p.Unit)) },
    ],
  };
  const u = new uPlot(opts, data, el);
  const legend = document.createElement("div");
  legend.className = "legend";
  p.Series.forEach((s, i) => {
    const item = document.createElement("span");
    const sw = document.createElement("i");
    sw.style.background = palette[i % palette.length];
    item.appendChild(sw);
    item.appendChild(document.createTextNode(s.label));
    legend.appendChild(item);
  });
  el.appendChild(legend);
  plots.push({ u, el, h, w, legend });
}
// The legend (our own, below the plot) takes what it needs; the plot gets the rest of the panel.
for (const { u, el, h, w, legend } of plots) {
  u.setSize({ width: w, height: Math.max(60, el.clientHeight - 12 - h.offsetHeight - 4 - legend.offsetHeight) });
  el.appendChild(legend);
}
document.body.setAttribute("data-drawn", "yes");
</script>
</body></html>
`))

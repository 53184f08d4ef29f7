// The comparison page: runs side by side (/compare?runs=a,b,c), as `client.py compare`
// prints and draws them: a table per setting, and each run's curves overlaid, the runs of
// one setting (its seeds) in one colour.
"use strict";

const runIds = new URLSearchParams(location.search).get("runs") || "";
const charts = {};  // title -> {plot, names}
// [title, x key, y key]: the same four views as compare.png
const CURVES = [
  ["Validation error against rounds", "round", "validation_error"],
  ["Training loss against rounds", "round", "train_loss"],
  ["Validation error against wall time (s)", "seconds", "validation_error"],
  ["Validation error against MiB sent and received", "mib", "validation_error"],
];

function meanSpread(row, figure, digits) {
  if (row[figure] === null || row[figure] === undefined) return "–";
  const text = row[figure].toFixed(digits);
  return row.runs.length > 1 ? text + " ± " + row[figure + "_std"].toFixed(digits) : text;
}

function renderTable(settings) {
  const ordered = [...settings].sort((a, b) =>
      (a.final === null) - (b.final === null) || (a.final ?? 0) - (b.final ?? 0));
  fillTable(document.querySelector("#settings tbody"), ordered.map(row => ({key: row.setting, cells: [
    [row.setting], [row.runs.length, "num"], [meanSpread(row, "final", 4), "num"],
    [row.best === null ? "–" : meanSpread(row, "best", 4) + " (" + row.best_round.toFixed(0) + ")", "num"],
    [meanSpread(row, "train_loss", 4), "num"], [meanSpread(row, "seconds", 1), "num"],
    [meanSpread(row, "mib", 2), "num"],
  ]})), row => row.key);
}

// Runs measure at different x values: one x axis of them all, null where a run has none.
function joined(runs, xKey, yKey) {
  const xs = [...new Set(runs.flatMap(run => (run[xKey] || []).filter(x => x !== null)))]
      .sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = runs.map(run => {
    const column = new Array(xs.length).fill(null);
    (run[xKey] || []).forEach((x, i) => { if (x !== null) column[index.get(x)] = run[yKey][i]; });
    return column;
  });
  return [xs, ...ys];
}

function drawCurves(title, xKey, yKey, runs, colorOf) {
  const shown = runs.filter(run => run[xKey] && run[yKey].some(v => v !== null));
  const data = joined(shown, xKey, yKey);
  placeChart(charts, title, shown.map(run => run.run_id), data, box => shown.length ?
      new uPlot(curveOptions(box, xKey, shown, colorOf), data, box) : null);
}

function curveOptions(box, xKey, shown, colorOf) {
  return {
    width: Math.max(360, box.clientWidth - 12), height: 220,
    scales: {x: {time: false}},
    axes: [{label: xKey === "round" ? "round" : xKey === "mib" ? "MiB" : "seconds"},
           {size: 72, values: (u, vals) => vals.map(v => fmtNumber(v, 3))}],
    series: [{label: xKey}, ...shown.map(run => ({
      label: run.label + (run.seed === null ? "" : " seed " + run.seed) + " (" + run.run_id + ")",
      stroke: colorOf(run.label), width: 2, spanGaps: true, points: {show: run.round.length < 60}}))],
  };
}

function render(view) {
  document.getElementById("problem").hidden = true;
  renderTable(view.settings);
  const labels = view.settings.map(row => row.setting);
  const colorOf = label => COLORS[labels.indexOf(label) % COLORS.length];
  for (const [title, xKey, yKey] of CURVES) drawCurves(title, xKey, yKey, view.runs, colorOf);
}

function showProblem(text) {
  const problem = document.getElementById("problem");
  problem.textContent = text;
  problem.hidden = false;
}

poll("/api/compare?runs=" + encodeURIComponent(runIds), render, showProblem);
